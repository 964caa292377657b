"""``allocate_plain`` (Reserve's fast path, read from the ledger's row) == ``allocate`` (the
reference, over ``node_view``): same cards, same amounts, same order, same Status — on random
ledgers, requests and scorers, and on hand-built tie-breaks."""

# Equivalent mutants (make mutation MODULE=scheduler/devices/allocator.py):
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_40
#   `request.hints.get(gpu)` -> `.get(None)` (scope ""): plain_gpu_request lets only a scope of
#   "" or Node through, and both require a level (0, 1) no scope of the tree is below.
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_41
#   scope -> None: level 0 (TOPOLOGY_SCOPE_LEVEL.get), as _by_scope_tree__mutmut_40.
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_42
#   scope always "": as _by_scope_tree__mutmut_40.
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_45
#   no hint: scope "XXXX" (level 0) instead of "" (level 0).
# mutmut-equivalent: scheduler.devices.allocator.x__by_scope_tree__mutmut_52
#   scope None passed to choose_minors: level 0, as _by_scope_tree__mutmut_40.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate_plain__mutmut_15
#   `row is None or not minors` -> `and`: a node without a row has no minors, and a row
#   without GPU columns fails the `any(exists)` test just below with the same Status.
# mutmut-equivalent: scheduler.devices.allocator.x_allocate_plain__mutmut_34
#   `exists and healthy` -> `exists or healthy`: an existing unhealthy card has total and so
#   free 0, and gpu_amounts refuses it for every request parse_request builds (ratio >= 1, or
#   memory on a card of 0 bytes); healthy implies exists (table.lay_out).
# mutmut-equivalent: scheduler.devices.allocator.x_plain_gpu_request__mutmut_9
#   `count <= 0` -> `count < 0`: a GPU TypeRequest's count is at least 1 (gpu_split; count 0,
#   ApplyForAll, exists only for NICs and FPGAs).

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from apis.device import Device
from apis.hints import ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
from apis.partition import (
    ANNOTATION_GPU_PARTITION_SPEC,
    ANNOTATION_GPU_PARTITIONS,
    LABEL_GPU_PARTITION_POLICY,
)
from apis.resources import DEVICE_GPU, FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from apis.topology import ANNOTATION_GPU_TOPOLOGY, GPUTopology
from scheduler.devices.allocator import allocate, allocate_plain, plain_gpu_request
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import CardUse, DeviceRequest, RequestError, parse_request
from scheduler.devices.scoring import Scorer
from scheduler.framework.events import Change
from scheduler.framework.plugin_args import LEAST_ALLOCATED, MOST_ALLOCATED
from scheduler.framework.status import Code, Status
from scheduler.plugins.deviceshare.args import DeviceShareArgs
from tests.unit.devices.helpers import (
    GI,
    device,
    gpu,
    gpu_pod,
    hopper_table,
    ledgers,
    nic,
    nvlink,
    pairs_topology,
    pcie_link,
)

CORE, RATIO, MEM = GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY
SHARED, NVIDIA, KOORD = "koordinator.sh/gpu.shared", "nvidia.com/gpu", "koordinator.sh/gpu"
HINT, JOINT = ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
U, R = Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def both(ledger: NodeDeviceLedger, node: str, request: DeviceRequest, scorer: Scorer
         ) -> tuple[list[CardUse] | Status | None, list[CardUse] | Status]:
    fast = allocate_plain(ledger, node, request, scorer)
    ref = allocate(ledger.node_view(node, request.device_types), request, scorer)
    return fast, ref


def same(fast: list[CardUse] | Status, ref: list[CardUse] | Status) -> None:
    assert fast == ref
    if isinstance(ref, Status):
        assert isinstance(fast, Status)
        assert (fast.code, fast.message) == (ref.code, ref.message)


# ---------------------------------------------------------------------------------------------
# Random ledgers: cards with random totals (0 included), health, holdings (over-commit
# included), cards held but missing from the Device CR; random node meta.

MEMORIES = st.one_of(
    st.sampled_from(["0", "100", "16Gi", "40Gi", "80Gi"]),
    st.integers(1, 100 * GI).map(str),
)
card_spec = st.fixed_dictionaries({
    "core": st.sampled_from([0, 50, 100, 200]),
    "ratio": st.sampled_from([0, 100, 100, 100, 50]),
    "memory": MEMORIES,
    "healthy": st.sampled_from([True, True, True, False]),
})
use_spec = st.fixed_dictionaries(
    {},
    optional={
        CORE: st.one_of(st.integers(0, 50), st.integers(0, 120)),
        RATIO: st.one_of(st.integers(0, 50), st.integers(0, 120)),
        MEM: st.one_of(st.integers(0, 16 * GI), st.integers(0, 90 * GI)),
    },
)
META = st.sampled_from(["none", "topology", "table", "honor", "honor+table"])


def gpu_card(minor: int, spec: dict[str, Any], topology: bool = True) -> dict[str, Any]:
    card = gpu(minor, spec["memory"], health=spec["healthy"], core=spec["core"],
               pcie=f"pci{minor // 2}" if topology else None, numa=minor // 4)
    card["resources"]["koordinator.sh/gpu-memory-ratio"] = str(spec["ratio"])
    return card


@st.composite
def random_node(draw: st.DrawFn) -> tuple[NodeDeviceLedger, str]:
    """A ledger whose node ``n`` has random GPUs (and maybe NICs), holdings and meta."""
    ledger = NodeDeviceLedger(rows=1, cards=1)
    minors = draw(st.lists(st.integers(0, 11), max_size=9, unique=True))
    # Every card with topology (Koordinator's scope tree chooses), or some without.
    with_topology = draw(st.booleans())
    cards = [gpu_card(m, draw(card_spec), with_topology or draw(st.booleans())) for m in minors]
    cards += [nic("rdma", m) for m in range(draw(st.integers(0, 1)))]
    meta = draw(META)
    annotations: dict[str, str] = {}
    labels: dict[str, str] = {}
    if meta == "topology":
        annotations[ANNOTATION_GPU_TOPOLOGY] = pairs_topology(8).encode()
    if meta.endswith("table"):
        annotations[ANNOTATION_GPU_PARTITIONS] = hopper_table(8).encode()
    if meta.startswith("honor"):
        labels[LABEL_GPU_PARTITION_POLICY] = "Honor"
    dev = Device.from_dict({
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "n", "annotations": annotations, "labels": labels},
        "spec": {"devices": cards},
    })
    ledger.apply_change(Change("Device", None, dev))
    held = draw(st.lists(st.tuples(st.integers(0, 13), use_spec), max_size=6))
    for i, (minor, amounts) in enumerate(held):
        ledger.reserve(f"u{i}", "n", [CardUse.of(DEVICE_GPU, minor, amounts)])
    if draw(st.booleans()):
        ledger.apply_change(Change("Device", dev, dev))  # rebuild: columns by minor again
    return ledger, "n"


PERCENT = st.one_of(st.integers(1, 100), st.integers(1, 100), st.sampled_from([200, 800]))


@st.composite
def gpu_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A valid GPU request of every shape Koordinator accepts (shared and whole, 1-8 cards)."""
    shape = draw(st.sampled_from(
        ["nvidia", "koord", "ratio", "core+ratio", "memory", "core+memory", "shared"]))
    if shape == "nvidia":
        return {NVIDIA: draw(st.integers(1, 8))}
    if shape == "koord":
        return {KOORD: draw(PERCENT)}
    if shape == "ratio":
        return {RATIO: draw(PERCENT)}
    if shape == "core+ratio":
        return {CORE: draw(PERCENT), RATIO: draw(PERCENT)}
    memory = draw(st.one_of(st.integers(1, 90 * GI), st.integers(1, 20 * GI),
                            st.sampled_from([4 * GI, 16 * GI])))
    if shape == "memory":
        return {MEM: memory}
    if shape == "core+memory":
        return {CORE: draw(PERCENT), MEM: memory}
    count = draw(st.integers(1, 8))
    out: dict[str, Any] = {SHARED: count}
    if draw(st.booleans()):
        out[CORE] = count * draw(st.integers(1, 100))
    if draw(st.booleans()):
        out[RATIO] = count * draw(st.integers(1, 100))
    else:
        out[MEM] = count * draw(st.integers(1, 40 * GI))
    return out


EXTRAS = st.sampled_from([
    *[{}] * 8,
    {HINT: '{"gpu":{"requiredTopologyScope":"Node"}}'},
    {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'},
    {HINT: '{"gpu":{"selector":{"matchLabels":{"a":"b"}}}}'},
    {HINT: '{"rdma":{"allocateStrategy":"ApplyForAll"}}'},
    {ANNOTATION_GPU_PARTITION_SPEC: '{"allocatePolicy":"BestEffort"}'},
    {JOINT: '{"deviceTypes":["gpu","rdma"]}'},
])
OTHER_REQUESTS = st.sampled_from([
    *[{}] * 8, {"koordinator.sh/rdma": 50}, {"aliyun.com/gpu-mem": 3},
])

GPU_WEIGHTS = st.lists(
    st.tuples(st.sampled_from([CORE, RATIO, MEM, RDMA, FPGA]), st.integers(1, 100)),
    min_size=1, max_size=5, unique_by=lambda rw: rw[0],
)
scorers = st.builds(
    lambda strategy, weights: Scorer(DeviceShareArgs(strategy, tuple(weights))),
    st.sampled_from([LEAST_ALLOCATED, MOST_ALLOCATED]),
    GPU_WEIGHTS,
)


def covered(request: DeviceRequest, honor_or_table: bool, scope_tree_only: bool) -> bool:
    """The requests the fast path must answer (independent of ``plain_gpu_request``)."""
    if request.device_types != (DEVICE_GPU,) or request.joint_types or request.gpushare_units:
        return False
    hint = request.hints.get(DEVICE_GPU)
    if hint is not None and (hint.selector is not None
                             or hint.required_topology_scope not in ("", "Node")):
        return False
    treq = request.types[0]
    if treq.shared:
        return True
    whole_ok = treq.count == 1 or scope_tree_only  # several: where the scope tree chooses
    return whole_ok and request.partition is None and not honor_or_table


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_node(), gpu_requests(), OTHER_REQUESTS, EXTRAS, scorers)
def test_fast_path_equals_allocate(node: tuple[NodeDeviceLedger, str], gpu_req: dict[str, Any],
                                   other: dict[str, Any], extras: dict[str, str],
                                   scorer: Scorer) -> None:
    ledger, name = node
    requests = {**gpu_req, **other}
    try:
        request = parse_request(gpu_pod("p", requests, extras).build())
    except RequestError:
        assume(False)
        return
    assert request is not None
    fast, ref = both(ledger, name, request, scorer)
    meta = ledger.node_meta(name)
    scope_tree_only = meta.gpu_scope_tree and not meta.gpu_topology
    if covered(request, meta.honor_partitions or meta.partitions is not None, scope_tree_only):
        assert fast is not None
    event("fell back" if fast is None else "cards" if isinstance(fast, list)
          else f"status {fast.code.label}")
    if fast is not None:
        same(fast, ref)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(), gpu_requests(), scorers)
def test_fast_path_equals_allocate_on_every_node(ledger: NodeDeviceLedger,
                                                 gpu_req: dict[str, Any],
                                                 scorer: Scorer) -> None:
    """The shared property ledgers (several nodes, bound pods' annotations), and a node the
    ledger has no row for."""
    request = parse_request(gpu_pod("p", gpu_req).build())
    assert request is not None
    for name in [*(ledger.node_name(r) for r in range(ledger.n_rows)), "absent"]:
        fast, ref = both(ledger, name, request, scorer)
        if plain_gpu_request(request, ledger.node_meta(name)) is None:
            assert fast is None
            continue
        assert fast is not None
        same(fast, ref)


# ---------------------------------------------------------------------------------------------
# Tie-breaks and statuses, by hand.

SPREAD = Scorer(DeviceShareArgs(LEAST_ALLOCATED))
BINPACK = Scorer(DeviceShareArgs(MOST_ALLOCATED))
CORE_ONLY = Scorer(DeviceShareArgs(LEAST_ALLOCATED, ((CORE, 1),)))


def use(minor: int, core: int, ratio: int, memory: int) -> CardUse:
    return CardUse.of(DEVICE_GPU, minor, {CORE: core, RATIO: ratio, MEM: memory})


CASES: list[Any] = [
    pytest.param([gpu(0), gpu(1)], [], {NVIDIA: 1}, SPREAD, [0], id="idle-tie-lowest-minor"),
    pytest.param([gpu(3), gpu(1), gpu(2)], [], {CORE: 50, RATIO: 50}, BINPACK, [1],
                 id="binpack-idle-tie-lowest-minor"),
    pytest.param([gpu(0), gpu(1)], [use(0, 50, 50, 40 * GI)], {CORE: 50, RATIO: 50}, BINPACK,
                 [0], id="binpack-used-card"),
    pytest.param([gpu(0), gpu(1)], [use(0, 50, 50, 40 * GI)], {CORE: 50, RATIO: 50}, SPREAD,
                 [1], id="spread-idle-card"),
    pytest.param([gpu(0), gpu(1), gpu(2)], [use(1, 50, 50, 40 * GI)],
                 {SHARED: 2, RATIO: 60}, BINPACK, [1, 0],
                 id="shared-two-in-rank-order-not-minor-order"),
    pytest.param([gpu(2, "16Gi"), gpu(1, "80Gi"), gpu(3, "40Gi")], [use(3, 10, 10, 4 * GI)],
                 {CORE: 50, RATIO: 50}, SPREAD, [1],
                 id="equal-score-different-cards-lowest-minor"),
    pytest.param([gpu(0, "16Gi"), gpu(1, "80Gi")], [], {MEM: "8Gi"}, SPREAD, [1],
                 id="memory-completes-to-a-lower-ratio-on-the-bigger-card"),
    pytest.param([gpu(0), gpu(1)], [use(0, 90, 0, 0)], {CORE: 20, RATIO: 20}, CORE_ONLY, [1],
                 id="weights-from-the-scorer"),
    pytest.param([gpu(0), gpu(1)], [use(0, 95, 0, 0), use(1, 0, 85, 0)], {RATIO: 20},
                 CORE_ONLY, [0], id="core-not-requested-is-not-checked"),
    pytest.param([gpu(0, health=False), gpu(1)], [], {NVIDIA: 1}, SPREAD, [1],
                 id="unhealthy-skipped"),
    pytest.param([gpu(0), gpu(1)], [use(0, 0, 0, 0), use(5, 10, 10, 0)], {NVIDIA: 1}, BINPACK,
                 [0], id="held-card-missing-from-the-cr-skipped"),
    pytest.param([gpu(0, "16")], [use(0, 62, 62, 11)], {RATIO: 38}, SPREAD,
                 (U, "Insufficient gpu devices"), id="memory-checked-after-completion"),
    pytest.param([gpu(0, "0")], [], {MEM: "1Gi"}, SPREAD, (U, "Insufficient gpu devices"),
                 id="no-memory-declared"),
    pytest.param([gpu(0), gpu(1)], [use(0, 100, 100, 80 * GI)], {SHARED: 2, RATIO: 100},
                 SPREAD, (U, "Insufficient gpu devices"), id="too-few-candidates"),
    pytest.param([nic("rdma", 0)], [], {NVIDIA: 1}, SPREAD,
                 (R, "Insufficient gpu devices"), id="no-gpu-on-the-node"),
    pytest.param([], [use(0, 10, 10, 0)], {NVIDIA: 1}, SPREAD,
                 (R, "Insufficient gpu devices"), id="only-held-cards-none-existing"),
]


@pytest.mark.parametrize(("cards", "held", "requests", "scorer", "want"), CASES)
def test_tie_breaks(cards: list[dict[str, Any]], held: list[CardUse], requests: dict[str, Any],
                    scorer: Scorer, want: Any) -> None:
    ledger = NodeDeviceLedger(rows=1, cards=1)
    ledger.apply_change(Change("Device", None, device("n", *cards)))
    for i, u in enumerate(held):
        ledger.reserve(f"u{i}", "n", [u])
    request = parse_request(gpu_pod("p", requests).build())
    assert request is not None
    fast, ref = both(ledger, "n", request, scorer)
    assert fast is not None
    same(fast, ref)
    if isinstance(fast, Status):
        assert (fast.code, fast.message) == want
    else:
        assert [u.minor for u in fast] == want


def test_unknown_node_is_unresolvable() -> None:
    ledger = NodeDeviceLedger()
    request = parse_request(gpu_pod("p", {NVIDIA: 1}).build())
    assert request is not None
    fast, ref = both(ledger, "nowhere", request, SPREAD)
    assert fast is not None
    same(fast, ref)
    assert isinstance(fast, Status) and fast.code == R


FALLBACKS: list[Any] = [
    pytest.param({NVIDIA: 2}, {}, id="several-whole-cards"),
    pytest.param({NVIDIA: 1, "koordinator.sh/rdma": 50}, {}, id="two-types"),
    pytest.param({"aliyun.com/gpu-mem": 2}, {}, id="gpushare-units"),
    pytest.param({NVIDIA: 1}, {HINT: '{"gpu":{"selector":{"matchLabels":{"a":"b"}}}}'},
                 id="selector"),
    pytest.param({CORE: 50, RATIO: 50}, {HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'},
                 id="scope"),
    pytest.param({NVIDIA: 1}, {ANNOTATION_GPU_PARTITION_SPEC: '{"allocatePolicy":"BestEffort"}'},
                 id="partition-spec-whole"),
    pytest.param({NVIDIA: 1, "koordinator.sh/rdma": 50},
                 {JOINT: '{"deviceTypes":["gpu","rdma"]}'}, id="joint"),
]


@pytest.mark.parametrize(("requests", "annotations"), FALLBACKS)
def test_falls_back(requests: dict[str, Any], annotations: dict[str, str]) -> None:
    ledger = NodeDeviceLedger()
    ledger.apply_change(Change("Device", None, device("n", gpu(0), gpu(1), nic("rdma", 0))))
    request = parse_request(gpu_pod("p", requests, annotations).build())
    assert request is not None
    assert allocate_plain(ledger, "n", request, SPREAD) is None


def test_falls_back_for_whole_cards_on_a_partitioned_node() -> None:
    ledger = NodeDeviceLedger()
    dev = device("n", *(gpu(m) for m in range(8)),
                 annotations={ANNOTATION_GPU_PARTITIONS: hopper_table(8).encode()})
    ledger.apply_change(Change("Device", None, dev))
    whole = parse_request(gpu_pod("p", {NVIDIA: 1}).build())
    shared = parse_request(gpu_pod("p", {CORE: 50, RATIO: 50}).build())
    assert whole is not None and shared is not None
    assert allocate_plain(ledger, "n", whole, SPREAD) is None
    fast, ref = both(ledger, "n", shared, SPREAD)
    assert fast is not None
    same(fast, ref)


def test_falls_back_for_several_whole_cards_where_the_interconnect_chooses() -> None:
    """NVLink joins cards on different PCIe switches (0-2, 1-3): ``allocate`` pairs 0 with its
    NVLink partner 2, where the scope tree would take 0 and 1 (one switch); the fast path,
    which knows only the scope tree, must leave the choice to ``allocate``."""
    topology = GPUTopology((
        nvlink(0, 2, 12, 300), nvlink(1, 3, 12, 300), pcie_link(0, 1, "Node"),
        pcie_link(2, 3, "Node"), pcie_link(0, 3, "Node"), pcie_link(1, 2, "Node"),
    ))
    ledger = NodeDeviceLedger()
    ledger.apply_change(Change("Device", None, device(
        "n", *(gpu(m, pcie=f"pci{m // 2}") for m in range(4)),
        annotations={ANNOTATION_GPU_TOPOLOGY: topology.encode()})))
    request = parse_request(gpu_pod("p", {NVIDIA: 2}).build())
    assert request is not None
    fast, ref = both(ledger, "n", request, SPREAD)
    assert fast is None
    assert isinstance(ref, list) and [u.minor for u in ref] == [0, 2]


@pytest.mark.parametrize("hint", [
    '{"gpu":{}}', '{"gpu":{"allocateStrategy":"ApplyForAll"}}',
    '{"gpu":{"requiredTopologyScope":"Node"}}',
])
@pytest.mark.parametrize("requests", [{NVIDIA: 1}, {RATIO: 50}], ids=["whole", "shared"])
def test_answers_with_a_gpu_hint_without_selector_or_scope(
    hint: str, requests: dict[str, Any]
) -> None:
    """A GPU hint that neither selects cards nor narrows the scope keeps Reserve's fast path."""
    ledger = NodeDeviceLedger()
    ledger.apply_change(Change("Device", None, device("n", gpu(0), gpu(1))))
    request = parse_request(gpu_pod("p", requests, {HINT: hint}).build())
    assert request is not None
    fast, ref = both(ledger, "n", request, SPREAD)
    assert fast is not None
    same(fast, ref)
