"""GPUFragmentation through the real scheduler: node and card choice, DeviceShare's hook,
both score forms, Reserve/Unreserve and the fail-fast PreFilter."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    DeviceAllocation,
    decode_allocations,
    encode_allocations,
)
from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.framework.cycle_state import CycleState
from scheduler.plugins.deviceshare import plugin as deviceshare_plugin
from scheduler.plugins.gpufragmentation import plugin as gpufrag_plugin
from scheduler.plugins.gpufragmentation.plugin import GPUFragmentation
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from scheduler.simulator.trace import TraceNode, TracePod, device_object, node_object, pod_object
from tests.builders import make_node, make_pod

NAME = "koord-scheduler"
SHAPES = [
    {"cpuMilli": 1000, "gpuMilli": 500, "gpuCount": 1, "weight": 1},
    {"cpuMilli": 1000, "gpuMilli": 1000, "gpuCount": 1, "weight": 1},
]


def _config(args: Mapping[str, Any]) -> Any:
    return parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "percentageOfNodesToScore": 100,
            "profiles": [
                {
                    "schedulerName": NAME,
                    "plugins": {
                        "preFilter": {"enabled": [{"name": "GPUFragmentation"}]},
                        "score": {
                            "disabled": [{"name": "*"}],
                            "enabled": [{"name": "GPUFragmentation"}],
                        },
                    },
                    "pluginConfig": [{"name": "GPUFragmentation", "args": dict(args)}],
                }
            ],
        }
    )


class Harness:
    def __init__(self, nodes: Sequence[TraceNode], **args: Any) -> None:
        args.setdefault("targetWorkload", {"shapes": SHAPES})
        self.cluster = InMemoryCluster()
        for n in nodes:
            self.cluster.apply_node(node_object(n))
            device = device_object(n)
            if device is not None:
                self.cluster.apply_device(device)
        self.sched = Scheduler(
            _config(args),
            self.cluster,
            in_tree_registry(),
            default_plugins(),
            clock=SimulatedClock(),
            rng=random.Random(0),
            bind_workers=1,
        )
        self.plugin: GPUFragmentation = self.sched.profiles[NAME].plugin("GPUFragmentation")
        self.sched.drain()

    def place(self, pod: TracePod) -> tuple[str, tuple[int, ...]]:
        key = self.cluster.apply_pod(pod_object(pod, NAME)).key
        self.sched.run_until_idle()
        bound = self.cluster.pods[key]
        raw = bound.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        minors = tuple(a.minor for a in decode_allocations(raw)["gpu"]) if raw else ()
        return bound.node_name, minors

    def close(self) -> None:
        self.sched.close()


def _pod(name: str, milli: int, count: int = 1, cpu: int = 1000) -> TracePod:
    return TracePod(name, cpu, 1024, count if milli else 0, milli)


def test_the_hook_keys_are_deviceshares() -> None:
    assert gpufrag_plugin.PREFERRED_GPUS_KEY == deviceshare_plugin.PREFERRED_GPUS_KEY


@pytest.mark.parametrize(
    ("setup", "pod", "expected"),
    [
        # A 500 share fits exactly in the half-used card: no new fragment anywhere.
        pytest.param(
            [_pod("a", 500)], _pod("b", 500), ("n0", (0,)), id="share-fills-the-used-card"
        ),
        # A whole GPU goes to an idle card, leaving the half-used card for shares.
        pytest.param([_pod("a", 500)], _pod("b", 1000), ("n0", (1,)), id="whole-takes-idle"),
    ],
)
def test_card_choice_reaches_deviceshare(
    setup: list[TracePod], pod: TracePod, expected: tuple[str, tuple[int, ...]]
) -> None:
    h = Harness([TraceNode("n0", 8000, 65536, 2, "T4")], tieBreak=["FirstFit"])
    try:
        for p in setup:
            assert h.place(p) == ("n0", (0,))
        assert h.place(pod) == expected
    finally:
        h.close()


def test_node_choice_minimizes_the_fragmentation_increase() -> None:
    # n0 has a card with 500 left; n1 is idle. A 500 share on n0 closes the gap (gradient
    # -500 for the share-500 shape); on n1 it would open a new 500 fragment for whole GPUs.
    nodes = [TraceNode("n0", 8000, 65536, 2, "T4"), TraceNode("n1", 8000, 65536, 2, "T4")]
    h = Harness(nodes, tieBreak=["FirstFit"])
    try:
        assert h.place(_pod("a", 500)) == ("n0", (0,))
        assert h.place(_pod("b", 500)) == ("n0", (0,))
        assert h.place(_pod("c", 300)) == ("n0", (1,))
    finally:
        h.close()


def test_both_score_forms_agree() -> None:
    nodes = [TraceNode(f"n{i}", 8000 + 1000 * i, 65536, 1 + i % 4, "T4") for i in range(6)]
    h = Harness(nodes, tieBreak=["SmallestNode", "FirstFit"])
    try:
        for i, milli in enumerate([500, 1000, 300, 700]):
            h.place(_pod(f"p{i}", milli))
        snapshot = h.sched.cache.snapshot
        slots = snapshot.live_slots()
        probe = h.cluster.apply_pod(pod_object(_pod("probe", 400), "nobody"))
        state = CycleState()
        assert h.plugin.pre_filter(state, probe) is None
        batch = h.plugin.score_nodes(state, probe, snapshot, slots)
        single = [h.plugin.score(state, probe, snapshot.info(int(s))) for s in slots]
        assert batch.tolist() == single
    finally:
        h.close()


def _shares(h: Harness, node: str) -> list[int]:
    ledger = h.plugin.ledger
    row = ledger.row_of(node)
    assert row is not None
    return ledger.table("gpu").share[row, : len(ledger.minors(node, "gpu"))].tolist()


def test_reads_the_ledger_deviceshare_reserves_into() -> None:
    h = Harness([TraceNode("n0", 8000, 65536, 2, "T4")])
    try:
        h.place(_pod("a", 500))
        assert _shares(h, "n0") == [500, 1000]
        h.cluster.delete_pod("openb/a")
        h.sched.drain()
        assert _shares(h, "n0") == [1000, 1000]
    finally:
        h.close()


@pytest.mark.parametrize(
    ("pod", "fits"),
    [
        pytest.param(_pod("big", 1000, count=2), False, id="two-cards-on-a-one-card-node"),
        pytest.param(_pod("cpu", 0, cpu=64_000), False, id="too-much-cpu"),
        pytest.param(_pod("ok", 1000), True, id="fits"),
    ],
)
def test_fail_fast_prefilter(pod: TracePod, fits: bool) -> None:
    h = Harness([TraceNode("n0", 8000, 65536, 1, "T4")])
    try:
        node, _ = h.place(pod)
        assert bool(node) == fits
        if not fits:
            message = h.sched.failures[f"openb/{pod.name}"]
            assert message.startswith("0/1 nodes are available: no node has")
    finally:
        h.close()


def test_normalize_score_ranks_distinct_values() -> None:
    h = Harness([TraceNode("n0", 8000, 65536, 1, "T4")])
    try:
        scores = np.array([-5, 7, 7, 3, -5], np.int64)
        h.plugin.normalize_score(CycleState(), None, scores)  # type: ignore[arg-type]
        assert scores.tolist() == [98, 100, 100, 99, 98]
    finally:
        h.close()


@pytest.mark.parametrize(
    ("strategy", "expected_node"),
    [
        # BestFit: the node left with the least free cpu and GPU.
        pytest.param("BestFit", "small", id="bestfit"),
    ],
)
def test_baselines(strategy: str, expected_node: str) -> None:
    nodes = [TraceNode("big", 64000, 65536, 8, "T4"), TraceNode("small", 8000, 65536, 1, "T4")]
    h = Harness(nodes, strategy=strategy)
    try:
        assert h.place(_pod("p", 1000))[0] == expected_node
    finally:
        h.close()


@pytest.mark.parametrize(
    ("gpu_model", "expected_node"),
    [
        # No GPU task can use nB's GPUs: filling its cpu strands nothing that could be used,
        # while on nA it leaves a GPU without the 16 cores an A task needs.
        pytest.param("A", "nB", id="constrained-to-the-other-node"),
        # Without the constraint both nodes' GPUs are of use and equal: the earlier one.
        pytest.param("", "nA", id="unconstrained"),
    ],
)
def test_stranded_gpu_look_ahead_counts_only_tasks_that_can_run_there(
    gpu_model: str, expected_node: str
) -> None:
    gpu_shape: dict[str, Any] = {"cpuMilli": 16_000, "gpuMilli": 1000, "gpuCount": 1, "weight": 1}
    if gpu_model:
        gpu_shape["models"] = [gpu_model]
    nodes = [TraceNode("nA", 32_000, 65536, 2, "A"), TraceNode("nB", 32_000, 65536, 2, "B")]
    h = Harness(
        nodes,
        gradient={"strandedWeight": 1},
        tieBreak=["FirstFit"],
        targetWorkload={"shapes": [gpu_shape, {"cpuMilli": 16_000, "weight": 1}]},
    )
    try:
        assert h.place(_pod("cpu", 0, cpu=16_000))[0] == expected_node
    finally:
        h.close()


@pytest.mark.parametrize(
    ("reach", "expected_node"),
    [
        # Without the reach scaling both nodes strand 1,000 milli-GPU alike: the earlier one.
        pytest.param(False, "nA", id="unscaled-tie"),
        # Scaled: only half the GPU tasks can use nB's GPUs, so stranding them costs half.
        pytest.param(True, "nB", id="scaled-by-reach"),
    ],
)
def test_stranded_reach_scales_the_look_ahead_by_the_tasks_accepting_the_model(
    reach: bool, expected_node: str
) -> None:
    nodes = [TraceNode("nA", 32_000, 65536, 2, "A"), TraceNode("nB", 32_000, 65536, 2, "B")]
    gpu = {"cpuMilli": 16_000, "gpuMilli": 1000, "gpuCount": 1, "weight": 1}
    h = Harness(
        nodes,
        gradient={"strandedWeight": 1, "strandedReach": reach},
        tieBreak=["FirstFit"],
        targetWorkload={
            "shapes": [gpu, {**gpu, "models": ["A"]}, {"cpuMilli": 16_000, "weight": 1}]
        },
    )
    try:
        assert h.place(_pod("cpu", 0, cpu=16_000))[0] == expected_node
    finally:
        h.close()


@pytest.mark.parametrize(
    ("weight", "expected_node"),
    [
        # Off: both nodes' gradients are equal, the earlier one.
        pytest.param(0, "nA", id="off"),
        # On: a third of the GPU demand is pinned to each model, but A holds a third of the
        # free GPUs and B two thirds: an unpinned pod is steered to B (pressure 1 vs 0.5).
        pytest.param(1, "nB", id="steered-off-the-pinned-model"),
    ],
)
def test_pinned_weight_keeps_unpinned_pods_off_the_models_pinned_demand_needs(
    weight: float, expected_node: str
) -> None:
    nodes = [TraceNode("nA", 64_000, 65536, 2, "A"), TraceNode("nB", 64_000, 65536, 4, "B")]
    gpu = {"cpuMilli": 1_000, "gpuMilli": 1000, "gpuCount": 1, "weight": 1}
    h = Harness(
        nodes,
        gradient={"pinnedWeight": weight},
        tieBreak=["FirstFit"],
        targetWorkload={
            "shapes": [gpu, {**gpu, "models": ["A"]}, {**gpu, "models": ["B"]}]
        },
    )
    try:
        assert h.place(_pod("free", 1000))[0] == expected_node
    finally:
        h.close()


def test_pinned_weight_changes_nothing_without_model_constraints() -> None:
    nodes = [TraceNode(f"n{i}", 32_000 * (1 + i % 2), 65536, 2 + 2 * (i % 3), "T4")
             for i in range(6)]
    shares = [(250, 1), (500, 1), (1000, 1), (1000, 2)]
    pods = [_pod(f"p{i}", *shares[i % 4], cpu=2000 + 1000 * (i % 5)) for i in range(14)]
    placements = []
    for weight in (0, 1):
        h = Harness(nodes, gradient={"pinnedWeight": weight, "strandedWeight": 1})
        try:
            placements.append([h.place(p) for p in pods])
        finally:
            h.close()
    assert placements[0] == placements[1]


def test_random_is_seeded() -> None:
    nodes = [TraceNode(f"n{i}", 64000, 65536, 8, "T4") for i in range(4)]
    placements = []
    for _ in range(2):
        h = Harness(nodes, strategy="Random", randomSeed=3)
        try:
            placements.append([h.place(_pod(f"p{i}", 300)) for i in range(6)])
        finally:
            h.close()
    assert placements[0] == placements[1]


# -- the fragmentation profile against the default profile, on the same cluster -------------

REPO = Path(__file__).resolve().parents[4]
GI = 1024**3


def _device_obj(node: str, *cards: dict[str, Any], checkpoints: str | None = None
                ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node}
    if checkpoints is not None:
        meta["annotations"] = {ANNOTATION_DEVICES_CHECKPOINTS: checkpoints}
    return {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": meta, "spec": {"devices": list(cards)}}


def _profile_config(profile: str | None) -> Any:
    if profile is None:
        return parse_config({"apiVersion": "kubescheduler.config.k8s.io/v1",
                             "kind": "KubeSchedulerConfiguration",
                             "profiles": [{"schedulerName": NAME}]})
    with open(REPO / "config" / "profiles" / f"{profile}.yaml", encoding="utf-8") as f:
        return parse_config(yaml.safe_load(f))


def _scheduler(profile: str | None, devices: Sequence[dict[str, Any]], running: Sequence[Any]
               ) -> tuple[InMemoryCluster, Scheduler]:
    cluster = InMemoryCluster()
    for d in devices:
        name = d["metadata"]["name"]
        cards = d["spec"]["devices"]
        memory = cards[0]["resources"]["koordinator.sh/gpu-memory"]
        cluster.apply_node(make_node(name).cpu("16").memory("64Gi")
                           .gpu_resources(len(cards), memory, nvidia=True)
                           .resource("koordinator.sh/gpu", 100 * len(cards))
                           .label("node.koordinator.sh/gpu-model", "A100").obj())
        cluster.apply_device(d)
    for p in running:
        cluster.apply_pod(p.scheduler("other").obj())
    sched = Scheduler(_profile_config(profile), cluster, in_tree_registry(), default_plugins(),
                      clock=SimulatedClock(), rng=random.Random(0), bind_workers=1)
    sched.drain()
    return cluster, sched


def _place_with(profile: str | None, devices: Sequence[dict[str, Any]],
                running: Sequence[Any], pod: Any) -> tuple[str, str]:
    """Node and failure message of ``pod`` under ``profile`` (None: the default profile)."""
    cluster, sched = _scheduler(profile, devices, running)
    try:
        key = cluster.apply_pod(pod.scheduler(NAME).obj()).key
        sched.run_until_idle()
        return cluster.pods[key].node_name, sched.failures.get(key, "")
    finally:
        sched.close()


def _alloc(minor: int, core: int, ratio: int, memory: int) -> str:
    return encode_allocations({"gpu": [DeviceAllocation.from_ints(minor, {
        "koordinator.sh/gpu-core": core, "koordinator.sh/gpu-memory-ratio": ratio,
        "koordinator.sh/gpu-memory": memory})]})


def _running(name: str, node: str, allocation: str) -> Any:
    return (make_pod(name).req(cpu="1").node(node)
            .annotation(ANNOTATION_DEVICE_ALLOCATED, allocation))


def _gpu(minor: int, memory: str) -> dict[str, Any]:
    return {"type": "gpu", "id": f"GPU-{minor}", "minor": minor, "health": True,
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": memory,
                          "koordinator.sh/gpu-memory-ratio": "100"}}


# One 32Gi card with 90 core and 40 ratio (12.8Gi) free: a pod holding core 10 + 60%.
_HALF_USED = ([_device_obj("n0", _gpu(0, "32Gi"))],
              [_running("held", "n0", _alloc(0, 10, 60, 32 * GI * 60 // 100))])


@pytest.mark.parametrize(
    ("cluster", "requests", "node"),
    [
        # Before: GPUFragmentation folded the card to min(core, ratio) = 400 milli and the pod
        # to 500 ("no node has 1 cpu, 0 memory and 1 GPU card(s) with 500 of 1000 milli-GPU
        # free"), while DeviceShare places it: 50 <= 90 core, 8Gi = 25% <= 40% memory.
        pytest.param(_HALF_USED, {"koordinator.sh/gpu-core": "50",
                                  "koordinator.sh/gpu-memory": "8Gi"}, "n0",
                     id="core-50-memory-8Gi"),
        pytest.param(_HALF_USED, {"koordinator.sh/gpu-memory": "12Gi"}, "n0", id="memory-only"),
        pytest.param(_HALF_USED, {"koordinator.sh/gpu-memory": "13Gi"}, "", id="memory-too-much"),
        pytest.param(_HALF_USED, {"koordinator.sh/gpu-core": "30",
                                  "koordinator.sh/gpu-memory-ratio": "40"}, "n0", id="ratio"),
        pytest.param(_HALF_USED, {"koordinator.sh/gpu-core": "30",
                                  "koordinator.sh/gpu-memory-ratio": "41"}, "", id="ratio-over"),
        pytest.param(([_device_obj("n0", _gpu(0, "16Gi"), _gpu(1, "16Gi"), _gpu(2, "16Gi"))],
                      [_running("held", "n0", _alloc(1, 0, 1, 16 * GI // 100))]),
                     {"nvidia.com/gpu": "2"}, "n0", id="two-whole-cards"),
        pytest.param(([_device_obj("n0", _gpu(0, "16Gi"), _gpu(1, "16Gi"))],
                      [_running("held", "n0", _alloc(1, 0, 1, 16 * GI // 100))]),
                     {"nvidia.com/gpu": "2"}, "", id="two-whole-cards-one-busy"),
        pytest.param(([_device_obj("n0", _gpu(0, "16Gi"), _gpu(1, "16Gi"))], []),
                     {"koordinator.sh/gpu": "200"}, "n0", id="koord-gpu-200"),
    ],
)
def test_fragmentation_profile_fits_exactly_what_the_default_profile_fits(
    cluster: tuple[Sequence[dict[str, Any]], Sequence[Any]], requests: dict[str, str],
    node: str,
) -> None:
    devices, running = cluster
    results = {}
    for profile in (None, "fragmentation"):
        pod = make_pod("p").req(cpu="1").req(requests)
        results[profile] = _place_with(profile, devices, running, pod)
    assert results[None][0] == node, results[None][1]
    assert results["fragmentation"][0] == node, results["fragmentation"][1]


def _checkpoint(*ids: str) -> str:
    return encode_devices_checkpoints(
        [PodDeviceEntry("kubelet-pod", "cuda", "nvidia.com/gpu", tuple(ids))]
    )


def test_kubelet_held_cards_are_not_offered() -> None:
    # On n0, card 0 is held by a pod the kubelet allocated (devices-checkpoints) and card 1
    # has 40 free; n1 has an idle card. Before, GPUFragmentation saw n0's card 0 idle: it
    # named it to DeviceShare for a 50 share and let a whole-GPU pod past its fail-fast check.
    devices = [
        _device_obj("n0", _gpu(0, "16Gi"), _gpu(1, "16Gi"), checkpoints=_checkpoint("GPU-0")),
        _device_obj("n1", _gpu(0, "16Gi")),
    ]
    running = [
        _running("busy", "n0", _alloc(1, 60, 60, 16 * GI * 60 // 100)),
        _running("whole", "n1", _alloc(0, 100, 100, 16 * GI)),
    ]
    cluster, sched = _scheduler("fragmentation", devices, running[:1])
    try:
        plugin = sched.profiles[NAME].plugin("GPUFragmentation")
        pod = cluster.apply_pod(make_pod("p").req(cpu="1").req(
            {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
        ).scheduler(NAME).obj())
        state = CycleState()
        assert plugin.pre_filter(state, pod) is None
        preference = state.get(gpufrag_plugin.PREFERRED_GPUS_KEY)
        assert (preference.get("n0"), preference.get("n1")) == (None, (0,))
        cluster.apply_pod(running[1].scheduler("other").obj())
        sched.drain()
        whole = make_pod("w").req(cpu="1").req({"nvidia.com/gpu": "1"}).build()
        status = plugin.pre_filter(CycleState(), whole)
        assert status is not None and "no node has" in status.message
    finally:
        sched.close()
