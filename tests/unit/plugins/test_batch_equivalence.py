"""Whole-cluster forms equal the per-node reference on random clusters (hypothesis).

For every plugin with ``filter_nodes`` the mask agrees with ``filter(...) is None`` on every
live slot, and for every plugin with ``score_nodes`` the raw (unnormalized) scores equal
``score(...)``; where a plugin explains its rejections in one pass (``filter_reasons``) each
explained node's status equals ``filter``'s. The runtime's diagnosis built from the masks equals
the per-node one (every filter node by node, first rejection wins), FitError message included.
Clusters have at most 40 nodes, dead slots (deleted nodes, pods on unknown nodes), and are
mutated between two rounds so cached masks must follow ``node_generation``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.allocation import DeviceAllocation, encode_allocations
from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.core import Pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, Device
from apis.quantity import Quantity, int_value
from scheduler.config import PluginRef, Plugins, PluginSet, Profile
from scheduler.devices import NodeDeviceLedger
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.interfaces import (
    BatchFilterPlugin,
    BatchScorePlugin,
    FilterReasonsPlugin,
    Handle,
    PluginFactory,
)
from scheduler.framework.runtime import Framework
from scheduler.framework.status import Code, Status
from scheduler.framework.types import Diagnosis, Snapshot, fit_error_message
from scheduler.plugins.gpufragmentation import GPUFragmentation
from scheduler.plugins.gpufragmentation.args import parse_args as frag_args
from scheduler.plugins.nodeaffinity import NodeAffinity
from scheduler.plugins.nodeaffinity import parse_args as affinity_args
from scheduler.plugins.nodename import NodeName
from scheduler.plugins.noderesources import NodeResourcesFit
from scheduler.plugins.noderesources import parse_args as fit_args
from scheduler.plugins.nodeunschedulable import NodeUnschedulable
from scheduler.plugins.prioritysort import PrioritySort
from scheduler.plugins.tainttoleration import TaintToleration
from tests.builders import (
    ManualClock,
    NodeBuilder,
    PodBuilder,
    RecordingClient,
    make_handle,
    make_node,
    make_pod,
)

KEYS = ["zone", "gpu", "tier", "kernel", "node.kubernetes.io/unschedulable"]
VALUES = ["a", "b", "c", "1", "7", "42", "-3", ""]
EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
RESOURCES = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "koordinator.sh/gpu-core",
    "example.com/aaa",
    "hugepages-2Mi",
]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]

names = st.sampled_from([f"n{i}" for i in range(40)])
keys = st.sampled_from(KEYS)
values = st.sampled_from(VALUES)
amounts = st.integers(min_value=0, max_value=12)


@st.composite
def nodes(draw: st.DrawFn, name: str) -> NodeBuilder:
    node = make_node(name)
    for r in RESOURCES:
        if draw(st.booleans()):
            node.resource(r, draw(amounts) * 4)
    node.pods(draw(st.sampled_from([None, 0, 1, 2, 3, 110])))
    for k, v in draw(st.dictionaries(keys, values, max_size=3)).items():
        node.label(k, v)
    for k, v, e in draw(st.lists(st.tuples(keys, values, st.sampled_from(EFFECTS)), max_size=3)):
        node.taint(k, v, e)
    return node.unschedulable(draw(st.booleans()))


def _requests(draw: st.DrawFn) -> dict[str, int]:
    return {r: draw(amounts) for r in draw(st.lists(st.sampled_from(RESOURCES), max_size=4))}


@st.composite
def assigned_pods(draw: st.DrawFn, index: int) -> PodBuilder:
    return make_pod(f"e{index}").req(_requests(draw)).node(draw(names))


@st.composite
def requirements(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    op = draw(st.sampled_from(OPERATORS))
    if op in ("Exists", "DoesNotExist"):
        vals: list[str] = []
    elif op in ("Gt", "Lt"):
        vals = [draw(st.sampled_from(["0", "5", "-3", "007"]))]
    else:
        vals = draw(st.lists(values, min_size=1, max_size=3))
    return draw(keys), op, vals


@st.composite
def field_requirements(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    return (
        "metadata.name",
        draw(st.sampled_from(["In", "NotIn"])),
        draw(st.lists(names, min_size=1, max_size=2)),
    )


@st.composite
def terms(draw: st.DrawFn) -> tuple[list[Any], list[Any]]:
    return (
        draw(st.lists(requirements(), max_size=3)),
        draw(st.lists(field_requirements(), max_size=1)),
    )


@st.composite
def pending_pods(draw: st.DrawFn) -> Pod:
    pod = make_pod("pending").req(_requests(draw))
    if draw(st.booleans()):
        pod.node_selector(draw(st.dictionaries(keys, values, max_size=2)))
    for exprs, fields in draw(st.lists(terms(), max_size=2)):
        pod.required_term(exprs, fields)
    for exprs, fields in draw(st.lists(terms(), max_size=3)):
        pod.preferred_term(draw(st.integers(1, 100)), exprs, fields)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["Equal", "Exists"]))
        pod.toleration(
            draw(st.sampled_from(["", *KEYS])),
            draw(values) if op == "Equal" else "",
            draw(st.sampled_from(["", *EFFECTS])),
            op,
        )
    if draw(st.integers(0, 4)) == 0:
        pod.node(draw(names))
    return pod.build()


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Snapshot, list[NodeBuilder]]:
    count = draw(st.integers(min_value=0, max_value=40))
    snapshot = Snapshot(capacity=4)  # grows while the cluster is built
    builders = [draw(nodes(f"n{i}")) for i in range(count)]
    for b in builders:
        snapshot.set_node(b.build())
    for i in range(draw(st.integers(0, 60))):
        pod = draw(assigned_pods(i)).build()
        snapshot.add_pod(pod.node_name, pod)
    for name in draw(st.lists(names, max_size=3)):
        snapshot.remove_node(name)
    return snapshot, builders


def _plugins(draw: Callable[[st.SearchStrategy[Any]], Any]) -> list[Any]:
    added: dict[str, Any] = {}
    if draw(st.booleans()):
        exprs, fields = draw(terms())
        term: dict[str, Any] = {}
        if exprs:
            term["matchExpressions"] = [
                {"key": k, "operator": o, **({"values": v} if v else {})}
                for k, o, v in exprs
                if not any(x.startswith("-") for x in v)  # "-3" is not a valid label value
            ]
        if fields:
            term["matchFields"] = [{"key": k, "operator": o, "values": v[:1]} for k, o, v in fields]
        added = {
            "addedAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 7,
                        "preference": {
                            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                        },
                    }
                ],
            }
        }
    fit = {
        "ignoredResourceGroups": draw(st.sampled_from([[], ["example.com"]])),
        "scoringStrategy": {
            "type": draw(st.sampled_from(["LeastAllocated", "MostAllocated"])),
            "resources": [
                {"name": r, "weight": draw(st.integers(1, 100))}
                for r in draw(
                    st.lists(
                        st.sampled_from([*RESOURCES, "pods"]), min_size=1, max_size=4, unique=True
                    )
                )
            ],
        },
    }
    return [
        NodeUnschedulable(),
        NodeName(),
        TaintToleration(),
        NodeAffinity(affinity_args(added)),
        NodeResourcesFit(fit_args(fit)),
    ]


def _check(plugins: list[Any], pod: Pod, snapshot: Snapshot) -> None:
    infos = list(snapshot.node_infos())
    slots = snapshot.live_slots()
    for plugin in plugins:
        state = CycleState()
        pre = plugin.pre_filter(state, pod) if hasattr(plugin, "pre_filter") else None
        if isinstance(plugin, BatchFilterPlugin) and (pre is None or pre.code != Code.SKIP):
            mask = plugin.filter_nodes(state, pod, snapshot)
            assert mask.shape == (snapshot.size,)
            for info in infos:
                status = plugin.filter(state, pod, info)
                assert bool(mask[info.slot]) is (status is None), (plugin.name, info.name, status)
            if isinstance(plugin, FilterReasonsPlugin):
                rejected = slots[~mask[slots]]
                codes, statuses = plugin.filter_reasons(state, pod, snapshot, rejected)
                assert codes.shape == rejected.shape
                for slot, code in zip(rejected.tolist(), codes.tolist(), strict=True):
                    want = plugin.filter(state, pod, snapshot.info(slot))
                    assert want is not None and code >= 0, (plugin.name, slot)
                    got = statuses[code]
                    assert (got.code, got.reasons) == (want.code, want.reasons), plugin.name
        if isinstance(plugin, BatchScorePlugin):
            pre_score = (
                plugin.pre_score(state, pod, infos) if hasattr(plugin, "pre_score") else None
            )
            if pre_score is not None:
                continue  # Skip (no preferred terms) or a broken pod: Score is not run
            batch = plugin.score_nodes(state, pod, snapshot, slots)
            assert batch.tolist() == [plugin.score(state, pod, i) for i in infos], plugin.name


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_batch_forms_equal_per_node_forms(data: st.DataObject) -> None:
    snapshot, _ = data.draw(clusters())
    plugins = _plugins(data.draw)
    for _ in range(2):
        pod = data.draw(pending_pods())
        _check(plugins, pod, snapshot)
        _check(plugins, pod, snapshot)  # the second call is served from the caches
    # Mutate nodes and pods; cached masks must follow.
    for name in data.draw(st.lists(names, max_size=4)):
        snapshot.set_node(data.draw(nodes(name)).build())
    for i in range(data.draw(st.integers(0, 5))):
        pod = data.draw(assigned_pods(100 + i)).build()
        snapshot.add_pod(pod.node_name, pod)
    _check(plugins, data.draw(pending_pods()), snapshot)


# -- GPUFragmentation: random GPU clusters over the device ledger ----------------------------

GPU_MEMORIES = ["16Gi", "32Gi", "80Gi"]
MODELS = ["A100", "T4", ""]
GPU_REQUESTS: list[dict[str, str]] = [
    {},
    {"nvidia.com/gpu": "1"},
    {"nvidia.com/gpu": "2"},
    {"koordinator.sh/gpu": "50"},
    {"koordinator.sh/gpu": "200"},
    {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"},
    {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "30"},
    {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "8Gi"},
    {"koordinator.sh/gpu-memory": "10Gi"},
    {"koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-core": "100"},
    {"koordinator.sh/gpu.shared": "2", "koordinator.sh/gpu-memory-ratio": "60"},
    {"koordinator.sh/gpu-core": "150"},  # invalid: scores 0 in both forms
]
FRAG_SHAPES = [
    {"cpuMilli": 1000, "gpuMilli": 250, "gpuCount": 1, "weight": 2},
    {"cpuMilli": 4000, "gpuMilli": 500, "gpuCount": 1, "weight": 3},
    {"cpuMilli": 8000, "gpuMilli": 1000, "gpuCount": 1, "weight": 3, "models": ["A100"]},
    {"cpuMilli": 16000, "gpuMilli": 1000, "gpuCount": 2, "weight": 1},
    {"cpuMilli": 2000, "weight": 1},
]


def _gpu_card(minor: int, memory: str, healthy: bool) -> dict[str, Any]:
    return {
        "type": "gpu",
        "id": f"GPU-{minor}",
        "minor": minor,
        "health": healthy,
        "resources": {
            "koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory": memory,
            "koordinator.sh/gpu-memory-ratio": "100",
        },
    }


@st.composite
def gpu_clusters(draw: st.DrawFn) -> tuple[Snapshot, Any]:
    ledger = NodeDeviceLedger(rows=2, cards=2)
    snapshot = Snapshot(capacity=4)
    count = draw(st.integers(1, 12))
    for i in range(count):
        name = f"g{i}"
        model = draw(st.sampled_from(MODELS))
        node = make_node(name).cpu(str(draw(st.sampled_from([8, 16, 64]))))
        if model:
            node.label("node.koordinator.sh/gpu-model", model)
        if draw(st.integers(0, 5)):
            snapshot.set_node(node.build())
        if not draw(st.integers(0, 5)):
            continue  # a node without a Device CR
        memory = draw(st.sampled_from(GPU_MEMORIES))
        n_cards = draw(st.integers(1, 8))
        sick = draw(st.frozensets(st.integers(0, n_cards - 1), max_size=1))
        held = draw(st.frozensets(st.integers(0, n_cards - 1), max_size=2))
        annotations = {}
        if held:
            entries = [
                PodDeviceEntry("k", "c", "nvidia.com/gpu", tuple(f"GPU-{m}" for m in sorted(held)))
            ]
            annotations[ANNOTATION_DEVICES_CHECKPOINTS] = encode_devices_checkpoints(entries)
        ledger.set_device(
            Device.from_dict(
                {
                    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                    "kind": "Device",
                    "metadata": {"name": name, "annotations": annotations},
                    "spec": {
                        "devices": [_gpu_card(m, memory, m not in sick) for m in range(n_cards)]
                    },
                }
            )
        )
        bytes_ = int_value(Quantity.parse(memory))
        for j in range(draw(st.integers(0, 6))):
            minor = draw(st.integers(0, n_cards - 1))
            core, ratio = draw(st.integers(1, 40)), draw(st.integers(1, 40))
            allocation = encode_allocations(
                {
                    "gpu": [
                        DeviceAllocation.from_ints(
                            minor,
                            {
                                "koordinator.sh/gpu-core": core,
                                "koordinator.sh/gpu-memory-ratio": ratio,
                                "koordinator.sh/gpu-memory": ratio * bytes_ // 100,
                            },
                        )
                    ]
                }
            )
            pod = (
                make_pod(f"{name}-{j}")
                .req(cpu=str(draw(st.integers(0, 4))))
                .node(name)
                .annotation("scheduling.koordinator.sh/device-allocated", allocation)
                .build()
            )
            ledger.observe_pod(None, pod)
            if snapshot.get(name) is not None:
                snapshot.add_pod(name, pod)
    for name in draw(st.lists(st.sampled_from([f"g{i}" for i in range(count)]), max_size=2)):
        snapshot.remove_node(name)
    return snapshot, ledger


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_gpufragmentation_batch_score_equals_per_node_score(data: st.DataObject) -> None:
    snapshot, ledger = data.draw(gpu_clusters())
    args = frag_args(
        {
            "strategy": data.draw(st.sampled_from(
                    ["FragmentationGradient", "BestFit", "Random", "DotProduct",
                     "GPUClustering", "GPUPacking"]
                )),
            "gradient": {
                "quantization": data.draw(st.sampled_from(["Linear", "Sigmoid"])),
                "resolution": data.draw(st.sampled_from([1, 10, 100])),
                "strandedWeight": data.draw(st.sampled_from([0, 1, 0.5])),
                "strandedReach": data.draw(st.booleans()),
                "pinnedWeight": data.draw(st.sampled_from([0, 1, 2.5])),
            },
            "tieBreak": data.draw(
                st.lists(
                    st.sampled_from(["SmallestNode", "Packing", "FirstFit"]),
                    unique=True,
                    max_size=3,
                )
            ),
            "targetWorkload": {"shapes": FRAG_SHAPES},
        }
    )
    plugin = GPUFragmentation(ledger, args, Handle(snapshot, RecordingClient(), ManualClock()))
    infos = list(snapshot.node_infos())
    slots = snapshot.live_slots()
    for _ in range(3):
        pod = (
            make_pod("pending")
            .req(cpu=str(data.draw(st.integers(0, 8))))
            .req(data.draw(st.sampled_from(GPU_REQUESTS)))
            .build()
        )
        state = CycleState()
        plugin.pre_filter(state, pod)
        batch = plugin.score_nodes(state, pod, snapshot, slots)
        assert batch.tolist() == [plugin.score(state, pod, i) for i in infos], pod.requests


def _framework(plugins: list[Any], snapshot: Snapshot) -> Framework:
    registry: dict[str, PluginFactory] = {
        p.name: (lambda args, handle, p=p: p) for p in [*plugins, PrioritySort(), _Binder()]
    }
    profile = Profile(
        scheduler_name="test",
        plugins=Plugins(
            queue_sort=PluginSet(enabled=(PluginRef("PrioritySort"),)),
            pre_filter=PluginSet(
                enabled=tuple(PluginRef(p.name) for p in plugins if hasattr(p, "pre_filter"))
            ),
            filter=PluginSet(enabled=tuple(PluginRef(p.name) for p in plugins)),
            bind=PluginSet(enabled=(PluginRef("Binder"),)),
        ),
    )
    return Framework(profile, registry, make_handle(snapshot))


class _Binder:
    name = "Binder"

    def bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        return None


def _key(status: Status | None) -> tuple[Any, ...] | None:
    return None if status is None else (status.code, status.reasons, status.plugin)


def _check_diagnosis(fwk: Framework, pod: Pod, snapshot: Snapshot) -> None:
    state = CycleState()
    if fwk.run_pre_filter(state, pod) is not None:
        return
    out = fwk.find_feasible(state, pod, snapshot, snapshot.size + 1, 0)
    per_node = {info.name: fwk.run_filter(state, pod, info) for info in snapshot.node_infos()}
    want = {name: status for name, status in per_node.items() if status is not None}
    got = out.diagnose()
    assert len(got) == len(want)
    assert {k: _key(v) for k, v in got.items()} == {k: _key(v) for k, v in want.items()}
    n = snapshot.num_nodes
    assert fit_error_message(n, Diagnosis(node_to_status=got)) == fit_error_message(
        n, Diagnosis(node_to_status=dict(want))
    )
    assert got.plugins() == {s.plugin for s in want.values()}
    assert got.first_error() is None  # no plugin here fails with an error on valid input


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mask_diagnosis_equals_per_node_diagnosis(data: st.DataObject) -> None:
    snapshot, _ = data.draw(clusters())
    fwk = _framework(_plugins(data.draw), snapshot)
    for _ in range(3):
        _check_diagnosis(fwk, data.draw(pending_pods()), snapshot)
