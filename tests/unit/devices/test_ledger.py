"""NodeDeviceLedger: events, reservations, idempotence, Device lifecycle, checkpoints, and a
property test over random sequences (no over-commit, rebuild == incremental)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    DeviceAllocation,
    encode_allocations,
    read_allocations,
)
from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.core import Pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, Device
from apis.gpushare import UnhealthyGPUs
from apis.partition import ANNOTATION_GPU_PARTITIONS, POLICY_HONOR
from apis.topology import ANNOTATION_GPU_TOPOLOGY
from scheduler.devices.allocator import allocate
from scheduler.devices.ledger import InvalidAllocation, NodeDeviceLedger
from scheduler.devices.request import (
    ANNOTATION,
    RESERVED,
    CardUse,
    Holding,
    node_cards,
    parse_request,
    uses_from_annotation,
)
from scheduler.devices.scoring import Scorer
from scheduler.devices.table import CardTable as _Table
from scheduler.devices.topology import NodeMeta
from scheduler.framework.events import UNHEALTHY_GPUS_KIND, Change
from tests.unit.devices.helpers import (
    GI,
    bound,
    device,
    gpu,
    gpu_pod,
    gpus,
    hopper_table,
    ledger_of,
    nic,
    pairs_topology,
    topology_node,
    verify,
    vf_bus,
)

# Equivalent mutants (make mutation MODULE=scheduler/devices/ledger.py): no input tells them
# apart from the original.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_observe_gpushare__mutmut_22
#   `uses = ()` -> `uses = None` after a malformed annotation: both are falsy, and the next
#   line only asks `if not uses`.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_release__mutmut_1
#   `self._invalid.pop(uid, None)` -> `.pop(None, None)`: a released pod's stale entry is
#   never read (_rehold_invalid walks only the uids of live holdings, and every way back to a
#   holding, _set_holding, drops the entry first); it only lingers in a private dict.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ__init____mutmut_1
#   default `rows=64` -> 65: the first allocation of a ledger built without `rows` only; every
#   node, card and holding reads the same, and row_capacity is only promised >= n_rows.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ__init____mutmut_2
#   default `cards=8` -> 9: the first column allocation only, as __init____mutmut_1.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ__init____mutmut_40
#   node_set_generation starts at 1: readers only compare it with a value they read before
#   (a cache key); it still changes exactly when a node gets a row.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_ensure_row__mutmut_25
#   node_set_generation `+= 1` -> `-= 1`: still a new value on each new row, as __init____mutmut_40.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_ensure_row__mutmut_26
#   `+= 1` -> `+= 2`: still a new value on each new row, as __init____mutmut_40.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ__init____mutmut_47
#   tick starts at 1: tick and row_version are only compared with each other (rowcache:
#   `row_version > entry.tick`, `entry.tick == ledger.tick`; deviceshare and gpufragmentation:
#   a row's version against the one they cached); every row is stamped in the call that makes
#   it, so no live row keeps version 0 either way.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_touch__mutmut_3
#   `tick += 2`: ticks still strictly increase and each row's version is the tick of its last
#   change, all that the comparisons of __init____mutmut_47 read.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_ensure_row__mutmut_16
#   `len(row_version) < rows_cap` -> `<=`: a full-length copy of row_version on each new row
#   (same values, same length, same dtype); only the allocation differs.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_rebuild_row__mutmut_8
#   `vf_cards = False` -> `None`: only ever read by `if vf_cards`.
# mutmut-equivalent: scheduler.devices.ledger.xǁNodeDeviceLedgerǁ_refresh__mutmut_6
#   `_devices.pop(node, None)` -> `.pop(node)`: _refresh finds no device only after NodeSources
#   answered True to delete_cr / set_node / delete_node, i.e. it had one for the node, and the
#   _refresh that followed its arrival stored that one in _devices (set_unit refreshes only
#   nodes whose derived cards exist): the pop always finds the node, never raises.

HALF = ('{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50",'
        '"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}')
HALF_USE = CardUse.of("gpu", 1, {"koordinator.sh/gpu-core": 50,
                                 "koordinator.sh/gpu-memory": 40 * GI,
                                 "koordinator.sh/gpu-memory-ratio": 50})


def card(ledger: NodeDeviceLedger, node: str, minor: int, device_type: str = "gpu"
         ) -> dict[str, Any]:
    cards: dict[int, Any] = ledger.snapshot_state()["nodes"][node]["cards"][device_type]
    return dict(cards[minor])


def used(ledger: NodeDeviceLedger, node: str, minor: int) -> tuple[int, ...]:
    return tuple(card(ledger, node, minor)["used"])


def test_device_add_sets_totals_and_unhealthy_is_zero() -> None:
    ledger = ledger_of([device("n", gpu(0, "16Gi"), gpu(1, health=False), nic("rdma", 0))])
    assert card(ledger, "n", 0)["total"] == (100, 100, 16 * GI)
    assert card(ledger, "n", 1)["total"] == (0, 0, 0)
    assert card(ledger, "n", 1)["exists"] and not card(ledger, "n", 1)["healthy"]
    assert card(ledger, "n", 0, "rdma")["total"] == (100,)
    verify(ledger)


POD_EVENTS: list[Any] = [
    pytest.param("delete", (0, 0, 0), id="deleted-releases"),
    pytest.param("succeeded", (0, 0, 0), id="succeeded-releases"),
    pytest.param("failed", (0, 0, 0), id="failed-releases"),
    pytest.param("no-annotation", (0, 0, 0), id="annotation-removed-releases"),
    pytest.param("terminating", (50, 50, 40 * GI), id="terminating-still-holds"),
    pytest.param("unassigned", (50, 50, 40 * GI), id="unassigned-update-ignored"),
]


@pytest.mark.parametrize(("event", "want"), POD_EVENTS)
def test_pod_events(event: str, want: tuple[int, ...]) -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    raw = dict(pod.raw)
    if event == "delete":
        ledger.apply_change(Change("Pod", pod, None))
    else:
        if event in ("succeeded", "failed"):
            raw["status"] = {"phase": event.capitalize()}
        elif event == "no-annotation":
            raw["metadata"] = {**raw["metadata"], "annotations": {}}
        elif event == "terminating":
            raw["metadata"] = {**raw["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}
        else:
            raw["spec"] = {**raw["spec"], "nodeName": ""}
        from apis.core import decode_pod

        ledger.apply_change(Change("Pod", pod, decode_pod(raw)))
    assert used(ledger, "n", 1) == want
    verify(ledger)


def test_reserve_then_bind_event_counts_once() -> None:
    ledger = ledger_of([gpus("n", 2)])
    holding = ledger.reserve("default/p", "n", [HALF_USE], HALF)
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger.apply_change(Change("Pod", None, pod))
    ledger.apply_change(Change("Pod", pod, pod))
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    assert ledger.snapshot_state()["holders"]["default/p"][1] == "annotation"
    ledger.unreserve(holding)  # a late unreserve must not drop the bound pod's devices
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    verify(ledger)


def test_bind_event_with_equivalent_text_counts_once() -> None:
    ledger = ledger_of([gpus("n", 2)])
    ledger.reserve("default/p", "n", [HALF_USE], "")
    reordered = json.dumps({"gpu": [{"resources": {"koordinator.sh/gpu-memory-ratio": "50",
                                                   "koordinator.sh/gpu-core": "50",
                                                   "koordinator.sh/gpu-memory": "40Gi"},
                                     "minor": 1}]})
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", reordered)
    ledger.apply_change(Change("Pod", None, pod))
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    verify(ledger)


def test_bind_elsewhere_replaces_reservation() -> None:
    ledger = ledger_of([gpus("a", 2), gpus("b", 2)])
    holding = ledger.reserve("default/p", "a", [HALF_USE], HALF)
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "b", HALF)
    ledger.apply_change(Change("Pod", None, pod))
    assert used(ledger, "a", 1) == (0, 0, 0)
    assert used(ledger, "b", 1) == (50, 50, 40 * GI)
    ledger.unreserve(holding)
    assert used(ledger, "b", 1) == (50, 50, 40 * GI)
    verify(ledger)


def test_unreserve_and_release_reservation() -> None:
    ledger = ledger_of([gpus("n", 2)])
    holding = ledger.reserve("u1", "n", [HALF_USE])
    ledger.unreserve(holding)
    assert used(ledger, "n", 1) == (0, 0, 0)
    ledger.reserve("u2", "n", [HALF_USE])
    ledger.release_reservation("u2")
    assert used(ledger, "n", 1) == (0, 0, 0)
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u3"), "n", HALF)
    ledger.apply_change(Change("Pod", None, pod))
    ledger.release_reservation("u3")  # not a reservation: kept
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)


def test_uid_change_under_same_name_releases_old() -> None:
    old = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u1"), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [old])
    new = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u2"), "n")
    ledger.apply_change(Change("Pod", old, new))
    assert used(ledger, "n", 1) == (0, 0, 0)
    assert ledger.snapshot_state()["holders"] == {}


def test_unhealthy_keeps_usage_and_recovers() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    ledger.apply_change(Change("Device", gpus("n", 2), device("n", gpu(0), gpu(1, health=False))))
    c = card(ledger, "n", 1)
    assert c["total"] == (0, 0, 0) and c["used"] == (50, 50, 40 * GI) and c["free"] == (0, 0, 0)
    ledger.apply_change(Change("Device", None, gpus("n", 2)))
    assert card(ledger, "n", 1)["free"] == (50, 50, 40 * GI)
    verify(ledger)


def test_device_deleted_and_recreated_keeps_usage() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    crd = gpus("n", 2)
    ledger = ledger_of([crd], [pod])
    ledger.apply_change(Change("Device", crd, None))
    state = ledger.snapshot_state()["nodes"]["n"]
    assert not state["device"]
    assert list(state["cards"]["gpu"]) == [1]  # only the held card remains, unusable
    c = card(ledger, "n", 1)
    assert not c["exists"] and c["total"] == (0, 0, 0) and c["used"] == (50, 50, 40 * GI)
    assert not ledger.has_device("n")
    ledger.apply_change(Change("Device", None, crd))
    c = card(ledger, "n", 1)
    assert c["exists"] and c["free"] == (50, 50, 40 * GI)
    verify(ledger)
    assert ledger.snapshot_state() == NodeDeviceLedger.replay([crd], [pod]).snapshot_state()


def test_usage_of_a_card_missing_from_the_device() -> None:
    alloc = HALF.replace('"minor":1', '"minor":7')
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", alloc)
    ledger = ledger_of([gpus("n", 2)], [pod])
    c = card(ledger, "n", 7)
    assert not c["exists"] and c["used"] == (50, 50, 40 * GI)
    verify(ledger)


def _checkpoint(*ids: str) -> dict[str, str]:
    entries = [PodDeviceEntry("pod-x", "c", "nvidia.com/gpu", ids)]
    return {ANNOTATION_DEVICES_CHECKPOINTS: encode_devices_checkpoints(entries)}


def test_checkpoint_devices_count_as_fully_used() -> None:
    crd = device("n", gpu(0), gpu(1), gpu(2), annotations=_checkpoint("GPU-1", "GPU-9"))
    ledger = ledger_of([crd])
    assert used(ledger, "n", 1) == (100, 100, 80 * GI)
    assert card(ledger, "n", 1)["free"] == (0, 0, 0)
    assert used(ledger, "n", 0) == (0, 0, 0)
    ledger.apply_change(Change("Device", crd, device("n", gpu(0), gpu(1), gpu(2))))
    assert used(ledger, "n", 1) == (0, 0, 0)
    verify(ledger)


def test_a_malformed_checkpoint_is_counted_not_raised() -> None:
    crd = device("n", gpu(0), annotations={ANNOTATION_DEVICES_CHECKPOINTS: "[{"})
    ledger = ledger_of([crd])
    assert ledger.annotation_errors == 1
    assert used(ledger, "n", 0) == (0, 0, 0)
    verify(ledger)


# -- issue 23: an invalid device-allocated annotation only makes cards look more used -----------

WHOLE80 = (100, 100, 80 * GI)
IDLE = (0, 0, 0)


def _one(resources: str, minor: str = "0") -> str:
    return f'{{"gpu":[{{"minor":{minor},"resources":{{{resources}}}}}]}}'


C, R, M = ('"koordinator.sh/gpu-core"', '"koordinator.sh/gpu-memory-ratio"',
           '"koordinator.sh/gpu-memory"')
# (annotation, card 0, card 1, reported): what a bound pod on a node of two 80Gi GPUs holds.
HOSTILE: list[Any] = [
    pytest.param(_one(f'{C}:"-100",{R}:"-100",{M}:"-80Gi"'), WHOLE80, IDLE, True,
                 id="negative-amounts-hold-the-card-whole"),
    pytest.param(_one(f'{C}:"50",{R}:"50",{M}:"-1"'), WHOLE80, IDLE, True,
                 id="one-negative-amount"),
    pytest.param(_one(f'{C}:-100,{R}:-100'), WHOLE80, IDLE, True, id="negative-bare-numbers"),
    pytest.param(_one(f'{C}:"101",{R}:"100"'), WHOLE80, IDLE, True, id="percent-beyond-a-card"),
    pytest.param(_one(f'{C}:"100",{M}:"1e30"'), WHOLE80, IDLE, True,
                 id="memory-beyond-int64"),
    pytest.param(_one(f'{C}:"100",{M}:"2Ti"'), WHOLE80, IDLE, True, id="memory-beyond-1Ti"),
    pytest.param(_one(f'{C}:"0",{R}:"0"'), WHOLE80, IDLE, True, id="zero-amounts"),
    pytest.param(_one(""), WHOLE80, IDLE, True, id="no-resources"),
    pytest.param(_one('"nvidia.com/gpu":"1"'), WHOLE80, IDLE, True, id="only-unknown-resources"),
    pytest.param('{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50",'
                 '"koordinator.sh/gpu-memory-ratio":"50"}},{"minor":0,"resources":'
                 '{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}}]}',
                 WHOLE80, IDLE, True, id="card-named-twice"),
    pytest.param('{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-100"}},'
                 '{"minor":1,"resources":{"koordinator.sh/gpu-core":"50",'
                 '"koordinator.sh/gpu-memory-ratio":"50"}}]}',
                 WHOLE80, (50, 50, 0), True, id="valid-entry-beside-an-invalid-one"),
    pytest.param(_one(f'{C}:"NaN"'), WHOLE80, WHOLE80, True, id="nan-text-every-card"),
    pytest.param(_one(f'{C}:"Inf"'), WHOLE80, WHOLE80, True, id="inf-text-every-card"),
    pytest.param(_one(f'{C}:"lots"'), WHOLE80, WHOLE80, True, id="non-numeric-every-card"),
    pytest.param(_one(f'{C}:true'), WHOLE80, WHOLE80, True, id="boolean-every-card"),
    pytest.param(_one(f'{C}:"100"', minor="-1"), WHOLE80, WHOLE80, True,
                 id="negative-minor-every-card"),
    pytest.param(_one(f'{C}:"100"', minor='"0"'), WHOLE80, WHOLE80, True,
                 id="string-minor-every-card"),
    pytest.param(_one(f'{C}:"100"', minor="4294967296"), WHOLE80, WHOLE80, True,
                 id="minor-beyond-int32-every-card"),
    pytest.param('{"gpu":[null]}', WHOLE80, WHOLE80, True, id="null-entry-every-card"),
    pytest.param('{"gpu":3}', WHOLE80, WHOLE80, True, id="type-not-a-list-every-card"),
    pytest.param("not json", WHOLE80, WHOLE80, True, id="not-json-every-card"),
    pytest.param("", WHOLE80, WHOLE80, True, id="empty-text-every-card"),
    pytest.param(_one(f'{C}:"-100"', minor="7"), IDLE, IDLE, True,
                 id="negative-on-a-card-the-node-lacks"),
    pytest.param('{"xpu":[{"minor":0,"resources":{"x":"-1"}}]}', IDLE, IDLE, True,
                 id="negative-on-an-unknown-type"),
    pytest.param('{"xpu":[{"minor":0,"resources":{"x":"1"}}]}', IDLE, IDLE, False,
                 id="valid-unknown-type-ignored"),
    pytest.param(_one(f'{C}:"0.5",{R}:"500m",{M}:"1"'), (1, 1, 1), IDLE, False,
                 id="fractions-round-up-valid"),
    pytest.param("{}", IDLE, IDLE, False, id="empty-object-valid"),
    pytest.param("null", IDLE, IDLE, False, id="null-valid"),
]


@pytest.mark.parametrize(("raw", "card0", "card1", "reported"), HOSTILE)
def test_an_invalid_annotation_only_makes_cards_look_more_used(
    raw: str, card0: tuple[int, ...], card1: tuple[int, ...], reported: bool
) -> None:
    findings: list[InvalidAllocation] = []
    ledger = ledger_of([gpus("n", 2)])
    ledger.on_invalid = findings.append
    pod = bound(gpu_pod("p", {}), "n", raw)
    ledger.apply_change(Change("Pod", None, pod))
    assert (used(ledger, "n", 0), used(ledger, "n", 1)) == (card0, card1)
    assert ledger.annotation_errors == int(reported)
    assert [f.pod.uid for f in findings] == ([pod.uid] if reported else [])
    verify(ledger)
    rebuilt = NodeDeviceLedger.replay([gpus("n", 2)], [pod])
    assert ledger.snapshot_state() == rebuilt.snapshot_state()
    ledger.apply_change(Change("Pod", pod, None))
    assert (used(ledger, "n", 0), used(ledger, "n", 1)) == (IDLE, IDLE)  # gone: released


def test_an_invalid_annotation_is_reported_once_per_text() -> None:
    findings: list[InvalidAllocation] = []
    ledger = ledger_of([gpus("n", 2)])
    ledger.on_invalid = findings.append
    first = bound(gpu_pod("p", {}), "n", _one(f'{C}:"-100"'))
    ledger.apply_change(Change("Pod", None, first))
    ledger.apply_change(Change("Pod", first, first))  # a resync, a status update
    assert [f.held for f in findings] == [(("gpu", 0),)]
    second = bound(gpu_pod("p", {}), "n", _one(f'{C}:"-100"', minor="1"))
    ledger.apply_change(Change("Pod", first, second))
    assert [f.held for f in findings] == [(("gpu", 0),), (("gpu", 1),)]
    assert (used(ledger, "n", 0), used(ledger, "n", 1)) == (IDLE, WHOLE80)
    assert "gpu[0].resources" in findings[1].describe() and "gpu 1" in findings[1].describe()
    fixed = bound(gpu_pod("p", {}), "n", HALF)
    ledger.apply_change(Change("Pod", second, fixed))  # a valid text counts as written
    assert (used(ledger, "n", 0), used(ledger, "n", 1)) == (IDLE, (50, 50, 40 * GI))
    assert len(findings) == 2 and ledger.annotation_errors == 2
    verify(ledger)


@pytest.mark.parametrize(
    ("fixed_text", "after"),
    [
        pytest.param(HALF, {0: IDLE, 1: (50, 50, 40 * GI)}, id="fixed-to-another-card"),
        # the same amounts the invalid entry held (card 0 whole): the holding is not replaced,
        # only relabelled, and the stale reading must still be dropped
        pytest.param(_one(f'{C}:"100",{R}:"100",{M}:"80Gi"'), {0: WHOLE80, 1: IDLE},
                     id="fixed-to-the-same-amounts"),
    ],
)
def test_a_fixed_annotation_stays_fixed_when_the_device_changes(
    fixed_text: str, after: dict[int, tuple[int, ...]]
) -> None:
    """An invalid annotation replaced by a valid one is forgotten: a later Device CR change
    must not bring the old reading back (it would re-hold the card whole as the new Device
    has it, not as the valid text says)."""
    ledger = ledger_of([gpus("n", 2)])
    broken = bound(gpu_pod("p", {}), "n", _one(f'{C}:"-100"'))
    ledger.apply_change(Change("Pod", None, broken))
    fixed = bound(gpu_pod("p", {}), "n", fixed_text)
    ledger.apply_change(Change("Pod", broken, fixed))
    smaller = gpus("n", 3, "40Gi")
    ledger.apply_change(Change("Device", gpus("n", 2), smaller))
    assert {m: used(ledger, "n", m) for m in (0, 1, 2)} == {**after, 2: IDLE}
    verify(ledger)
    assert ledger.snapshot_state() == NodeDeviceLedger.replay([smaller], [fixed]).snapshot_state()


def test_a_failing_reporter_never_breaks_the_accounting() -> None:
    def boom(finding: InvalidAllocation) -> None:
        raise RuntimeError("cluster down")

    ledger = ledger_of([gpus("n", 2)])
    ledger.on_invalid = boom
    with capture_logs() as logs:
        ledger.apply_change(Change("Pod", None, bound(gpu_pod("p", {}), "n", _one(f'{C}:"-1"'))))
    assert used(ledger, "n", 0) == WHOLE80
    assert logs[-1] == {"event": "reporting an invalid device allocation failed",
                        "log_level": "error", "error": "RuntimeError('cluster down')"}


@pytest.mark.parametrize("raw", [_one(f'{C}:"-100"', minor="2"), "not json"])
def test_what_an_invalid_annotation_holds_follows_the_device(raw: str) -> None:
    """The pod is seen before its card: the card is held whole once the Device CR lists it
    (and given back to nobody when the CR is deleted and re-created)."""
    pod = bound(gpu_pod("p", {}), "n", raw)
    ledger = ledger_of([gpus("n", 2)], [pod])
    assert used(ledger, "n", 0) == (WHOLE80 if raw == "not json" else IDLE)
    ledger.apply_change(Change("Device", gpus("n", 2), gpus("n", 3)))
    assert used(ledger, "n", 2) == WHOLE80
    ledger.apply_change(Change("Device", gpus("n", 3), None))
    ledger.apply_change(Change("Device", None, gpus("n", 3)))
    assert used(ledger, "n", 2) == WHOLE80
    verify(ledger)
    rebuilt = NodeDeviceLedger.replay([gpus("n", 3)], [pod])
    assert ledger.snapshot_state() == rebuilt.snapshot_state()


def test_an_invalid_annotation_keeps_our_reservation_beside_it() -> None:
    ledger = ledger_of([gpus("n", 2)])
    ledger.reserve("default/p", "n", [HALF_USE], HALF)
    bad = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", _one(f'{C}:"-100"'))
    ledger.apply_change(Change("Pod", None, bad))
    assert ledger.annotation_errors == 1
    assert (used(ledger, "n", 0), used(ledger, "n", 1)) == (WHOLE80, (50, 50, 40 * GI))
    ledger.apply_change(Change("Device", gpus("n", 2), gpus("n", 2, "40Gi")))
    assert used(ledger, "n", 0) == (100, 100, 40 * GI)  # held whole as the card is now
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)    # our reservation still there
    verify(ledger)


def test_the_report_names_only_the_cards_the_annotation_holds() -> None:
    """An unreadable annotation holds every card of the node's Device; the reservation kept
    beside it (here on a card the Device no longer lists) is ours, not the pod's finding."""
    findings: list[InvalidAllocation] = []
    ledger = ledger_of([gpus("n", 2)])
    ledger.on_invalid = findings.append
    ledger.reserve("default/p", "n", [dataclasses.replace(HALF_USE, minor=7)], HALF)
    bad = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", "not json")
    with capture_logs() as logs:
        ledger.apply_change(Change("Pod", None, bad))
    assert [f.held for f in findings] == [(("gpu", 0), ("gpu", 1))]
    assert logs == [{
        "event": "invalid device allocation on a bound pod: its cards count as fully used",
        "log_level": "warning", "pod": "default/p", "uid": bad.uid, "node": "n",
        "problems": list(findings[0].reading.problems), "held": ["gpu 0", "gpu 1"],
    }]
    assert used(ledger, "n", 7) == (50, 50, 40 * GI)  # the reservation is still counted
    verify(ledger)


def test_card_meta_and_checkpoint_holding_answer_none_for_what_is_not_there() -> None:
    crd = device("n", gpu(0), gpu(1), annotations=_checkpoint("GPU-1"))
    ledger = ledger_of([crd, gpus("m", 1)])
    meta = ledger.card_meta("n", "gpu", 1)
    assert meta is not None and (meta.minor, meta.id) == (1, "GPU-1")
    assert ledger.card_meta("n", "gpu", 5) is None      # a minor the node lacks
    assert ledger.card_meta("n", "rdma", 0) is None     # a type the node lacks
    assert ledger.card_meta("x", "gpu", 0) is None      # a node the ledger lacks
    checkpoint = ledger.checkpoint_holding("n")
    assert checkpoint is not None and checkpoint.node == "n"
    assert [(u.device_type, u.minor) for u in checkpoint.uses] == [("gpu", 1)]
    assert ledger.checkpoint_holding("m") is None
    assert ledger.checkpoint_holding("x") is None
    assert ledger.minors("n", "gpu") == (0, 1) and ledger.minors("x", "gpu") == ()


def test_a_bound_pod_cannot_reserve_and_a_reservation_is_not_held_from_the_cluster() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    holding = ledger.holding(pod.uid)
    assert holding is not None and ledger.held_from_the_cluster(pod.uid) is holding
    with pytest.raises(ValueError, match="holds cards per the cluster"):
        ledger.reserve(pod.uid, "n", [HALF_USE], HALF)
    mine = ledger.reserve("default/q", "n", [HALF_USE], HALF)
    assert ledger.holding("default/q") is mine and ledger.held_from_the_cluster("default/q") is None
    assert ledger.held_from_the_cluster("default/nobody") is None


def test_snapshot_skips_only_the_idle_columns_of_cards_no_device_lists() -> None:
    """Cards held but in no Device are kept as columns; once idle they leave the snapshot,
    and the columns after them stay in it."""
    ledger = ledger_of([gpus("n", 2)])
    first = ledger.reserve("a", "n", [dataclasses.replace(HALF_USE, minor=7)])
    ledger.reserve("b", "n", [dataclasses.replace(HALF_USE, minor=8)])
    ledger.unreserve(first)
    cards = ledger.snapshot_state()["nodes"]["n"]["cards"]["gpu"]
    assert sorted(cards) == [0, 1, 8]
    assert cards[8]["used"] == (50, 50, 40 * GI) and not cards[8]["exists"]
    verify(ledger)


def test_replay_keeps_each_reservation_as_it_was() -> None:
    """A rebuilt ledger's reservations carry the text PreBind will write, so the bind event
    that follows is recognised as ours (``Holding`` compares its annotation too)."""
    ledger = ledger_of([gpus("n", 2)])
    held = ledger.reserve("default/p", "n", [HALF_USE], HALF)
    rebuilt = NodeDeviceLedger.replay([gpus("n", 2)], [], [held])
    again = rebuilt.holding("default/p")
    assert again == held and again is not None and again.annotation == HALF  # (not compared)
    assert rebuilt.snapshot_state() == ledger.snapshot_state()


def test_unknown_types_and_resources_are_ignored() -> None:
    raw = ('{"xpu":[{"minor":0,"resources":{"x":"1"}}],"rdma":[{"minor":0,"resources":'
           '{"koordinator.sh/rdma":"10","other":"5"}}]}')
    assert uses_from_annotation(raw) == (CardUse.of("rdma", 0, {"koordinator.sh/rdma": 10}),)


def test_grows_rows_and_cards() -> None:
    devices = [gpus(f"n{i}", 1 + i % 12) for i in range(40)]
    ledger = ledger_of(devices)
    assert ledger.n_rows == 40
    assert ledger.table("gpu").cards >= 12
    verify(ledger)
    assert ledger.snapshot_state() == NodeDeviceLedger.replay(devices, []).snapshot_state()


def test_node_view_overlay_releases_removed_holdings() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    holding = ledger.holding(pod.uid)
    assert holding is not None
    view = ledger.node_view("n", ["gpu"], [holding])
    assert view.cards["gpu"][1].free == (100, 100, 80 * GI)
    assert ledger.node_view("n", ["gpu"]).cards["gpu"][1].free == (50, 50, 40 * GI)


def _vf_pod(name: str, node: str, nic_minor: int, *vfs: int) -> Pod:
    """A bound pod holding 10 of NIC ``nic_minor`` and its VFs ``vfs``."""
    named = ",".join(f'{{"minor":{v},"busID":"{vf_bus(nic_minor, v)}"}}' for v in vfs)
    text = (f'{{"rdma":[{{"minor":{nic_minor},"resources":{{"koordinator.sh/rdma":"10"}},'
            f'"extension":{{"vfs":[{named}]}}}}]}}')
    return bound(gpu_pod(name, {}), node, text)


def test_what_if_views_free_and_take_vfs() -> None:
    """Preemption's dry run asks "and without these victims?": the VFs the victims hold are
    free in that view (and in no other), the VFs of pods it adds are taken, and a pod both
    removed and re-added holds only what it is re-added with."""
    nics = device("n", nic("rdma", 0, vfs=3), nic("rdma", 1, vfs=2))
    a, b = _vf_pod("a", "n", 0, 0), _vf_pod("b", "n", 0, 1)
    c = _vf_pod("c", "n", 1, 0)
    other = _vf_pod("x", "m", 0, 2)
    ledger = ledger_of([nics, device("m", nic("rdma", 0, vfs=3))], [a, b, c, other])
    ha, hb, hc, hx = (ledger.holding(p.uid) for p in (a, b, c, other))
    assert ha is not None and hb is not None and hc is not None and hx is not None
    bus = vf_bus

    def taken(removed: list[Holding], added: list[Holding] = ()) -> dict[Any, frozenset[str]]:
        return dict(ledger.node_view("n", ["rdma"], removed, added).vfs_taken)

    everything = {("rdma", 0): frozenset({bus(0, 0), bus(0, 1)}),
                  ("rdma", 1): frozenset({bus(1, 0)})}
    assert taken([]) == everything
    assert taken([ha]) == {("rdma", 0): frozenset({bus(0, 1)}), ("rdma", 1): frozenset({bus(1, 0)})}
    assert taken([ha, hb, hc]) == {}
    assert taken([hx]) == everything  # a victim on another node frees nothing here
    incoming = dataclasses.replace(hx, node="n", uid="incoming")
    assert taken([hc], [incoming]) == {("rdma", 0): frozenset({bus(0, 0), bus(0, 1), bus(0, 2)})}
    assert taken([], [dataclasses.replace(hx, uid="elsewhere")]) == everything
    # a pod moved to other VFs: only its new ones count, though it was never "removed"
    moved = dataclasses.replace(ha, uses=(dataclasses.replace(ha.uses[0], vfs=((2, bus(0, 2)),)),))
    assert taken([], [moved]) == {("rdma", 0): frozenset({bus(0, 1), bus(0, 2)}),
                                  ("rdma", 1): frozenset({bus(1, 0)})}
    assert taken([]) == everything  # the ledger itself never changed


def test_a_device_naming_a_card_twice_keeps_the_first() -> None:
    """A Device CR listing one minor twice (a buggy agent): the first entry describes the card
    (as ``node_cards`` and Koordinator's cache read it), the second is ignored — never a
    second column, never the later entry's amounts."""
    twice = device("n", gpu(0, "80Gi"), gpu(0, "16Gi", health=False), gpu(1, "40Gi"))
    ledger = ledger_of([twice])
    assert ledger.minors("n", "gpu") == (0, 1)
    assert card(ledger, "n", 0)["total"] == (100, 100, 80 * GI)
    assert card(ledger, "n", 0)["healthy"]
    view = ledger.node_view("n", ["gpu"])
    assert [(c.minor, c.total) for c in view.cards["gpu"]] == \
        [(0, (100, 100, 80 * GI)), (1, (100, 100, 40 * GI))]
    assert [(t, m, dict(cap)) for t, m, cap in node_cards(twice)] == [
        ("gpu", 0, {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100,
                    "koordinator.sh/gpu-memory": 80 * GI}),
        ("gpu", 1, {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100,
                    "koordinator.sh/gpu-memory": 40 * GI}),
    ]
    verify(ledger)


# -- what the ledger reports to its readers: holdings, views, versions, counters -----------------


def test_a_holding_says_where_it_came_from_and_carries_its_text() -> None:
    """A bound pod's holding is the cluster's (source ``annotation``) and carries the text it
    was read from, which is how a repeated event is recognised without decoding it; a
    reservation made without the text PreBind will write carries none."""
    ledger = ledger_of([gpus("n", 2)])
    ledger.apply_change(Change("Pod", None, bound(gpu_pod("p", {}).uid("u1"), "n", HALF)))
    pods = ledger.holding("u1")
    assert pods is not None and (pods.source, pods.annotation) == (ANNOTATION, HALF)
    ours = ledger.reserve("u2", "n", [dataclasses.replace(HALF_USE, minor=0)])
    assert (ours.source, ours.annotation) == (RESERVED, "")
    assert ledger.snapshot_state()["holders"]["u1"][1] == ANNOTATION


@pytest.mark.parametrize(
    "empty", ["{}", '{"gpu":[]}', '{"xpu":[{"minor":0,"resources":{"x":"1"}}]}']
)
@pytest.mark.parametrize("before", ["bound", "reserved"])
def test_an_allocation_naming_no_card_releases_what_the_pod_held(empty: str, before: str) -> None:
    """A valid ``device-allocated`` that names no tracked card: the pod holds nothing, whether
    it held cards by an earlier text or by a reservation of ours."""
    ledger = ledger_of([gpus("n", 2)])
    pod = gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u1")
    if before == "bound":
        ledger.apply_change(Change("Pod", None, bound(pod, "n", HALF)))
    else:
        ledger.reserve("u1", "n", [HALF_USE], HALF)
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    emptied = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u1"), "n", empty)
    ledger.apply_change(Change("Pod", None, emptied))
    assert used(ledger, "n", 1) == IDLE and ledger.holding("u1") is None
    assert ledger.holdings_on("n") == []
    verify(ledger)


def test_releasing_one_holding_keeps_the_others_of_the_node() -> None:
    ledger = ledger_of([gpus("n", 2)])
    first = ledger.reserve("a", "n", [HALF_USE])
    second = ledger.reserve("b", "n", [dataclasses.replace(HALF_USE, minor=0)])
    assert ledger.holdings_on("n") == [first, second]
    ledger.unreserve(first)
    assert ledger.holdings_on("n") == [second]
    ledger.unreserve(second)
    assert ledger.holdings_on("n") == []
    verify(ledger)


def test_a_reservation_of_an_untracked_device_type_counts_the_rest() -> None:
    """Uses of a device type the ledger does not track are skipped, never the ones after."""
    ledger = ledger_of([gpus("n", 2)])
    held = ledger.reserve("u", "n", [CardUse.of("xpu", 0, {"x": 1}), HALF_USE])
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    assert list(ledger.snapshot_state()["nodes"]["n"]["cards"]) == ["gpu"]
    ledger.unreserve(held)
    assert used(ledger, "n", 1) == IDLE


def test_a_device_update_naming_another_node_moves_the_description() -> None:
    """An update whose old and new Device name different nodes: the old node has no Device
    any more, its idle cards are gone, the new one has its cards."""
    ledger = ledger_of([gpus("a", 2)])
    ledger.apply_change(Change("Device", gpus("a", 2), gpus("b", 1)))
    assert not ledger.has_device("a") and ledger.has_device("b")
    assert ledger.minors("a", "gpu") == () and ledger.minors("b", "gpu") == (0,)
    assert list(ledger.snapshot_state()["nodes"]) == ["b"]
    verify(ledger)


def test_node_views_name_their_node_and_count_only_its_holdings() -> None:
    """What-if lists may mix nodes: only the viewed node's holdings count, wherever they are
    in the list; a node with cards held but no Device says so."""
    on_n = bound(gpu_pod("p", {}).uid("pn"), "n", HALF)
    on_m = bound(gpu_pod("q", {}).uid("pm"), "m", HALF)
    ledger = ledger_of([gpus("n", 2), gpus("m", 2)], [on_n, on_m])
    hn, hm = ledger.holding("pn"), ledger.holding("pm")
    assert hn is not None and hm is not None
    view = ledger.node_view("n", ["gpu"])
    assert (view.name, view.has_device, dict(view.vfs_taken)) == ("n", True, {})
    assert [c.free for c in view.cards["gpu"]] == [WHOLE80, (50, 50, 40 * GI)]
    without = ledger.node_view("n", ["gpu"], removed=[hm, hn])
    assert [c.free for c in without.cards["gpu"]] == [WHOLE80, WHOLE80]
    incoming = Holding("new", "n", (dataclasses.replace(HALF_USE, minor=0),))
    more = ledger.node_view("n", ["gpu"], added=[hm, incoming])
    assert [c.free for c in more.cards["gpu"]] == [(50, 50, 40 * GI)] * 2
    ledger.reserve("u", "gone", [HALF_USE])
    orphan = ledger.node_view("gone", ["gpu"])
    assert (orphan.name, orphan.has_device) == ("gone", False)
    assert [(c.minor, c.exists) for c in orphan.cards["gpu"]] == [(1, False)]
    assert ledger.node_view("nowhere", ["gpu"]).cards == {"gpu": ()}


def test_views_list_held_vfs_only_while_the_node_declares_vf_groups() -> None:
    """``vfs_taken`` covers SR-IOV cards: once the Device no longer declares VF groups the
    node's views list none (though a pod's text still names one), and again once it does."""
    with_vfs = device("n", nic("rdma", 0, vfs=2))
    ledger = ledger_of([with_vfs], [_vf_pod("a", "n", 0, 1)])
    listed = {("rdma", 0): frozenset({vf_bus(0, 1)})}
    assert dict(ledger.node_view("n", ["rdma"]).vfs_taken) == listed
    plain = device("n", nic("rdma", 0))
    ledger.apply_change(Change("Device", with_vfs, plain))
    assert dict(ledger.node_view("n", ["rdma"]).vfs_taken) == {}
    ledger.apply_change(Change("Device", plain, with_vfs))
    assert dict(ledger.node_view("n", ["rdma"]).vfs_taken) == listed
    verify(ledger)


def test_rows_and_card_columns_grow_by_doubling_and_keep_every_row_version() -> None:
    """The module's contract: rows and card columns grow by doubling from the capacity asked
    for (readers rebuild their per-row caches whenever ``row_capacity`` changes, so it must
    change only log(n) times), and ``row_version`` stays an int64 vector of ``row_capacity``
    that keeps every row's version across a growth."""
    ledger = NodeDeviceLedger(rows=1, cards=1)
    rows, columns = [], []
    versions: dict[str, int] = {}
    for i in range(5):
        node = f"n{i}"
        ledger.apply_change(Change("Device", None, gpus(node, i + 1)))
        rows.append(ledger.row_capacity)
        columns.append(ledger.table("gpu").cards)
        assert ledger.row_version.dtype == np.int64
        assert len(ledger.row_version) == ledger.row_capacity
        versions[node] = ledger.tick
        assert {n: int(ledger.row_version[ledger.row_of(n) or 0]) for n in versions} == versions
    assert rows == [1, 2, 4, 4, 8]
    assert columns == [1, 2, 4, 4, 8]
    verify(ledger)
    # a held card that no Device lists takes the next column, doubling only when full
    ledger = NodeDeviceLedger(rows=1, cards=1)
    ledger.apply_change(Change("Device", None, gpus("n", 1)))
    ledger.reserve("u", "n", [dataclasses.replace(HALF_USE, minor=7)])
    assert ledger.minors("n", "gpu") == (0, 7) and ledger.table("gpu").cards == 2
    verify(ledger)


def test_a_change_stamps_only_its_row_and_only_a_new_row_changes_the_node_set() -> None:
    """Readers cache per row by ``row_version`` and per node set by ``node_set_generation``:
    a change moves only its own row's version, and only a node getting a row moves the
    generation."""
    ledger = ledger_of([gpus("a", 2), gpus("b", 2)])
    a, b = ledger.row_of("a"), ledger.row_of("b")
    assert a is not None and b is not None
    generation, before = ledger.node_set_generation, ledger.row_version.copy()
    ledger.reserve("u", "a", [HALF_USE])
    assert int(ledger.row_version[a]) == ledger.tick > int(before[a])
    assert int(ledger.row_version[b]) == int(before[b])
    assert ledger.node_set_generation == generation
    seen = {generation}
    for node in ("c", "d"):  # a reservation, then a Device, each on a new node
        if node == "c":
            ledger.reserve("v", node, [HALF_USE])
        else:
            ledger.apply_change(Change("Device", None, gpus(node, 1)))
        assert ledger.node_set_generation not in seen
        seen.add(ledger.node_set_generation)


def test_annotation_errors_add_up_across_pods_and_devices() -> None:
    ledger = ledger_of([gpus("n", 2)])
    ledger.apply_change(Change("Pod", None, bound(gpu_pod("p", {}), "n", "not json")))
    assert ledger.annotation_errors == 1
    bad = device("n", gpu(0), gpu(1), annotations={ANNOTATION_GPU_TOPOLOGY: "{"})
    ledger.apply_change(Change("Device", gpus("n", 2), bad))
    assert ledger.annotation_errors == 2
    ledger.apply_change(Change("Device", bad, gpus("n", 2)))  # a clean Device adds nothing
    assert ledger.annotation_errors == 2


def test_without_a_reporter_an_invalid_annotation_is_only_logged() -> None:
    ledger = ledger_of([gpus("n", 2)])
    with capture_logs() as logs:
        ledger.apply_change(Change("Pod", None, bound(gpu_pod("p", {}), "n", _one(f'{C}:"-1"'))))
    assert used(ledger, "n", 0) == WHOLE80
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("invalid device allocation on a bound pod: its cards count as fully used", "warning")
    ]


def test_an_unhealthy_configmap_with_bad_entries_says_which_and_what_it_honours() -> None:
    """The operator's only signal that entries were skipped: one warning naming the
    ConfigMap, the entries skipped and the cards taken away; a clean one says nothing."""
    ledger = ledger_of([gpus("n", 3)])
    marks = UnhealthyGPUs("n", frozenset({2, 0}), ("gpus: 'x' is not a card index",))
    with capture_logs() as logs:
        ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, None, marks))
    assert [card(ledger, "n", m)["healthy"] for m in range(3)] == [False, True, False]
    assert logs == [{
        "event": "entries of an unhealthy-gpu ConfigMap that are not card indexes are "
                 "skipped; the others are honoured",
        "log_level": "warning", "configmap": "kube-system/unhealthy-gpu-n",
        "problems": ["gpus: 'x' is not a card index"], "unhealthy": [0, 2],
    }]
    clean = UnhealthyGPUs("n", frozenset({1}))
    with capture_logs() as quiet:
        ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, marks, clean))
        ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, marks, None))
    assert quiet == []
    assert [card(ledger, "n", m)["healthy"] for m in range(3)] == [True, True, True]
    verify(ledger)


# ---------------------------------------------------------------------------------------------
# Property: random sequences of device updates, reserves, unreserves, binds and deletions.

NODES = ["n0", "n1", "n2"]
MINORS = range(5)
REQUESTS: list[dict[str, Any]] = [
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory": "4Gi"},
    {"koordinator.sh/gpu-memory": "10Gi"},
    {"koordinator.sh/gpu.shared": 2, "koordinator.sh/gpu-memory-ratio": 60},
    {"koordinator.sh/rdma": 30},
]


def _device(node: str, present: frozenset[int], sick: frozenset[int],
            kubelet: frozenset[int] = frozenset()) -> Device:
    cards = [gpu(m, f"{(16, 40, 80)[(NODES.index(node) + m) % 3]}Gi", health=m not in sick)
             for m in sorted(present)]
    cards += [nic("rdma", m, health=m not in sick) for m in sorted(present) if m < 2]
    annotations = None
    if kubelet:
        entries = [PodDeviceEntry("kubelet-pod", "c", "nvidia.com/gpu",
                                  tuple(f"GPU-{m}" for m in sorted(kubelet)))]
        annotations = {ANNOTATION_DEVICES_CHECKPOINTS: encode_devices_checkpoints(entries)}
    return device(node, *cards, annotations=annotations)


ops = st.one_of(
    st.tuples(st.just("device"), st.sampled_from(NODES), st.frozensets(st.sampled_from(MINORS)),
              st.frozensets(st.sampled_from(MINORS)), st.frozensets(st.sampled_from(MINORS))),
    st.tuples(st.just("repeat"), st.integers(0, 7)),
    st.tuples(st.just("delete_device"), st.sampled_from(NODES)),
    st.tuples(st.just("reserve"), st.integers(0, 7), st.sampled_from(NODES),
              st.integers(0, len(REQUESTS) - 1)),
    st.tuples(st.just("unreserve"), st.integers(0, 7)),
    st.tuples(st.just("bind"), st.integers(0, 7)),
    st.tuples(st.just("delete_pod"), st.integers(0, 7)),
    st.tuples(st.just("terminal"), st.integers(0, 7)),
    st.tuples(st.just("malformed"), st.integers(0, 7), st.sampled_from(NODES)),
    st.tuples(st.just("hostile"), st.integers(0, 7), st.sampled_from(NODES),
              st.sampled_from(MINORS), st.sampled_from(range(4))),
)
HOSTILE_TEXTS = (  # by minor: negative, beyond a card, zero, named twice
    lambda m: _one(f'{C}:"-100",{R}:"-100"', minor=str(m)),
    lambda m: _one(f'{C}:"100",{M}:"1e30"', minor=str(m)),
    lambda m: _one(f'{C}:"0"', minor=str(m)),
    lambda m: f'{{"gpu":[{{"minor":{m},"resources":{{{C}:"10"}}}},'
              f'{{"minor":{m},"resources":{{{C}:"10"}}}}]}}',
)


def _hostile_cards(pods: Any, devices: dict[str, Device]) -> set[tuple[str, str, int]]:
    """The cards pods with an invalid annotation hold whole: not ours to keep within total."""
    out: set[tuple[str, str, int]] = set()
    for pod in pods:
        reading = read_allocations(pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED, "{}"))
        d = devices.get(pod.node_name)
        if reading.unreadable and d is not None:
            out |= {(pod.node_name, t, m) for t, m, _ in node_cards(d)}
        out |= {(pod.node_name, t, m) for t, m in reading.whole}
    return out


class _Model:
    """The cluster the ledger watches, plus our open reservations."""

    def __init__(self) -> None:
        self.ledger = NodeDeviceLedger(rows=1, cards=1)
        self.devices: dict[str, Device] = {}
        self.pods: dict[str, Pod] = {}
        self.reserved: dict[str, tuple[Pod, Holding]] = {}
        self.scorer = Scorer()
        self.versions: dict[str, tuple[int, Any]] = {}

    def emit(self, kind: str, old: Any, new: Any) -> None:
        self.ledger.apply_change(Change(kind, old, new))

    def step(self, op: tuple[Any, ...]) -> None:
        name = op[0]
        if name == "device":
            d = _device(op[1], op[2], op[3], op[4])
            self.emit("Device", self.devices.get(op[1]), d)
            self.devices[op[1]] = d
        elif name == "delete_device" and op[1] in self.devices:
            self.emit("Device", self.devices.pop(op[1]), None)
        elif name == "reserve":
            self._reserve(f"p{op[1]}", op[2], REQUESTS[op[3]])
        elif name == "unreserve" and f"p{op[1]}" in self.reserved:
            _, holding = self.reserved.pop(f"p{op[1]}")
            self.ledger.unreserve(holding)
        elif name == "bind" and f"p{op[1]}" in self.reserved:
            self._bind(f"p{op[1]}")
        elif name == "delete_pod":
            reserved = self.reserved.pop(f"p{op[1]}", None)
            if reserved is not None:  # deleted while its bind is in flight
                self.emit("Pod", reserved[0], None)
            pod = self.pods.pop(f"default/p{op[1]}", None)
            if pod is not None:
                self.emit("Pod", pod, None)
        elif name == "terminal" and f"default/p{op[1]}" in self.pods:
            old = self.pods[f"default/p{op[1]}"]
            new = dataclasses.replace(old, phase="Succeeded")
            self.pods[old.key] = new
            self.emit("Pod", old, new)
        elif name == "repeat" and f"default/p{op[1]}" in self.pods:
            # The same pod event again (a relist, a resync): idempotent by uid.
            before = self.ledger.snapshot_state()
            pod = self.pods[f"default/p{op[1]}"]
            self.emit("Pod", pod, pod)
            assert self.ledger.snapshot_state() == before
        elif name in ("malformed", "hostile") and f"p{op[1]}" not in self.reserved:
            text = '{"gpu":3}' if name == "malformed" else HOSTILE_TEXTS[op[4]](op[3])
            pod = bound(gpu_pod(f"p{op[1]}", {"nvidia.com/gpu": 1}), op[2], text)
            self.emit("Pod", self.pods.get(pod.key), pod)
            self.pods[pod.key] = pod

    def _reserve(self, name: str, node: str, requests: dict[str, Any]) -> None:
        if name in self.reserved or f"default/{name}" in self.pods:
            return
        pod = gpu_pod(name, requests).build()
        request = parse_request(pod)
        assert request is not None
        view = self.ledger.node_view(node, request.device_types)
        uses = allocate(view, request, self.scorer)
        if isinstance(uses, list):
            holding = self.ledger.reserve(pod.uid, node, uses)
            self.reserved[name] = (pod, holding)
            for use in uses:  # what we took fitted: no card is over-committed
                c = card(self.ledger, node, use.minor, use.device_type)
                assert all(u <= t for u, t in zip(c["used"], c["total"], strict=True)), c

    def _bind(self, name: str) -> None:
        pod, holding = self.reserved.pop(name)
        allocations: dict[str, list[DeviceAllocation]] = {}
        for use in holding.uses:
            allocations.setdefault(use.device_type, []).append(
                DeviceAllocation.from_ints(use.minor, dict(use.resources)))
        text = encode_allocations(allocations)
        raw = dict(pod.raw)
        raw["metadata"] = {**raw["metadata"],
                           "annotations": {ANNOTATION_DEVICE_ALLOCATED: text}}
        raw["spec"] = {**raw["spec"], "nodeName": holding.node}
        from apis.core import decode_pod

        new = decode_pod(raw)
        self.pods[new.key] = new
        self.emit("Pod", None, new)

    def check(self) -> None:
        verify(self.ledger)
        state = self.ledger.snapshot_state()
        kubelet = {(n, u.device_type, u.minor) for n, _, uses in state["checkpoints"].values()
                   for u in uses}
        kubelet |= _hostile_cards(self.pods.values(), self.devices)
        for name, node in state["nodes"].items():
            row = self.ledger.row_of(name)
            assert row is not None
            # Readers cache per row: a row whose picture changed has a new version.
            seen = self.versions.get(name)
            if seen is not None and seen[1] != node:
                assert int(self.ledger.row_version[row]) != seen[0], name
            self.versions[name] = (int(self.ledger.row_version[row]), node)
            for device_type, cards in node["cards"].items():
                for minor, c in cards.items():
                    # A card the kubelet (or a hostile annotation) took under one of our
                    # pods is the world's over-commit, not ours (``_reserve`` checks what
                    # we take).
                    if c["healthy"] and (name, device_type, minor) not in kubelet:
                        assert all(u <= t for u, t in zip(c["used"], c["total"], strict=True)), c
                        assert all(u + f == t for u, f, t in
                                   zip(c["used"], c["free"], c["total"], strict=True)), c
        reservations = [h for _, h in self.reserved.values()]
        assert all(h.source == RESERVED for h in reservations)
        rebuilt = NodeDeviceLedger.replay(self.devices.values(), self.pods.values(), reservations)
        assert rebuilt.snapshot_state() == state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=40))
def test_random_sequences_keep_invariants(sequence: list[tuple[Any, ...]]) -> None:
    model = _Model()
    for op in sequence:
        model.step(op)
        model.check()


# -- the node's GPU meta: interconnect, partition table, policy ---------------------------------


def test_node_meta_is_decoded_once_per_device_and_follows_it() -> None:
    topo = pairs_topology(4)
    crd = topology_node("n", 4, topo, hopper_table(4), POLICY_HONOR)
    ledger = ledger_of([crd, gpus("plain", 2)])
    row = ledger.row_of("n")
    meta = ledger.node_meta("n")
    assert meta.gpu_topology == topo and meta.honor_partitions
    assert meta.partitions == hopper_table(4)
    assert ledger.node_view("n", ("gpu",)).meta is meta
    assert ledger.topology_rows == ledger.table_rows == ledger.honor_rows == {row}
    assert ledger.node_meta("plain") == NodeMeta() and not ledger.node_meta("missing").gpu_topology
    # The Device drops its table and label: the node follows; deleted: nothing is left.
    ledger.apply_change(Change("Device", crd, topology_node("n", 4, topo)))
    assert ledger.table_rows == ledger.honor_rows == set() and ledger.topology_rows == {row}
    ledger.apply_change(Change("Device", crd, None))
    assert ledger.topology_rows == set() and ledger.node_meta("n") == NodeMeta()


def test_malformed_topology_and_table_are_counted_and_ignored() -> None:
    crd = device(
        "n", gpu(0),
        annotations={
            ANNOTATION_GPU_TOPOLOGY: "{",
            ANNOTATION_GPU_PARTITIONS: '{"2":[{"minors":[0]}]}',
        },
    )
    ledger = ledger_of([crd])
    assert ledger.annotation_errors == 2
    assert ledger.node_meta("n") == NodeMeta()
    assert ledger.topology_rows == ledger.table_rows == set()


@given(
    st.integers(1, 3).flatmap(
        lambda n_res: st.tuples(
            st.just(n_res),
            st.lists(st.integers(0, 200), min_size=n_res * 8, max_size=n_res * 8),
            st.lists(st.integers(0, 300), min_size=n_res * 8, max_size=n_res * 8),
            st.lists(st.integers(0, 300), min_size=n_res * 8, max_size=n_res * 8),
            st.sets(st.integers(0, 7), min_size=1),
        )
    )
)
def test_refreshing_only_the_changed_cards_equals_the_full_refresh(
    case: tuple[int, list[int], list[int], list[int], set[int]],
) -> None:
    """``_Table.refresh_used`` (a holding's cards, totals unchanged) leaves free, share and the
    row's sums exactly as the general ``refresh`` does."""
    n_res, totals, used_before, used_after, changed = case
    tables = [_Table(n_res, 2, 8) for _ in range(2)]
    for tbl in tables:
        tbl.total[:, 1, :] = np.array(totals).reshape(n_res, 8)
        tbl.used[:, 1, :] = np.array(used_before).reshape(n_res, 8)
        tbl.refresh(1, range(8))
        for col in changed:
            tbl.used[:, 1, col] = np.array(used_after).reshape(n_res, 8)[:, col]
    full, fast = tables
    full.refresh(1, sorted(changed))
    fast.refresh_used(1, sorted(changed))
    for name in ("free", "share", "sum_total", "sum_alloc"):
        assert np.array_equal(getattr(full, name), getattr(fast, name)), name
