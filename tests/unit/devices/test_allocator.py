"""The allocator on hand-built nodes, and whole-cluster feasibility == per-node allocation."""

# Equivalent mutants (make mutation MODULE=scheduler/devices/allocator.py):
# mutmut-equivalent: scheduler.devices.allocator.x_feasible_rows__mutmut_18
#   `slice(0, n)` -> `slice(None, n)`: the same rows.
# mutmut-equivalent: scheduler.devices.allocator.x_feasible_rows__mutmut_20
#   `slice(0, n)` -> `slice(n)`: the same rows.
# mutmut-equivalent: scheduler.devices.allocator.x__pcies__mutmut_3
#   `view.cards.get(t, ())` -> `.get(t, None)`: every use allocate hands out is a card it took
#   from `view.cards[t]`, so the default is never read.
# mutmut-equivalent: scheduler.devices.allocator.x__pcies__mutmut_5
#   `view.cards.get(t, ())` -> `.get(t)`: as _pcies__mutmut_3.
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_24
#   `card_meta(...) if exists[col] else None` -> always `card_meta(...)`: a column exists
#   exactly where its CardMeta is set (table.lay_out), card_meta is None elsewhere.
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_39
#   `hint = request.hints.get(gpu)` -> `None` (scope ""): plain_gpu_request only lets through
#   a scope of "" or Node, whose level (0 or 1) no scope of the tree is below.
# mutmut-equivalent: scheduler.devices.allocator.x_rows_feasible__mutmut_3
#   `len(rows) <= FEW_ROWS` -> `<`: four rows go by numpy instead of row by row; the two
#   answer alike (rowfit's invariant, held by test_rowfit.py).
# mutmut-equivalent: scheduler.devices.allocator.x_rows_feasible__mutmut_30
#   `count <= 1` -> `count < 1`: for count 1, `sum(ok) >= 1` is `any(ok)`.
# mutmut-equivalent: scheduler.devices.allocator.x__round_robin__mutmut_26
#   `max(..., default=0)` -> `default=1`: with no card on a preferred switch the one extra
#   round takes nothing (no group to take from).
# mutmut-equivalent: scheduler.devices.allocator.x__use__mutmut_6
#   `zip(names, amounts, strict=True)` -> `strict=None`: card_amounts' amounts are aligned with
#   RESOURCES_BY_TYPE (one per resource name), so the lengths always match.
# mutmut-equivalent: scheduler.devices.allocator.x__use__mutmut_9
#   `strict=True` dropped: as _use__mutmut_6.
# mutmut-equivalent: scheduler.devices.allocator.x__use__mutmut_10
#   `strict=True` -> `strict=False`: as _use__mutmut_6.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_1
#   `minimum: int = 0` -> `1`: `count = max(count, minimum)` runs after the count-0 return,
#   where count is already at least 1.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_2
#   `most: int = 0` -> `1`: `most = max(most, count)` with count at least 1.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_6
#   `view.cards.get(t, ())` -> `.get(t, None)`: allocate answers "Insufficient <type>
#   devices" before _allocate_type for a type without cards in the view, so the default is
#   never read.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_8
#   `.get(t, ())` -> `.get(t)`: as _allocate_type__mutmut_6.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_57
#   all_cards' `.get(t, ())` -> `.get(t, None)`: as _allocate_type__mutmut_6.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_59
#   all_cards' `.get(t, ())` -> `.get(t)`: as _allocate_type__mutmut_6.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_99
#   gpushare's key `(False, free memory, minor)` -> `(True, ...)`: a constant first element,
#   the same order.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_153
#   the scope tree's "no choice" Status always ERR_TOPOLOGY_SCOPED: unscoped, the tree always
#   answers once there are `count` candidates (checked just before: its node scope holds
#   every card), so only a scoped request reaches that return.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_154
#   `insufficient(t)` -> `insufficient(None)` in that return: unreachable, as
#   _allocate_type__mutmut_153.
# mutmut-equivalent: scheduler.devices.allocator.x__allocate_type__mutmut_161
#   the scoped order `(False, *rank)` -> `(True, *rank)`: a constant first element.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate__mutmut_4
#   `view.cards.get(type, ())` -> `.get(type, None)`: node_view lists every type it is asked
#   for (an empty tuple where the node has none), so the default is never read.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate__mutmut_6
#   `.get(type, ())` -> `.get(type)`: as allocate__mutmut_4.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate__mutmut_16
#   has_vfs' `.get(t, ())` -> `.get(t, None)`: the loop before returned unless the type has
#   cards in the view.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate__mutmut_18
#   `.get(t, ())` -> `.get(t)`: as allocate__mutmut_16.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate__mutmut_51
#   a secondary's minimum without SamePCIe 0 -> 1: `max(count, minimum)` with count at least 1
#   (joint types are never ApplyForAll).
# mutmut-equivalent: scheduler.devices.allocator.x_gpu_amounts__mutmut_4
#   `per[core] if requested[core] else 0` -> `per[core]`: per_device is 0 wherever requested
#   is False (request.TypeRequest's invariant, _gpu_request).

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.device import Device
from apis.hints import ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
from scheduler.devices.allocator import (
    allocate,
    card_amounts,
    card_fits,
    card_left,
    card_taken,
    feasible_rows,
    rows_feasible,
)
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import CardUse, parse_request
from scheduler.devices.scoring import Scorer
from scheduler.framework.status import Code, Status
from scheduler.plugins.deviceshare.args import parse_args
from tests.unit.devices.helpers import (
    GI,
    bound,
    device,
    gpu,
    gpu_alloc,
    gpu_pod,
    gpus,
    ledger_of,
    ledgers,
    nic,
    topo_gpus,
)

CORE, RATIO, MEM = ("koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio",
                    "koordinator.sh/gpu-memory")
HINT, JOINT = ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
SPREAD: dict[str, Any] = {}
BINPACK = {"scoringStrategy": {"type": "MostAllocated"}}
EIGHT = [(0, "A"), (0, "A"), (0, "B"), (0, "B"), (1, "C"), (1, "C"), (1, "D"), (1, "D")]


def half_on(minor: int, core: int = 50, memory: int = 40 * GI) -> str:
    return gpu_alloc(minor, core, memory, core)


def run(devices: list[Device], existing: list[tuple[str, str]], requests: dict[str, Any],
        annotations: dict[str, str] | None = None, args: dict[str, Any] | None = None,
        node: str = "n") -> list[CardUse] | Status:
    pods = [bound(gpu_pod(f"e{i}", {"nvidia.com/gpu": 1}), node, text)
            for i, (node, text) in enumerate(existing)]
    ledger = ledger_of(devices, pods)
    request = parse_request(gpu_pod("p", requests, annotations).build())
    assert request is not None
    view = ledger.node_view(node, request.device_types)
    return allocate(view, request, Scorer(parse_args(args or {})))


def picked(result: list[CardUse] | Status) -> list[tuple[str, int]] | tuple[Code, str]:
    if isinstance(result, Status):
        return (result.code, result.message)
    return [(u.device_type, u.minor) for u in result]


U, R = Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE
TOPO = topo_gpus("n", EIGHT)
MIXED = device("n", gpu(0, pcie="A"), gpu(1, pcie="A"), gpu(2))  # GPU 2 reports no topology

CASES: list[Any] = [
    pytest.param([gpus("n", 2)], [("n", half_on(0))], {CORE: 50, RATIO: 50}, None, BINPACK,
                 [("gpu", 0)], id="binpack-partially-used-card"),
    pytest.param([gpus("n", 2)], [("n", half_on(0))], {CORE: 50, RATIO: 50}, None, SPREAD,
                 [("gpu", 1)], id="spread-free-card"),
    pytest.param([gpus("n", 2)], [("n", half_on(0, 60, 48 * GI))], {CORE: 50, RATIO: 50},
                 None, BINPACK, [("gpu", 1)], id="second-card-when-first-too-full"),
    pytest.param([gpus("n", 3)], [], {CORE: 50, RATIO: 50}, None, SPREAD, [("gpu", 0)],
                 id="ties-to-lowest-minor"),
    pytest.param([device("n", gpu(0, health=False), gpu(1))], [], {"nvidia.com/gpu": 1}, None,
                 SPREAD, [("gpu", 1)], id="unhealthy-card-skipped"),
    pytest.param([device("n", gpu(0, health=False))], [], {"nvidia.com/gpu": 1}, None,
                 SPREAD, (U, "Insufficient gpu devices"), id="only-unhealthy"),
    pytest.param([gpus("n", 2)], [], {"nvidia.com/gpu": 3}, None, SPREAD,
                 (U, "Insufficient gpu devices"), id="too-few-whole-cards"),
    pytest.param([gpus("n", 2)], [("n", half_on(0)), ("n", half_on(1))], {"nvidia.com/gpu": 1},
                 None, SPREAD, (U, "Insufficient gpu devices"), id="no-whole-card-free"),
    pytest.param([device("n", nic("rdma", 0))], [], {"nvidia.com/gpu": 1}, None, SPREAD,
                 (R, "Insufficient gpu devices"), id="node-without-gpus"),
    pytest.param([gpus("other", 1)], [], {"nvidia.com/gpu": 1}, None, SPREAD,
                 (R, "Insufficient gpu devices"), id="node-without-device-cr"),
    pytest.param([gpus("n", 2)], [], {"koordinator.sh/rdma": 10}, None, SPREAD,
                 (R, "Insufficient rdma devices"), id="node-without-rdma"),
    pytest.param([gpus("n", 1)], [], {"nvidia.com/gpu": 1, "koordinator.sh/fpga": 100}, None,
                 SPREAD, (R, "Insufficient fpga devices"), id="node-without-fpga"),
    pytest.param([TOPO], [], {"nvidia.com/gpu": 2}, None, SPREAD, [("gpu", 0), ("gpu", 1)],
                 id="two-whole-cards-one-switch"),
    pytest.param([TOPO], [("n", half_on(0))], {"nvidia.com/gpu": 2}, None, SPREAD,
                 [("gpu", 2), ("gpu", 3)], id="two-whole-cards-next-switch"),
    pytest.param([TOPO], [("n", half_on(1))], {"nvidia.com/gpu": 4}, None, SPREAD,
                 [("gpu", 4), ("gpu", 5), ("gpu", 6), ("gpu", 7)], id="four-cards-one-numa"),
    pytest.param([gpus("n", 4)], [("n", half_on(0))], {"nvidia.com/gpu": 2}, None, SPREAD,
                 [("gpu", 1), ("gpu", 2)], id="whole-cards-without-topology"),
    pytest.param([TOPO], [("n", half_on(0)), ("n", half_on(2)), ("n", half_on(4)),
                          ("n", half_on(6))], {"nvidia.com/gpu": 2},
                 {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'}, SPREAD,
                 (U, "Insufficient Topology Scoped GPU Devices"), id="required-pcie-violated"),
    pytest.param([TOPO], [("n", half_on(0)), ("n", half_on(2)), ("n", half_on(4)),
                          ("n", half_on(6))], {"nvidia.com/gpu": 2},
                 {HINT: '{"gpu":{"requiredTopologyScope":"NUMANode"}}'}, SPREAD,
                 [("gpu", 1), ("gpu", 3)], id="required-numa-across-switches"),
    pytest.param([TOPO], [("n", half_on(m)) for m in range(7)], {"nvidia.com/gpu": 2},
                 {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'}, SPREAD,
                 (U, "Insufficient Topology Scoped GPU Devices"), id="required-pcie-one-card-free"),
    # A node where not every GPU reports topology (no scope tree): a scoped request goes by
    # topology.choose_scoped, shared cards by score, gpushare by least free memory.
    pytest.param([MIXED], [("n", half_on(0))], {RATIO: 30},
                 {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'}, SPREAD, [("gpu", 1)],
                 id="scoped-shared-without-scope-tree-by-score"),
    pytest.param([MIXED], [("n", half_on(0))], {"aliyun.com/gpu-mem": 30},
                 {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'}, SPREAD, [("gpu", 0)],
                 id="scoped-gpushare-without-scope-tree-least-free-memory"),
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), gpu(2, pcie="B"),
                         gpu(3, pcie="A"), gpu(4))], [("n", half_on(4)), ("n", half_on(0))],
                 {"nvidia.com/gpu": 2}, {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'},
                 SPREAD, [("gpu", 1), ("gpu", 2)], id="scoped-whole-without-scope-tree"),
    # whole cards in a NUMA scope: one switch first (1, 2), not the lowest minors (0, 1)
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), gpu(2, pcie="B"), gpu(3))],
                 [("n", half_on(3))], {"nvidia.com/gpu": 2},
                 {HINT: '{"gpu":{"requiredTopologyScope":"NUMANode"}}'}, SPREAD,
                 [("gpu", 1), ("gpu", 2)], id="scoped-numa-whole-one-switch-first"),
    pytest.param([device("n", gpu(0, pcie="B"), gpu(1, pcie="A"), gpu(2, pcie="A"), gpu(3))],
                 [("n", half_on(1)), ("n", half_on(3))], {"nvidia.com/gpu": 1}, None, SPREAD,
                 [("gpu", 0)], id="one-whole-card-without-scope-tree-by-score"),
    # ... several whole cards there by PCIe switch (topology.choose_whole), not by score
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), gpu(2, pcie="B"), gpu(3))],
                 [("n", half_on(3))], {"nvidia.com/gpu": 2}, None, SPREAD,
                 [("gpu", 1), ("gpu", 2)], id="whole-cards-without-scope-tree-one-switch"),
    # gpushare's rule whatever the scorer: the card with the least free memory that fits.
    pytest.param([gpus("n", 2)], [("n", half_on(1))], {"aliyun.com/gpu-mem": 30}, None, SPREAD,
                 [("gpu", 1)], id="gpushare-least-free-memory-under-spread"),
    pytest.param([gpus("n", 2)], [("n", half_on(0)), ("n", half_on(1))],
                 {"aliyun.com/gpu-mem": 50}, None, SPREAD, (U, "Insufficient gpu devices"),
                 id="gpushare-no-card-fits"),
    pytest.param([gpus("n", 2)], [], {"nvidia.com/gpu": 2},
                 {HINT: '{"gpu":{"requiredTopologyScope":"Device"}}'}, SPREAD,
                 (U, "Insufficient Topology Scoped GPU Devices"), id="required-device-scope"),
    pytest.param([device("n", gpu(0), gpu(1, labels={"model": "x"}), gpu(2))], [],
                 {"nvidia.com/gpu": 1},
                 {HINT: '{"gpu":{"selector":{"matchLabels":{"model":"x"}}}}'}, SPREAD,
                 [("gpu", 1)], id="selector"),
    pytest.param([device("n", gpu(0), gpu(1))], [], {"nvidia.com/gpu": 1},
                 {HINT: '{"gpu":{"selector":{"matchLabels":{"model":"x"}}}}'}, SPREAD,
                 (U, "Insufficient gpu devices"), id="selector-matches-nothing"),
    pytest.param([gpus("n", 4)], [("n", half_on(1))],
                 {"koordinator.sh/gpu.shared": 2, RATIO: 100, CORE: 100}, None, BINPACK,
                 [("gpu", 1), ("gpu", 0)], id="shared-over-two-cards-binpack"),
    pytest.param([device("n", nic("rdma", 0), nic("rdma", 1))], [], {"koordinator.sh/rdma": 50},
                 None, SPREAD, [("rdma", 0)], id="rdma-share"),
    pytest.param([device("n", nic("rdma", 0), nic("rdma", 1))], [], {"koordinator.sh/rdma": 200},
                 None, SPREAD, [("rdma", 0), ("rdma", 1)], id="rdma-two-whole"),
    pytest.param([device("n", nic("rdma", 0), nic("rdma", 1), nic("rdma", 2))], [],
                 {"koordinator.sh/rdma": 1},
                 {HINT: '{"rdma":{"allocateStrategy":"ApplyForAll"}}'}, SPREAD,
                 [("rdma", 0), ("rdma", 1), ("rdma", 2)], id="rdma-apply-for-all"),
    pytest.param([device("n", nic("rdma", 0), nic("rdma", 1))], [], {"koordinator.sh/rdma": 1},
                 {HINT: '{"rdma":{"allocateStrategy":"ApplyForAll",'
                        '"selector":{"matchLabels":{"model":"x"}}}}'}, SPREAD,
                 (R, "Insufficient rdma devices"), id="rdma-apply-for-all-selects-nothing"),
    pytest.param([device("n", nic("fpga", 0))], [], {"koordinator.sh/fpga": 100}, None, SPREAD,
                 [("fpga", 0)], id="fpga-whole"),
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), nic("rdma", 0, pcie="B"))],
                 [("n", half_on(1))], {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 1},
                 {JOINT: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'}, SPREAD,
                 (U, "node(s) Device Joint-Allocate rules violation"),
                 id="joint-same-pcie-violated"),
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), nic("rdma", 0, pcie="A"),
                         nic("rdma", 1, pcie="B"))],
                 [("n", half_on(0))], {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 1},
                 {JOINT: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'}, SPREAD,
                 [("gpu", 1), ("rdma", 1)], id="joint-same-pcie-prefers-switch"),
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), nic("rdma", 0, pcie="A"),
                         nic("rdma", 1, pcie="B"))], [],
                 {"nvidia.com/gpu": 2, "koordinator.sh/rdma": 1},
                 {JOINT: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'}, SPREAD,
                 [("gpu", 0), ("gpu", 1), ("rdma", 0), ("rdma", 1)],
                 id="joint-one-nic-per-switch"),
    # SamePCIe needs a NIC on each switch of the GPUs: with B's missing, too few NICs
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), nic("rdma", 0, pcie="A"))],
                 [], {"nvidia.com/gpu": 2, "koordinator.sh/rdma": 1},
                 {JOINT: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'}, SPREAD,
                 (U, "Insufficient rdma devices"), id="joint-same-pcie-a-nic-short"),
    # a type outside the joint rule is still allocated after the joint ones
    pytest.param([device("n", gpu(0, pcie="A"), nic("rdma", 0, pcie="A"), nic("fpga", 0))], [],
                 {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 1, "koordinator.sh/fpga": 100},
                 {JOINT: '{"deviceTypes":["gpu","rdma"]}'}, SPREAD,
                 [("gpu", 0), ("rdma", 0), ("fpga", 0)], id="joint-and-another-type"),
    # PCIe groups of unequal size (Koordinator's sortDeviceResourcesByPreferredPCIe): the
    # first NIC of each preferred switch, then the second of each that has one, ...; the
    # lone NIC of switch B comes before A's second, not after A's third.
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"),
                         *(nic("rdma", m, pcie="A") for m in (0, 1, 2)), nic("rdma", 3, pcie="B"),
                         nic("rdma", 4, pcie="C"))], [],
                 {"nvidia.com/gpu": 2, "koordinator.sh/rdma": 300},
                 {JOINT: '{"deviceTypes":["gpu","rdma"]}'}, SPREAD,
                 [("gpu", 0), ("gpu", 1), ("rdma", 0), ("rdma", 3), ("rdma", 1)],
                 id="joint-unequal-pcie-groups-round-robin"),
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"),
                         nic("rdma", 0, pcie="C"), nic("rdma", 1, pcie="B"),
                         *(nic("rdma", m, pcie="A") for m in (2, 3, 4)))], [],
                 {"nvidia.com/gpu": 2, "koordinator.sh/rdma": 500},
                 {JOINT: '{"deviceTypes":["gpu","rdma"]}'}, SPREAD,
                 [("gpu", 0), ("gpu", 1), ("rdma", 1), ("rdma", 2), ("rdma", 3), ("rdma", 4),
                  ("rdma", 0)],
                 id="joint-unequal-pcie-groups-then-the-rest"),
    # A NIC that reports no topology is on no preferred switch: it comes after them.
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"), nic("rdma", 0),
                         nic("rdma", 1, pcie="B"), nic("rdma", 2, pcie="A"))], [],
                 {"nvidia.com/gpu": 2, "koordinator.sh/rdma": 300},
                 {JOINT: '{"deviceTypes":["gpu","rdma"]}'}, SPREAD,
                 [("gpu", 0), ("gpu", 1), ("rdma", 1), ("rdma", 2), ("rdma", 0)],
                 id="joint-nic-without-topology-after-the-switches"),
    pytest.param([device("n", gpu(0, pcie="A"), gpu(1, pcie="B"),
                         *(nic("rdma", m, pcie="A") for m in (2, 5)),
                         *(nic("rdma", m, pcie="B") for m in (3, 4)))], [],
                 {"nvidia.com/gpu": 2, "koordinator.sh/rdma": 400},
                 {JOINT: '{"deviceTypes":["gpu","rdma"]}'}, SPREAD,
                 [("gpu", 0), ("gpu", 1), ("rdma", 2), ("rdma", 3), ("rdma", 4), ("rdma", 5)],
                 id="joint-pcie-round-robin-ranks-each-round"),
]


@pytest.mark.parametrize(("devices", "existing", "requests", "annotations", "args", "want"),
                         CASES)
def test_allocate(devices: list[Device], existing: list[tuple[str, str]],
                  requests: dict[str, Any], annotations: dict[str, str] | None,
                  args: dict[str, Any], want: Any) -> None:
    assert picked(run(devices, existing, requests, annotations, args)) == want


COMPLETION: list[Any] = [
    pytest.param("64Gi", {CORE: 50, RATIO: 50}, {CORE: 50, RATIO: 50, MEM: 32 * GI},
                 id="ratio-50-of-64Gi-is-32Gi"),
    pytest.param("64Gi", {MEM: "32Gi"}, {RATIO: 50, MEM: 32 * GI}, id="32Gi-of-64Gi-is-50"),
    pytest.param("15Gi", {CORE: 25, MEM: "4Gi"}, {CORE: 25, RATIO: 26, MEM: 4 * GI},
                 id="ratio-truncated"),
    pytest.param("100", {RATIO: 29}, {RATIO: 29, MEM: 29}, id="memory-floor"),
    pytest.param("80Gi", {"nvidia.com/gpu": 1}, {CORE: 100, RATIO: 100, MEM: 80 * GI},
                 id="whole-card"),
]


@pytest.mark.parametrize(("memory", "requests", "want"), COMPLETION)
def test_completion(memory: str, requests: dict[str, Any], want: dict[str, int]) -> None:
    result = run([device("n", gpu(0, memory))], [], requests)
    assert isinstance(result, list)
    assert result == [CardUse.of("gpu", 0, want)]


def test_memory_is_checked_after_completion() -> None:
    # 11 bytes of a 16-byte card are held with ratio 62 (rounding, or another scheduler); a
    # ratio-38 pod would take 6 bytes: it fits the ratio left (38) but not the memory (5).
    text = gpu_alloc(0, 62, 11)
    assert picked(run([device("n", gpu(0, "16"))], [("n", text)], {RATIO: 38})) == (
        U, "Insufficient gpu devices")
    assert picked(run([device("n", gpu(0, "16"))], [("n", text)], {RATIO: 37})) == [("gpu", 0)]


# ---------------------------------------------------------------------------------------------
# Property: feasible_rows (numpy over the ledger) == allocate(...) succeeds, per node.

REQUESTS: list[dict[str, Any]] = [
    {"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 4},
    {CORE: 50, RATIO: 50}, {CORE: 25, MEM: "4Gi"}, {MEM: "30Gi"}, {RATIO: 90},
    {"koordinator.sh/gpu.shared": 2, RATIO: 120}, {"koordinator.sh/rdma": 50},
    {"koordinator.sh/rdma": 200}, {"koordinator.sh/fpga": 100},
    {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 60},
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(), st.sampled_from(REQUESTS), st.booleans())
def test_feasible_rows_equals_allocate(ledger: NodeDeviceLedger, requests: dict[str, Any],
                                       binpack: bool) -> None:
    request = parse_request(gpu_pod("p", requests).build())
    assert request is not None and request.vectorizable
    scorer = Scorer(parse_args(BINPACK if binpack else SPREAD))
    rows = feasible_rows(ledger, request)
    assert len(rows) == ledger.n_rows + 1 and not rows[-1]
    assert rows.dtype == np.bool_  # a mask: the batch Filter selects nodes with it
    for n in range(ledger.n_rows):
        row = ledger.row_of(f"n{n}")
        assert row is not None
        result = allocate(ledger.node_view(f"n{n}", request.device_types), request, scorer)
        assert bool(rows[row]) == isinstance(result, list), (f"n{n}", result)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(), st.sampled_from(REQUESTS))
def test_card_matrices_equal_card_amounts(ledger: NodeDeviceLedger,
                                          requests: dict[str, Any]) -> None:
    """``card_fits``/``card_taken``/``card_left`` (rows x cards) agree with the per-card
    reference ``card_amounts`` on every card of every node, and rows_feasible with
    feasible_rows."""
    request = parse_request(gpu_pod("p", requests).build())
    assert request is not None
    rows = np.arange(ledger.n_rows)
    assert rows_feasible(ledger, request, rows).tolist() == \
        feasible_rows(ledger, request)[:-1].tolist()
    for treq in request.types:
        t = treq.device_type
        fits, taken = card_taken(ledger, treq, rows)
        fits_left, left = card_left(ledger, treq, rows)
        assert (fits == card_fits(ledger, treq, rows)).all() and (fits == fits_left).all()
        for n in range(ledger.n_rows):
            name = ledger.node_name(n)
            cols = {m: c for c, m in enumerate(ledger.minors(name, t))}
            for card in ledger.node_view(name, [t]).cards[t]:
                col = cols[card.minor]
                amounts = card_amounts(treq, card)
                assert bool(fits[n, col]) == (amounts is not None), (name, card)
                if amounts is None:
                    continue
                assert tuple(int(x) for x in taken[:, n, col]) == amounts
                after = [f - a for f, a in zip(card.free, amounts, strict=True)]
                parts = [f * 1000 // x for x, f in zip(card.total, after, strict=True) if x > 0]
                assert int(left[n, col]) == (min(parts) if parts else 0)


def test_apply_for_all_needs_one_card_that_fits() -> None:
    """``ApplyForAll`` (count 0) is feasible on a node only where at least one of its cards
    fits: not on a node whose only NIC is taken, nor on one without NICs."""
    taken = '{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"}}]}'
    ledger = ledger_of(
        [device("full", nic("rdma", 0)), device("free", nic("rdma", 0)), gpus("bare", 1)],
        [bound(gpu_pod("holder", {}), "full", taken)],
    )
    request = parse_request(gpu_pod("p", {"koordinator.sh/rdma": 1},
                                    {HINT: '{"rdma":{"allocateStrategy":"ApplyForAll"}}'}).build())
    assert request is not None and request.types[0].count == 0
    rows = feasible_rows(ledger, request)
    assert {name: bool(rows[ledger.row_of(name)]) for name in ("full", "free", "bare")} == \
        {"full": False, "free": True, "bare": False}


def test_rows_feasible_of_no_rows_is_an_empty_mask() -> None:
    ledger = ledger_of([gpus("n", 1)])
    request = parse_request(gpu_pod("p", {"nvidia.com/gpu": 1}).build())
    assert request is not None
    out = rows_feasible(ledger, request, np.zeros(0, np.int64))
    assert out.shape == (0,) and out.dtype == np.bool_
