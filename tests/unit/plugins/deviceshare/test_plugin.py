"""DeviceShare's extension points: Filter/Reserve/PreBind on hand-built nodes, the golden
annotation, preemption overlays, the shared ledger, batch == per-node, and the real scheduler."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from apis.hints import ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.devices import ledger_of
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    ASSIGNED_POD_UPDATE,
    DEVICE_ADD,
    DEVICE_DELETE,
    DEVICE_UPDATE,
    NODE_ADD,
    Change,
)
from scheduler.framework.interfaces import Handle, PluginArgsError
from scheduler.framework.status import Code
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.deviceshare.args import parse_args
from scheduler.plugins.deviceshare.plugin import DeviceShare
from scheduler.plugins.nodeaffinity import NodeAffinity
from scheduler.plugins.nodeaffinity import parse_args as affinity_args
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from tests.builders import ManualClock, RecordingClient, make_node
from tests.unit.devices.helpers import (
    GI,
    bound,
    device,
    gpu,
    gpu_alloc,
    gpu_pod,
    gpus,
    info,
    ledgers,
    nic,
    plugin_of,
    prefilter,
    snapshot_of,
    verify,
)

GOLDEN_ID = "GPU-98583a5c-c155-9cf6-f955-03c189d3dbfb"
GOLDEN = ('{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50",'
          '"koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"},'
          f'"id":"{GOLDEN_ID}"}}]}}')
HALF = {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}


def test_factory_validates_args() -> None:
    handle = Handle(snapshot_of([]), RecordingClient(), ManualClock())
    with pytest.raises(PluginArgsError, match=r"scoringStrategy\.type"):
        new_deviceshare({"scoringStrategy": {"type": "Nope"}}, handle)


def test_profiles_share_one_ledger_and_one_handler() -> None:
    shared: dict[str, Any] = {}
    handlers: list[Callable[[Change], None]] = []
    plugins = [
        new_deviceshare({}, Handle(snapshot_of([]), RecordingClient(), ManualClock(), name,
                                   shared=shared, event_handlers=handlers))
        for name in ("a", "b")
    ]
    third = Handle(snapshot_of([]), RecordingClient(), ManualClock(), "c", shared=shared,
                   event_handlers=handlers)
    assert plugins[0].ledger is plugins[1].ledger is ledger_of(third)
    assert len(handlers) == 1


def test_an_invalid_annotation_gets_one_warning_however_many_profiles() -> None:
    """The ledger finds it (once per text); one reporter per scheduler writes the event."""
    shared: dict[str, Any] = {}
    handlers: list[Callable[[Change], None]] = []
    client = RecordingClient()
    for name in ("a", "b"):
        new_deviceshare({}, Handle(snapshot_of([]), client, ManualClock(), name,
                                   shared=shared, event_handlers=handlers))
    hostile = bound(gpu_pod("h", {}), "n", '{"gpu":[{"minor":0,"resources":'
                    '{"koordinator.sh/gpu-core":"-100"}}]}')
    for handler in handlers:
        handler(Change("Device", None, device("n", gpu(0, "16Gi"))))
        handler(Change("Pod", None, hostile))
        handler(Change("Pod", hostile, hostile))
    assert [(k, t, r) for k, t, r, _ in client.events] == [
        ("default/h", "Warning", "InvalidDeviceAllocation")]
    message = client.events[0][3]
    assert "negative amount -100" in message and "node n: gpu 0" in message


def test_events_to_register() -> None:
    plugin, _ = plugin_of([])
    assert set(plugin.events_to_register()) == {
        DEVICE_ADD, DEVICE_UPDATE, DEVICE_DELETE, ASSIGNED_POD_DELETE, ASSIGNED_POD_UPDATE,
        NODE_ADD}


def test_filter_reserve_prebind_golden_annotation() -> None:
    crd = device("n", gpu(0, "16Gi", uid=GOLDEN_ID), gpu(1, "16Gi"))
    plugin, snapshot = plugin_of([crd])
    pod = gpu_pod("p", HALF).build()
    state, status = prefilter(plugin, pod)
    assert status is None
    assert plugin.filter(state, pod, info(snapshot, "n")) is None
    assert plugin.reserve(state, pod, "n") is None
    assert plugin.pre_bind(state, pod, "n") is None
    assert state.bind_annotations == {ANNOTATION_DEVICE_ALLOCATED: GOLDEN}
    holding = plugin.ledger.holding(pod.uid)
    assert holding is not None and holding.node == "n"
    # The bind event carrying that very annotation counts once.
    plugin.ledger.apply_change(Change("Pod", None, bound(gpu_pod("p", HALF), "n", GOLDEN)))
    assert plugin.ledger.node_view("n", ["gpu"]).cards["gpu"][0].used == (50, 50, 8 * GI)


def test_unreserve_releases() -> None:
    plugin, _ = plugin_of([gpus("n", 1)])
    pod = gpu_pod("p", {"nvidia.com/gpu": 1}).build()
    state, _ = prefilter(plugin, pod)
    assert plugin.reserve(state, pod, "n") is None
    plugin.unreserve(state, pod, "n")
    assert plugin.ledger.holding(pod.uid) is None
    assert plugin.pre_bind(state, pod, "n") is not None  # nothing reserved any more
    assert plugin.reserve(state, pod, "n") is None
    plugin.unreserve(CycleState(), pod, "n")  # an expired assumed pod: no cycle state
    assert plugin.ledger.holding(pod.uid) is None


def test_reserve_fails_when_node_filled_meanwhile() -> None:
    plugin, _ = plugin_of([gpus("n", 1)])
    first, second = (gpu_pod(n, {"nvidia.com/gpu": 1}).build() for n in ("a", "b"))
    s1, _ = prefilter(plugin, first)
    s2, _ = prefilter(plugin, second)
    assert plugin.reserve(s1, first, "n") is None
    status = plugin.reserve(s2, second, "n")
    assert status is not None and status.reasons == ("Insufficient gpu devices",)


def test_pods_without_devices_skip_everything() -> None:
    plugin, snapshot = plugin_of([gpus("n", 1)])
    pod = gpu_pod("cpu", {}).build()
    state, status = prefilter(plugin, pod)
    assert status is not None and status.code == Code.SKIP
    pre_score = plugin.pre_score(state, pod, [])
    assert pre_score is not None and pre_score.code == Code.SKIP
    assert plugin.filter_nodes(state, pod, snapshot).all()
    assert plugin.reserve(state, pod, "n") is None
    assert plugin.pre_bind(state, pod, "n") is None
    assert state.bind_annotations == {}


def test_missing_state_is_an_error() -> None:
    plugin, snapshot = plugin_of([gpus("n", 1)])
    pod = gpu_pod("p", HALF).build()
    status = plugin.filter(CycleState(), pod, info(snapshot, "n"))
    assert status is not None and status.code == Code.ERROR
    with pytest.raises(KeyError):
        plugin.filter_nodes(CycleState(), pod, snapshot)


FILTER: list[Any] = [
    pytest.param([gpus("n", 1)], [], HALF, None, id="fits"),
    pytest.param([gpus("other", 1)], [], HALF,
                 (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "Insufficient gpu devices"),
                 id="node-without-device-cr"),
    pytest.param([device("n", nic("rdma", 0))], [], HALF,
                 (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "Insufficient gpu devices"),
                 id="node-without-gpus"),
    pytest.param([gpus("n", 1)], [gpu_alloc(0, 60, 48 * GI, 60)], HALF,
                 (Code.UNSCHEDULABLE, "Insufficient gpu devices"), id="card-too-full"),
    pytest.param([gpus("n", 1)], [], {"koordinator.sh/rdma": 1},
                 (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "Insufficient rdma devices"),
                 id="no-rdma"),
]


@pytest.mark.parametrize(("devices", "existing", "requests", "want"), FILTER)
def test_filter(devices: list[Any], existing: list[str], requests: dict[str, Any],
                want: tuple[Code, str] | None) -> None:
    pods = [bound(gpu_pod(f"e{i}", {"nvidia.com/gpu": 1}), "n", t)
            for i, t in enumerate(existing)]
    plugin, snapshot = plugin_of(devices, pods, nodes=["n"])
    pod = gpu_pod("p", requests).build()
    state, _ = prefilter(plugin, pod)
    status = plugin.filter(state, pod, info(snapshot, "n"))
    assert (None if status is None else (status.code, status.message)) == want
    mask = plugin.filter_nodes(state, pod, snapshot)
    assert bool(mask[snapshot.index["n"]]) is (want is None)


def test_binpack_and_spread_choose_different_cards() -> None:
    chosen = {}
    for strategy in ("LeastAllocated", "MostAllocated"):
        existing = bound(gpu_pod("e", HALF), "n", gpu_alloc(0, 50, 40 * GI, 50))
        plugin, _ = plugin_of([gpus("n", 2)], [existing],
                              {"scoringStrategy": {"type": strategy}})
        pod = gpu_pod("p", HALF).build()
        state, _ = prefilter(plugin, pod)
        assert plugin.reserve(state, pod, "n") is None
        holding = plugin.ledger.holding(pod.uid)
        assert holding is not None
        chosen[strategy] = [u.minor for u in holding.uses]
    assert chosen == {"LeastAllocated": [1], "MostAllocated": [0]}


def test_score_prefers_emptier_node_by_default() -> None:
    existing = bound(gpu_pod("e", HALF), "busy", gpu_alloc(0, 50, 40 * GI, 50))
    plugin, snapshot = plugin_of([gpus("busy", 2), gpus("idle", 2)], [existing])
    pod = gpu_pod("p", HALF).build()
    state, _ = prefilter(plugin, pod)
    slots = snapshot.live_slots()
    scores = plugin.score_nodes(state, pod, snapshot, slots)
    per_node = [plugin.score(state, pod, snapshot.info(int(s))) for s in slots]
    # busy: ratio (200 - 100) -> 50, memory (160Gi - 40Gi) -> 75; idle: 75 and 100.
    assert list(scores) == per_node == [(50 + 75) // 2, (75 + 100) // 2]


def test_remove_pod_frees_victim_for_the_cycle_only() -> None:
    victim = bound(gpu_pod("victim", {"nvidia.com/gpu": 1}), "n", gpu_alloc(0, 100, 80 * GI, 100))
    plugin, snapshot = plugin_of([gpus("n", 1)], [victim])
    pod = gpu_pod("p", {"nvidia.com/gpu": 1}).build()
    state, _ = prefilter(plugin, pod)
    node = info(snapshot, "n")
    assert plugin.filter(state, pod, node) is not None
    dry = state.clone()
    ext = plugin.pre_filter_extensions()
    assert ext is not None
    assert ext.remove_pod(dry, pod, victim, node) is None
    assert plugin.filter(dry, pod, node) is None
    assert plugin.filter_nodes(dry, pod, snapshot)[node.slot]
    assert plugin.score_nodes(dry, pod, snapshot, np.array([node.slot])).tolist() == [
        plugin.score(dry, pod, node)]
    assert plugin.filter(state, pod, node) is not None  # the original state is untouched
    assert ext.add_pod(dry, pod, victim, node) is None
    assert plugin.filter(dry, pod, node) is not None
    assert plugin.ledger.holding(victim.uid) is not None


def test_slot_rows_follow_new_nodes() -> None:
    plugin, snapshot = plugin_of([gpus("a", 1)], nodes=["a"])
    pod = gpu_pod("p", HALF).build()
    state, _ = prefilter(plugin, pod)
    assert plugin.filter_nodes(state, pod, snapshot).tolist() == [True]
    snapshot.set_node(make_node("b").build())
    assert plugin.filter_nodes(state, pod, snapshot).tolist() == [True, False]
    plugin.ledger.apply_change(Change("Device", None, gpus("b", 1)))
    assert plugin.filter_nodes(state, pod, snapshot).tolist() == [True, True]


def test_gpu_model_constraint_through_node_affinity() -> None:
    snapshot = snapshot_of([])
    for name, model in (("a100", "A100-SXM4-80GB"), ("t4", "Tesla-T4")):
        snapshot.set_node(make_node(name).label("node.koordinator.sh/gpu-model", model).build())
    handlers: list[Callable[[Change], None]] = []
    handle = Handle(snapshot, RecordingClient(), ManualClock(), event_handlers=handlers)
    plugin = new_deviceshare({}, handle)
    for d in (gpus("a100", 1), gpus("t4", 1, "15Gi")):
        for h in handlers:
            h(Change("Device", None, d))
    affinity = NodeAffinity(affinity_args({}))
    pod = (gpu_pod("p", HALF).node_affinity_in("node.koordinator.sh/gpu-model", ["Tesla-T4"])
           .build())
    state = CycleState()
    assert affinity.pre_filter(state, pod) is None
    assert plugin.pre_filter(state, pod) is None
    fits = [name for name in ("a100", "t4")
            if affinity.filter(state, pod, info(snapshot, name)) is None
            and plugin.filter(state, pod, info(snapshot, name)) is None]
    assert fits == ["t4"]


# ---------------------------------------------------------------------------------------------
# Property: the whole-cluster forms equal the per-node forms on random clusters.

POD_REQUESTS: list[tuple[dict[str, Any], dict[str, str]]] = [
    ({"nvidia.com/gpu": 1}, {}),
    ({"nvidia.com/gpu": 2}, {}),
    (HALF, {}),
    ({"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory": "4Gi"}, {}),
    ({"koordinator.sh/rdma": 50, "koordinator.sh/fpga": 100}, {}),
    ({"nvidia.com/gpu": 2}, {ANNOTATION_DEVICE_ALLOCATE_HINT:
                             '{"gpu":{"requiredTopologyScope":"PCIe"}}'}),
    ({"nvidia.com/gpu": 1, "koordinator.sh/rdma": 1},
     {ANNOTATION_DEVICE_JOINT_ALLOCATE:
      '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}'}),
    ({"koordinator.sh/rdma": 1}, {ANNOTATION_DEVICE_ALLOCATE_HINT:
                                  '{"rdma":{"allocateStrategy":"ApplyForAll"}}'}),
    # SR-IOV VFs (nodes of ``ledgers`` have 0-2 VFs per NIC, some held by bound pods).
    ({"koordinator.sh/rdma": 1}, {ANNOTATION_DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{}}}'}),
    ({"nvidia.com/gpu": 1, "koordinator.sh/rdma": 1},
     {ANNOTATION_DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{}}}',
      ANNOTATION_DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"]}'}),
    ({"koordinator.sh/rdma": 1},
     {ANNOTATION_DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{}}}',
      ANNOTATION_DEVICE_ALLOCATED: '{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},'
                                   '"extension":{"vfs":[{"minor":1,"busID":"0000:10:00.2"}]}}]}'}),
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(), st.sampled_from(POD_REQUESTS), st.booleans(), st.integers(0, 3),
       st.booleans())
def test_batch_equals_per_node(ledger: NodeDeviceLedger, pod_spec: tuple[dict[str, Any],
                               dict[str, str]], binpack: bool, extra: int,
                               remove_victim: bool) -> None:
    args = {"scoringStrategy": {"type": "MostAllocated" if binpack else "LeastAllocated"}}
    plugin = DeviceShare(ledger, parse_args(args))
    # Nodes with and without a ledger row, in a shuffled slot order, one of them deleted.
    names = [f"n{i}" for i in range(ledger.n_rows + extra)]
    random.Random(len(names)).shuffle(names)
    snapshot = snapshot_of(names)
    snapshot.remove_node(names[0])
    pod = gpu_pod("p", pod_spec[0], pod_spec[1]).build()
    state, status = prefilter(plugin, pod)
    assert status is None
    ext = plugin.pre_filter_extensions()
    assert ext is not None
    if remove_victim:
        for name in names[1:2]:
            for holding in ledger.holdings_on(name):
                victim = gpu_pod(holding.uid.split("/")[1], {"nvidia.com/gpu": 1}).build()
                ext.remove_pod(state, pod, victim, info(snapshot, name))
    mask = plugin.filter_nodes(state, pod, snapshot)
    slots = snapshot.live_slots()
    for slot in slots:
        node = snapshot.info(int(slot))
        assert bool(mask[slot]) == (plugin.filter(state, pod, node) is None), node.name
    scores = plugin.score_nodes(state, pod, snapshot, slots)
    assert scores.tolist() == [plugin.score(state, pod, snapshot.info(int(s))) for s in slots]
    # The one-pass reasons of the rejected nodes equal filter's (-1 only where filter must say).
    rejected = slots[~mask[slots]]
    codes, statuses = plugin.filter_reasons(state, pod, snapshot, rejected)
    entry = plugin.entry(state)
    assert entry is not None and entry.request is not None
    for slot, code in zip(rejected.tolist(), codes.tolist(), strict=True):
        node = snapshot.info(slot)
        want = plugin.filter(state, pod, node)
        assert want is not None
        if entry.request.vectorizable and node.name not in entry.removed:
            assert code >= 0, node.name
        if code >= 0:
            got = statuses[code]
            assert (got.code, got.reasons) == (want.code, want.reasons), node.name


# ---------------------------------------------------------------------------------------------
# In the real scheduler, on the in-memory cluster.

DS = {"name": "DeviceShare"}
CONFIG = {
    "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
    "profiles": [{"schedulerName": "koord-scheduler", "plugins": {
        ep: {"enabled": [DS]} for ep in ("preFilter", "filter", "preScore", "score", "reserve",
                                          "preBind")}}],
}


def test_in_the_scheduler() -> None:
    cluster = InMemoryCluster()
    for name in ("g1", "cpu"):
        cluster.apply_node(make_node(name).cpu("8").memory("32Gi").gpu_resources(1, "16Gi")
                           .obj())
    cluster.apply_device(device("g1", gpu(0, "16Gi", uid=GOLDEN_ID)).to_dict())
    sched = Scheduler(parse_config(CONFIG), cluster,
                      in_tree_registry() | {"DeviceShare": new_deviceshare}, default_plugins(),
                      clock=SimulatedClock(), rng=random.Random(0), bind_workers=1)
    try:
        for name in ("a", "b", "c"):
            cluster.apply_pod(gpu_pod(name, HALF).scheduler("koord-scheduler").obj())
        sched.run_until_idle(timeout=30)
    finally:
        sched.close()
    plugin = sched.profiles["koord-scheduler"].plugin("DeviceShare")
    assert isinstance(plugin, DeviceShare)
    assert cluster.pods["default/a"].annotations[ANNOTATION_DEVICE_ALLOCATED] == GOLDEN
    assert cluster.pods["default/b"].node_name == "g1"
    assert cluster.pods["default/c"].node_name == ""
    assert sched.failures["default/c"] == (
        "0/2 nodes are available: 1 Insufficient gpu devices, 1 Insufficient koordinator.sh/"
        "gpu-core, 1 Insufficient koordinator.sh/gpu-memory-ratio. preemption: 0/2 nodes are "
        "available: 1 No preemption victims found for incoming pod, "
        "1 Preemption is not helpful for scheduling.")
    card = plugin.ledger.node_view("g1", ["gpu"]).cards["gpu"][0]
    assert card.used == (100, 100, 16 * GI)  # a and b, each counted once after their binds
    verify(plugin.ledger)
    fresh = NodeDeviceLedger.replay(cluster.devices.values(), cluster.pods.values())
    assert fresh.snapshot_state() == plugin.ledger.snapshot_state()


WHOLE = {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100}


def nominee_scheduler() -> tuple[Scheduler, DeviceShare]:
    """g0 (2 cards) with ``keeper`` on half of card 0 and g1 (1 card) empty, through the real
    scheduler: its framework is the runner DeviceShare's Reserve adds nominated pods with."""
    cluster = InMemoryCluster()
    for name, cards in (("g0", 2), ("g1", 1)):
        cluster.apply_node(make_node(name).cpu("8").memory("32Gi").gpu_resources(cards, "16Gi")
                           .obj())
        cluster.apply_device(device(name, *(gpu(m, "16Gi") for m in range(cards))).to_dict())
    sched = Scheduler(parse_config({**CONFIG, "profiles": [{"schedulerName": "koord-scheduler"}]}),
                      cluster, in_tree_registry(), default_plugins(), clock=SimulatedClock(),
                      rng=random.Random(0), bind_workers=1)
    cluster.apply_pod(gpu_pod("keeper", HALF).scheduler("koord-scheduler").node("g0").annotation(
        ANNOTATION_DEVICE_ALLOCATED, '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":'
        '"50","koordinator.sh/gpu-memory-ratio":"50","koordinator.sh/gpu-memory":"8Gi"}}]}'
    ).obj())
    sched.drain()
    plugin = sched.profiles["koord-scheduler"].plugin("DeviceShare")
    assert isinstance(plugin, DeviceShare)
    return sched, plugin


def reserved_minors(sched: Scheduler, plugin: DeviceShare, pod: Any, node: str) -> list[int]:
    fwk = sched.profiles["koord-scheduler"]
    state = CycleState()
    assert fwk.run_pre_filter(state, pod) is None
    status = fwk.run_reserve(state, pod, node)
    assert status is None, status
    holding = plugin.ledger.holding(pod.uid)
    assert holding is not None
    return sorted(use.minor for use in holding.uses)


@pytest.mark.parametrize(
    ("nominee_priority", "pod_is_nominee", "card"),
    [
        pytest.param(5, False, 1, id="lower-priority-nominee-is-not-counted"),
        pytest.param(10, False, 0, id="equal-priority-nominee-keeps-its-card"),
        pytest.param(20, False, 0, id="higher-priority-nominee-keeps-its-card"),
        pytest.param(10, True, 1, id="the-pod-never-counts-against-itself"),
    ],
)
def test_reserve_chooses_cards_around_the_nominated_pods(
    nominee_priority: int, pod_is_nominee: bool, card: int
) -> None:
    """A whole-card pod nominated to g0 is added as Filter adds it (kube's rule: another pod's
    nomination, of equal or higher priority); a half-card pod of priority 10 then reserves
    card 0 beside ``keeper`` instead of the emptier card 1 kept for the nominee."""
    sched, plugin = nominee_scheduler()
    nominee = gpu_pod("nominee", WHOLE).priority(nominee_priority).scheduler("koord-scheduler")
    sched.nominator.add(nominee.build(), "g0")
    pod = nominee.build() if pod_is_nominee else (
        gpu_pod("p", HALF).priority(10).scheduler("koord-scheduler").build())
    assert reserved_minors(sched, plugin, pod, "g0") == [card]


def test_reserve_stays_on_the_fast_path_where_nothing_is_nominated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A nomination elsewhere costs Reserve nothing: no what-if copy, no NodeView."""
    sched, plugin = nominee_scheduler()
    sched.nominator.add(gpu_pod("nominee", WHOLE).priority(10).build(), "g1")
    fwk = sched.profiles["koord-scheduler"]

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Reserve left its fast path")

    monkeypatch.setattr(fwk, "with_nominated_pods", forbidden)
    monkeypatch.setattr("scheduler.plugins.deviceshare.plugin.allocate", forbidden)
    pod = gpu_pod("p", HALF).priority(10).scheduler("koord-scheduler").build()
    assert reserved_minors(sched, plugin, pod, "g0") == [1]
