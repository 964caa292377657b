"""The FGD paper's replay method: arrival and inflation, determinism, and small exact replays."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from scheduler.config import parse_config
from scheduler.plugins.gpufragmentation.measure import PodShape
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.replay import (
    ArrivingPod,
    arrival,
    capacity_milli,
    node_order,
    prepare_config,
    replay,
    trace_shapes,
)
from scheduler.simulator.trace import TraceNode, TracePod


def _pods(*millis: int) -> list[TracePod]:
    return [
        TracePod(f"p{i}", 1000, 1024, 1 if m else 0, m)
        if m <= 1000
        else TracePod(f"p{i}", 1000, 1024, m // 1000, 1000)
        for i, m in enumerate(millis)
    ]


@pytest.mark.parametrize(
    ("millis", "capacity", "inflate", "expected_total", "expected_count"),
    [
        # 400 arrived; 400-pod samples until the next would pass 1300: 400 + 400 + 400.
        pytest.param([400], 1000, 1.3, 1200, 3, id="inflate-stops-before-passing"),
        # The stop is at the first sample that would pass, even if a smaller one would fit.
        pytest.param([1000], 1000, 1.5, 1000, 1, id="first-sample-too-big-stops"),
        pytest.param([500, 500], 1000, 1.0, 1000, 2, id="already-there"),
        # Deflate: random pods removed until the request is within 0.5 x capacity.
        pytest.param([300, 300, 300], 1000, 0.5, 300, 1, id="deflate"),
        pytest.param([0, 0], 1000, 1.3, 0, 2, id="cpu-only-trace-is-not-inflated"),
        pytest.param([400], 1000, 0.0, 400, 1, id="inflate-0-keeps-the-trace"),
    ],
)
def test_inflation_stopping_rule(
    millis: list[int], capacity: int, inflate: float, expected_total: int, expected_count: int
) -> None:
    order = arrival(_pods(*millis), capacity, seed=42, inflate=inflate)
    assert sum(a.pod.total_gpu_milli for a in order) == expected_total
    assert len(order) == expected_count


def test_arrival_is_a_seeded_shuffle_then_named_samples() -> None:
    pods = _pods(*([100] * 10))
    a = arrival(pods, 1000, seed=1, inflate=1.5)
    b = arrival(pods, 1000, seed=1, inflate=1.5)
    c = arrival(pods, 1000, seed=2, inflate=1.5)
    assert a == b and a != c
    assert sorted(x.name for x in a[:10]) == sorted(p.name for p in pods)
    assert [x.name.split("-tuned-")[1] for x in a[10:]] == ["0", "1", "2", "3", "4"]
    assert sum(x.pod.total_gpu_milli for x in a) == 1500


def test_trace_shapes_counts_cpu_only_and_models() -> None:
    pods = [
        TracePod("a", 1000, 1, 1, 500),
        TracePod("b", 1000, 2, 1, 500),
        TracePod("c", 2000, 1, 0, 0),
        TracePod("d", 2000, 1, 2, 1000, ("A10",)),
    ]
    assert trace_shapes(pods) == {
        PodShape(1000, 500, 1): 2.0,
        PodShape(2000): 1.0,
        PodShape(2000, 1000, 2, ("A10",)): 1.0,
    }


def _config(args: dict[str, Any] | None = None) -> Any:
    profile: dict[str, Any] = {"schedulerName": "s"}
    if args is not None:
        profile["plugins"] = {
            "preFilter": {"enabled": [{"name": "GPUFragmentation"}]},
            "score": {"disabled": [{"name": "*"}], "enabled": [{"name": "GPUFragmentation"}]},
        }
        profile["pluginConfig"] = [{"name": "GPUFragmentation", "args": args}]
    return parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "percentageOfNodesToScore": 100,
            "profiles": [profile],
        }
    )


def test_prepare_config_fixes_the_workload_and_seed() -> None:
    shapes = {PodShape(1000, 500, 1): 2.0}
    config = prepare_config(
        _config({"targetWorkload": {"window": 100, "popularity": 0.9}}), shapes, 7
    )
    args = config.profiles[0].args_for("GPUFragmentation")
    assert args["randomSeed"] == 7
    assert args["targetWorkload"] == {
        "shapes": [{"cpuMilli": 1000, "weight": 2.0, "gpuMilli": 500, "gpuCount": 1}],
        "window": 0,
        "popularity": 0.9,
    }
    untouched = _config()
    assert prepare_config(untouched, shapes, 7) == untouched


# A few dozen nodes of the trace's kinds, and a pod mix like the default trace's.
NODES = [
    TraceNode(f"n{i:02d}", cpu, 262144, gpus, model)
    for i, (cpu, gpus, model) in enumerate(
        [(96000, 8, "G2")] * 10
        + [(104000, 2, "G3")] * 10
        + [(16000, 2, "T4")] * 8
        + [(32000, 4, "P100")] * 4
    )
]


def _mix(n: int, seed: int) -> list[TracePod]:
    rng = random.Random(seed)
    kinds = [
        (3152, 1, 810),
        (11300, 1, 1000),
        (11908, 1, 470),
        (12500, 0, 0),
        (4000, 1, 320),
        (18708, 2, 1000),
        (64000, 8, 1000),
    ]
    weights = [25, 30, 15, 12, 10, 5, 3]
    pods = []
    for i in range(n):
        cpu, count, milli = rng.choices(kinds, weights)[0]
        pods.append(TracePod(f"p{i:03d}", cpu, 4096, count, milli))
    return pods


def _run(config: Any, seed: int) -> Any:
    pods = _mix(60, 0)
    order = arrival(pods, capacity_milli(NODES), seed, 1.3)
    shapes = trace_shapes(pods)
    return replay(
        NODES,
        order,
        prepare_config(config, shapes, seed),
        in_tree_registry(),
        default_plugins(),
        shapes,
        seed=seed,
    ), order


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(None, id="default-profile"),
        pytest.param({"tieBreak": ["SmallestNode", "FirstFit"]}, id="fragmentation"),
    ],
)
def test_same_seed_same_placements(args: dict[str, Any] | None) -> None:
    first, _ = _run(_config(args), 3)
    again, _ = _run(_config(args), 3)
    assert first.nodes == again.nodes
    assert np.array_equal(first.allocated, again.allocated)
    assert np.array_equal(first.fragmented, again.fragmented)


def test_curves_are_consistent() -> None:
    result, order = _run(_config({"tieBreak": ["FirstFit"]}), 5)
    assert len(result.nodes) == len(order)
    assert np.all(np.diff(result.arrived) >= 0) and np.all(result.allocated <= result.arrived)
    assert result.capacity_milli == capacity_milli(NODES)
    placed = sum(a.pod.total_gpu_milli for a, n in zip(order, result.nodes, strict=True) if n)
    assert result.allocated[-1] == placed
    assert result.occupied[-1] == len({n for n in result.nodes if n})


def test_one_node_replay_exactly() -> None:
    # One 2-GPU node, 4 cores: pods arrive in seeded order, each gets one attempt.
    nodes = [TraceNode("n0", 4000, 65536, 2, "T4")]
    pods = [
        ArrivingPod(p.name, p)
        for p in [
            TracePod("a", 1000, 1024, 1, 600),
            TracePod("b", 1000, 1024, 1, 600),
            TracePod("c", 1000, 1024, 1, 400),
            TracePod("d", 1000, 1024, 2, 1000),  # two idle cards: none left
            TracePod("e", 1000, 1024, 1, 300),  # 400 + 400 free: fits
            TracePod("f", 1000, 1024, 0, 0),  # cpu is all taken by now
        ]
    ]
    shapes = {PodShape(1000, 600, 1): 1.0}
    config = prepare_config(_config({"tieBreak": ["FirstFit"]}), shapes, 0)
    result = replay(nodes, pods, config, in_tree_registry(), default_plugins(), shapes)
    assert result.nodes == ["n0", "n0", "n0", "", "n0", ""]
    assert result.arrived.tolist() == [600, 1200, 1600, 3600, 3900, 3900]
    assert result.allocated.tolist() == [600, 1200, 1600, 1600, 1900, 1900]
    assert result.occupied.tolist() == [1] * 6


def test_few_dozen_nodes_replay_exactly() -> None:
    args = {
        "gradient": {"quantization": "Linear", "resolution": 1, "strandedWeight": 0},
        "tieBreak": ["SmallestNode", "FirstFit"],
    }
    result, order = _run(_config(args), 3)
    assert (len(order), result.failed, result.capacity_milli) == (189, 36, 132000)
    assert int(result.allocated[-1]) == 121780
    assert float(result.fragmented[-1]) == pytest.approx(10220.0)
    assert int(result.occupied[-1]) == 32
    assert result.nodes[:12] == [
        "n10", "n00", "n28", "n28", "n10", "n20", "n21", "n29", "n10", "n22", "n22", "n30",
    ]  # fmt: skip


def test_node_order_is_seeded_and_complete() -> None:
    a, b = node_order(NODES, 1), node_order(NODES, 2)
    assert a == node_order(NODES, 1) and a != b
    assert sorted(n.name for n in a) == sorted(n.name for n in NODES)


def test_prepare_config_can_leave_the_learned_workload() -> None:
    workload = {"window": 100, "shapes": [{"cpuMilli": 1000}]}
    config = prepare_config(_config({"targetWorkload": workload}), None, 7)
    args = config.profiles[0].args_for("GPUFragmentation")
    assert args["targetWorkload"] == workload and args["randomSeed"] == 7
