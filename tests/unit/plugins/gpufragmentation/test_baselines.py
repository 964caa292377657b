"""The paper's DotProduct, GPUClustering and GPUPacking baselines: their scores by hand, the
numpy forms against the reference forms, and each one's choices on hand-made clusters through
the real scheduler."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY_RATIO
from scheduler.devices.request import CardUse, Holding
from scheduler.plugins.gpufragmentation.baselines import (
    NO_TAG,
    SHARED_TAG,
    clustering_one,
    clustering_scores,
    dot_product_one,
    dot_product_scores,
    holding_tag,
    node_tags,
    packing_one,
    packing_scores,
)
from scheduler.simulator.trace import TraceNode, TracePod
from tests.unit.plugins.gpufragmentation.test_plugin import Harness, _pod

# -- the scores, by hand ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_free", "gpu_free", "cpu", "gpu", "expected"),
    [
        # dot = 0.75 * 0.0625 + 1 * 0.125 = 0.171875; 100 * (1 - 0.0859375) = 91.4
        pytest.param(96_000, 8000, 8000, 1000, 91, id="big-idle-node"),
        # dot = 0.25 * 0.0625 + 0.25 * 0.125 = 0.046875 -> 97.6
        pytest.param(32_000, 2000, 8000, 1000, 97, id="small-idle-node"),
        pytest.param(0, 0, 8000, 1000, 100, id="empty-node"),
        pytest.param(128_000, 8000, 128_000, 8000, 0, id="whole-node-pod"),
        # CPU-only: only the cpu term. 0.5 * 0.25 = 0.125 -> 93.75
        pytest.param(64_000, 8000, 32_000, 0, 93, id="cpu-only"),
    ],
)
def test_dot_product(cpu_free: int, gpu_free: int, cpu: int, gpu: int, expected: int) -> None:
    assert dot_product_one(cpu_free, gpu_free, cpu, gpu) == expected
    batch = dot_product_scores(np.array([cpu_free]), np.array([gpu_free]), cpu, gpu)
    assert batch.tolist() == [expected]


@pytest.mark.parametrize(
    ("pod_tag", "tags", "gpu_free", "expected"),
    [
        pytest.param(SHARED_TAG, 0b1, 4000, 75 + 12, id="only-my-tag"),
        pytest.param(SHARED_TAG, 0b11, 4000, 50 + 12, id="my-tag-among-others"),
        pytest.param(SHARED_TAG, 0, 8000, 25, id="idle-8-gpu-node"),
        pytest.param(SHARED_TAG, 0, 2000, 25 + 18, id="idle-2-gpu-node"),
        pytest.param(SHARED_TAG, 0b10, 0, 25, id="other-tag-full"),
        pytest.param(2, 0b100, 6000, 75 + 6, id="two-whole-cards"),
        pytest.param(NO_TAG, 0b1, 0, 0, id="cpu-only-pod"),
    ],
)
def test_clustering(pod_tag: int, tags: int, gpu_free: int, expected: int) -> None:
    assert clustering_one(pod_tag, tags, gpu_free) == expected
    batch = clustering_scores(pod_tag, np.array([tags]), np.array([gpu_free]))
    assert batch.tolist() == [expected]


@pytest.mark.parametrize(
    ("shares", "n_cards", "count", "expected"),
    [
        pytest.param([1000] * 8, 8, 1, 25, id="idle-8-gpu-node"),
        pytest.param([1000] * 2, 2, 1, 31, id="idle-2-gpu-node"),
        pytest.param([1000] * 30, 30, 1, 30, id="idle-node-capped-by-its-cards"),
        pytest.param([400, 1000], 2, 1, 96, id="a-used-card"),
        pytest.param([400, 700, 1000], 3, 1, 96, id="the-fullest-used-card"),
        pytest.param([0, 1000, 1000], 3, 1, 49, id="an-idle-card-on-a-used-node"),
        pytest.param([0, 1000, 1000], 3, 2, 48, id="two-idle-cards-on-a-used-node"),
        pytest.param([0, 1000], 3, 2, 0, id="too-few-cards"),
        pytest.param([400, 1000], 2, 0, 0, id="cpu-only-pod"),
    ],
)
def test_packing(shares: list[int], n_cards: int, count: int, expected: int) -> None:
    milli = 1000 if count != 1 else 300
    fitting = [j for j, s in enumerate(shares) if s >= milli]
    assert packing_one(shares, fitting, n_cards, count) == expected
    share = np.array([shares], np.int64)
    batch = packing_scores(share, share >= milli, np.array([n_cards]), count)
    assert batch.tolist() == [expected]


def _holding(*cards: tuple[int, int]) -> Holding:
    uses = tuple(
        CardUse.of(DEVICE_GPU, minor, {GPU_CORE: core, GPU_MEMORY_RATIO: core})
        for minor, core in cards
    )
    return Holding("uid", "n", uses)


@pytest.mark.parametrize(
    ("holding", "tag"),
    [
        pytest.param(_holding((0, 50)), SHARED_TAG, id="share"),
        pytest.param(_holding((3, 100)), 1, id="one-whole-card"),
        pytest.param(_holding((0, 100), (1, 100)), 2, id="two-whole-cards"),
        pytest.param(Holding("uid", "n", ()), NO_TAG, id="no-gpu"),
    ],
)
def test_holding_tag(holding: Holding, tag: int) -> None:
    assert holding_tag(holding) == tag


def test_node_tags_is_the_set_of_its_holders_tags() -> None:
    holdings = [_holding((0, 50)), _holding((1, 30)), _holding((2, 100), (3, 100))]
    assert node_tags(holdings) == 0b101
    assert node_tags([]) == 0


# -- the numpy forms equal the reference forms --------------------------------------------------

_SHARES = st.lists(st.sampled_from([0, 100, 250, 500, 600, 1000]), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(st.tuples(_SHARES, st.integers(0, 128_000), st.integers(0, 255)), min_size=1,
                   max_size=6),
    milli=st.sampled_from([100, 500, 1000]),
    count=st.integers(0, 8),
    cpu=st.integers(0, 64_000),
)
def test_numpy_forms_equal_the_references(
    nodes: Sequence[tuple[list[int], int, int]], milli: int, count: int, cpu: int
) -> None:
    width = max(len(s) for s, _, _ in nodes)
    share = np.array([s + [0] * (width - len(s)) for s, _, _ in nodes], np.int64)
    fits = share >= milli
    n_cards = np.array([len(s) for s, _, _ in nodes], np.int64)
    cpu_free = np.array([c for _, c, _ in nodes], np.int64)
    tags = np.array([t for _, _, t in nodes], np.int64)
    total = share.sum(axis=1)
    gpu = count * milli
    pod_tag = NO_TAG if count == 0 else (SHARED_TAG if milli < 1000 and count == 1 else count)
    assert dot_product_scores(cpu_free, total, cpu, gpu).tolist() == [
        dot_product_one(int(c), int(t), cpu, gpu) for c, t in zip(cpu_free, total, strict=True)
    ]
    assert clustering_scores(pod_tag, tags, total).tolist() == [
        clustering_one(pod_tag, int(g), int(t)) for g, t in zip(tags, total, strict=True)
    ]
    assert packing_scores(share, fits, n_cards, count).tolist() == [
        packing_one(s, [j for j, v in enumerate(s) if v >= milli], len(s), count)
        for s, _, _ in nodes
    ]


# -- each baseline's choices on hand-made clusters (the real scheduler) -------------------------


BIG_AND_SMALL = [
    TraceNode("big", 96_000, 262_144, 8, "T4"),
    TraceNode("small", 32_000, 65_536, 2, "T4"),
]
EIGHT_AND_TWO = [
    TraceNode("eight", 96_000, 262_144, 8, "T4"),
    TraceNode("two", 32_000, 65_536, 2, "T4"),
]


def _run(nodes: Sequence[TraceNode], strategy: str, pods: Sequence[TracePod]) -> list[str]:
    h = Harness(nodes, strategy=strategy, tieBreak=["FirstFit"])
    try:
        return [h.place(p)[0] for p in pods]
    finally:
        h.close()


@pytest.mark.parametrize(
    ("strategy", "nodes", "pods", "expected"),
    [
        pytest.param(
            "DotProduct",
            BIG_AND_SMALL,
            [_pod("a", 1000, cpu=8000), _pod("b", 1000, cpu=8000), _pod("c", 1000, cpu=8000)],
            # small: 97 then (24 cores, 1 GPU left) 98; then it is full: big.
            ["small", "small", "big"],
            id="dotprod-least-aligned-free-resources",
        ),
        pytest.param(
            "DotProduct",
            BIG_AND_SMALL,
            [_pod("cpu", 0, cpu=16_000)],
            ["small"],
            id="dotprod-cpu-only-to-the-least-free-cpu",
        ),
        pytest.param(
            "GPUClustering",
            [TraceNode(f"n{i}", 32_000, 65_536, 4, "T4") for i in range(3)],
            [
                _pod("share1", 500),  # every node idle (37): the earliest
                _pod("whole1", 1000),  # n0 holds shares (14), n1/n2 idle (37): n1
                _pod("share2", 300),  # n0 holds only shares: 75 + 15
                _pod("two", 1000, count=2),  # n0/n1 other tags, n2 idle: n2
                _pod("whole2", 1000),  # n1 holds only 1-card pods: n1
                _pod("cpu", 0),  # a CPU-only pod scores 0 everywhere: the earliest
            ],
            ["n0", "n1", "n0", "n2", "n1", "n0"],
            id="clustering-pods-of-a-kind-together",
        ),
        pytest.param(
            "GPUPacking",
            EIGHT_AND_TWO,
            [
                _pod("s1", 500),  # idle nodes: 33 - 8 = 25 against 33 - 2 = 31
                _pod("s2", 300),  # a used card on "two": 100 - 50 // 10 = 95
                _pod("w1", 1000),  # an idle card on a used node: 49 against 25
                _pod("w2", 1000, count=2),  # "two" has no idle card left
            ],
            ["two", "two", "two", "eight"],
            id="packing-used-cards-first",
        ),
    ],
)
def test_baseline_choices(
    strategy: str, nodes: Sequence[TraceNode], pods: Sequence[TracePod], expected: list[str]
) -> None:
    assert _run(nodes, strategy, pods) == expected


def test_packing_shares_the_used_card() -> None:
    nodes = [TraceNode("two", 32_000, 65_536, 2, "T4")]
    h = Harness(nodes, strategy="GPUPacking", tieBreak=["FirstFit"])
    try:
        _, first = h.place(_pod("s1", 500))
        _, second = h.place(_pod("s2", 300))
        assert first == second
    finally:
        h.close()


def test_clustering_sees_a_node_freed_by_a_deletion() -> None:
    nodes = [TraceNode(f"n{i}", 32_000, 65_536, 4, "T4") for i in range(2)]
    h = Harness(nodes, strategy="GPUClustering", tieBreak=["FirstFit"])
    try:
        assert h.place(_pod("share1", 500))[0] == "n0"
        assert h.place(_pod("whole1", 1000))[0] == "n1"
        assert h.place(_pod("share2", 300))[0] == "n0"
        h.cluster.delete_pod("openb/whole1")
        h.sched.drain()
        # n1 is idle again (25 + 12) and beats n0, which holds shares only (0 + 15); with n1's
        # tags left stale ("one whole card": 0 + 12) the pod would go to n0.
        assert h.place(_pod("pair", 1000, count=2))[0] == "n1"
    finally:
        h.close()
