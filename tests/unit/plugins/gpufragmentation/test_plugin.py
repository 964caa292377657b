"""GPUFragmentation through the real scheduler: node and card choice, DeviceShare's hook,
both score forms, Reserve/Unreserve and the fail-fast PreFilter."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, decode_allocations
from scheduler.config import parse_config
from scheduler.framework.cycle_state import CycleState
from scheduler.plugins.deviceshare import plugin as deviceshare_plugin
from scheduler.plugins.gpufragmentation import plugin as gpufrag_plugin
from scheduler.plugins.gpufragmentation.plugin import GPUFragmentation
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.scheduler import Scheduler
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from scheduler.simulator.trace import TraceNode, TracePod, device_object, node_object, pod_object

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
