"""The FGD fragmentation measure: each case of the definition, and the fast form against it."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.plugins.gpufragmentation.measure import (
    PodShape,
    Workload,
    node_fragmentation,
    typical_shapes,
)

SHARE = PodShape(4000, 500, 1)
WHOLE = PodShape(8000, 1000, 1)
PAIR = PodShape(8000, 1000, 2)
CPU_ONLY = PodShape(2000)
T4_ONLY = PodShape(4000, 500, 1, ("T4",))


@pytest.mark.parametrize(
    ("shape", "cpu", "cards", "model", "expected"),
    [
        # A task that needs no GPU finds every idle GPU useless (x-axis: XL and XR).
        pytest.param(CPU_ONLY, 10_000, [1000, 600, 300, 0], "A10", 1900, id="cpu-only-fits"),
        pytest.param(CPU_ONLY, 1_000, [1000, 600, 300, 0], "A10", 1900, id="cpu-only-lacks-cpu"),
        # The node's model is not one the task accepts.
        pytest.param(T4_ONLY, 10_000, [1000, 600], "A10", 1600, id="no-access"),
        pytest.param(T4_ONLY, 10_000, [1000, 600], "T4", 0, id="access-by-model"),
        # Q1: neither cpu nor a card with 500 free.
        pytest.param(SHARE, 1_000, [400, 300], "A10", 700, id="q1-lacks-both"),
        # Q2: cpu is there, no card has 500 free.
        pytest.param(SHARE, 10_000, [400, 300], "A10", 700, id="q2-lacks-gpu"),
        # Q4: a card has room, the cpu does not.
        pytest.param(SHARE, 3_999, [1000, 300], "A10", 1300, id="q4-lacks-cpu"),
        # Q3: it fits; only the cards that cannot hold 500 are fragments.
        pytest.param(SHARE, 4_000, [1000, 600, 300, 0], "A10", 300, id="q3-share"),
        pytest.param(WHOLE, 8_000, [1000, 600, 300, 0], "A10", 900, id="q3-whole"),
        # Multi-GPU: two idle cards needed.
        pytest.param(PAIR, 8_000, [1000, 900], "A10", 1900, id="pair-one-idle-card-q2"),
        pytest.param(PAIR, 8_000, [1000, 1000, 900], "A10", 900, id="pair-q3"),
        pytest.param(SHARE, 10_000, [], "", 0, id="cpu-node-has-nothing-to-fragment"),
    ],
)
def test_definition_cases(
    shape: PodShape, cpu: int, cards: list[int], model: str, expected: float
) -> None:
    assert node_fragmentation(cpu, cards, model, {shape: 1.0}) == expected
    wl = Workload.of({shape: 1.0})
    free = np.array([cards or [0]], np.int64)
    got = wl.node_values(np.array([cpu]), free, wl.access(model)[None, :])
    assert got[0] == pytest.approx(expected)


def test_expectation_over_the_workload() -> None:
    # 0.5 x 300 (share: Q3) + 0.3 x 900 (whole: Q3) + 0.2 x 1900 (cpu-only: all idle GPU)
    shapes = {SHARE: 0.5, WHOLE: 0.3, CPU_ONLY: 0.2}
    assert node_fragmentation(10_000, [1000, 600, 300, 0], "A10", shapes) == pytest.approx(800)


def _random_nodes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    cards = rng.integers(0, 9, n)
    free = np.zeros((n, 8), np.int64)
    for i, k in enumerate(cards):
        free[i, :k] = rng.choice([0, 100, 190, 300, 500, 810, 1000], k)
    cpu = rng.integers(0, 64_000, n)
    models = [str(m) for m in rng.choice(["T4", "A10", "G2"], n)]
    return cpu, free, models


SHAPES = {
    SHARE: 3.0,
    WHOLE: 2.0,
    PAIR: 1.0,
    CPU_ONLY: 1.5,
    T4_ONLY: 0.5,
    PodShape(12_000, 810, 1): 2.5,
    PodShape(32_000, 1000, 8): 0.25,
}


@pytest.mark.parametrize("seed", [1, 2, 3], ids=lambda s: f"seed{s}")
def test_fast_form_equals_the_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cpu, free, models = _random_nodes(rng, 60)
    wl = Workload.of(SHAPES)
    access = np.array([wl.access(m) for m in models])
    got = wl.node_values(cpu, free, access)
    ref = [
        node_fragmentation(int(cpu[i]), free[i].tolist(), models[i], wl.as_mapping())
        for i in range(len(cpu))
    ]
    assert got == pytest.approx(ref)


@pytest.mark.parametrize("g", [100, 500, 810], ids=lambda g: f"share{g}")
def test_after_shared_equals_placing_on_each_card(g: int) -> None:
    rng = np.random.default_rng(g)
    cpu, free, models = _random_nodes(rng, 30)
    wl = Workload.of(SHAPES)
    access = np.array([wl.access(m) for m in models])
    s, c = wl.sums(free)
    after = wl.after_shared(cpu - 3000, free, free.sum(axis=1), s, c, access, g)
    for i in range(len(cpu)):
        for j in range(free.shape[1]):
            if free[i, j] < g:
                assert after[i, j] == np.inf
                continue
            cards = free[i].copy()
            cards[j] -= g
            ref = node_fragmentation(int(cpu[i]) - 3000, cards.tolist(), models[i], wl.as_mapping())
            assert after[i, j] == pytest.approx(ref)


@pytest.mark.parametrize("seed", [4, 5, 6], ids=lambda s: f"seed{s}")
def test_weights_by_model_kind_equal_the_shape_mask_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cpu, _, models = _random_nodes(rng, 80)
    cpu = cpu - 8000  # a placement's cpu_after can be negative
    cpu[:4] = [0, 2000, 4000, 12_000]  # exactly at a shape's cpu
    wl = Workload.of(SHAPES)
    mask = np.array([wl.access(m) for m in [*models, ""]])
    kinds = np.array([wl.kind(m) for m in [*models, ""]], np.int64)
    cpu = np.append(cpu, 64_000)
    assert np.array_equal(wl.weights(cpu, kinds), wl.weights(cpu, mask))
    assert wl.kind(models[0]) == kinds[0]  # registered once


def test_after_cards_evaluates_alike_cards_once_with_the_same_values() -> None:
    # Idle cards, equal partly used cards and cards that do not fit, on nodes of two models.
    free = np.array(
        [[1000, 1000, 1000, 500, 500, 300, 0, 0], [1000, 810, 810, 810, 1000, 100, 1000, 0]],
        np.int64,
    )
    cpu = np.array([20_000, 9_000], np.int64)
    models = ["T4", "G2"]
    wl = Workload.of(SHAPES)
    kinds = np.array([wl.kind(m) for m in models], np.int64)
    mask = np.array([wl.access(m) for m in models])
    s, c = wl.sums(free)
    for g in (100, 500):
        by_kind = wl.after_shared(cpu - 3000, free, free.sum(axis=1), s, c, kinds, g)
        by_mask = wl.after_shared(cpu - 3000, free, free.sum(axis=1), s, c, mask, g)
        assert np.array_equal(by_kind, by_mask)
        for i in range(2):
            for j in range(8):
                if free[i, j] < g:
                    assert by_kind[i, j] == np.inf
                    continue
                cards = free[i].copy()
                cards[j] -= g
                ref = node_fragmentation(int(cpu[i]) - 3000, cards.tolist(), models[i],
                                         wl.as_mapping())
                assert by_kind[i, j] == ref


def test_after_cards_with_no_fitting_card_is_all_inf() -> None:
    wl = Workload.of(SHAPES)
    free = np.array([[100, 0]], np.int64)
    s, c = wl.sums(free)
    kinds = np.array([wl.kind("T4")], np.int64)
    got = wl.after_shared(np.array([1000]), free, free.sum(axis=1), s, c, kinds, 500)
    assert np.all(got == np.inf)


@pytest.mark.parametrize("k", [1, 2, 8], ids=lambda k: f"whole{k}")
def test_after_whole_equals_taking_idle_cards(k: int) -> None:
    rng = np.random.default_rng(k)
    cpu, free, models = _random_nodes(rng, 40)
    wl = Workload.of(SHAPES)
    access = np.array([wl.access(m) for m in models])
    s, c = wl.sums(free)
    full = (free >= 1000).sum(axis=1)
    after = wl.after_whole(cpu - 8000, full, free.sum(axis=1), s, c, access, k)
    for i in range(len(cpu)):
        idle = [j for j in range(8) if free[i, j] >= 1000]
        if len(idle) < k:
            assert after[i] == np.inf
            continue
        cards = free[i].copy()
        cards[idle[:k]] = 0
        ref = node_fragmentation(int(cpu[i]) - 8000, cards.tolist(), models[i], wl.as_mapping())
        assert after[i] == pytest.approx(ref)


@pytest.mark.parametrize(
    ("counts", "popularity", "expected"),
    [
        pytest.param(
            {SHARE: 6, WHOLE: 3, CPU_ONLY: 1}, 0.9, {SHARE: 6 / 9, WHOLE: 3 / 9}, id="cut"
        ),
        pytest.param({SHARE: 6, WHOLE: 3, CPU_ONLY: 1}, 1.0, None, id="all-shapes"),
        pytest.param({SHARE: 5, WHOLE: 5}, 0.5, {WHOLE: 1.0}, id="tie-goes-to-the-larger"),
        pytest.param({}, 0.95, {}, id="empty"),
    ],
)
def test_typical_shapes(
    counts: dict[PodShape, float], popularity: float, expected: dict[PodShape, float] | None
) -> None:
    got = typical_shapes(counts, popularity)
    if expected is None:
        total = sum(counts.values())
        expected = {k: v / total for k, v in counts.items()}
    assert got == pytest.approx(expected)


def test_workload_of_normalizes_and_drops_zero_weights() -> None:
    wl = Workload.of({SHARE: 2.0, WHOLE: 6.0, CPU_ONLY: 0.0})
    assert wl.as_mapping() == pytest.approx({SHARE: 0.25, WHOLE: 0.75})
    assert wl.n_groups == 2


V100_PAIR = PodShape(32_000, 1000, 2, ("V100M16", "V100M32"))


@pytest.mark.parametrize(
    ("shapes", "model", "expected"),
    [
        # Unconstrained: (4000 + 8000) cpu for (500 + 1000) milli-GPU, equal weights.
        pytest.param({SHARE: 1, WHOLE: 1, CPU_ONLY: 1}, "A10", 12_000 / 1500, id="any-model"),
        # T4_ONLY runs on a T4 only: an A10's GPUs feed WHOLE alone.
        pytest.param({T4_ONLY: 1, WHOLE: 1}, "A10", 8.0, id="constrained-shape-elsewhere"),
        pytest.param({T4_ONLY: 1, WHOLE: 1}, "T4", 12_000 / 1500, id="constrained-shape-here"),
        pytest.param({T4_ONLY: 3, V100_PAIR: 1}, "V100M32", 16.0, id="model-list"),
        # No GPU task can use the node's GPUs: no rate (no stranded-GPU term).
        pytest.param({T4_ONLY: 1, CPU_ONLY: 1}, "P100", 0.0, id="no-gpu-task-runs-there"),
        pytest.param({T4_ONLY: 1}, "", 0.0, id="cpu-only-node"),
    ],
)
def test_cpu_per_gpu_of_counts_only_tasks_that_can_run_there(
    shapes: dict[PodShape, float], model: str, expected: float
) -> None:
    wl = Workload.of(shapes)
    assert wl.cpu_per_gpu_of(model) == pytest.approx(expected, rel=1e-9)


def test_cpu_per_gpu_of_without_constraints_is_the_workload_rate_exactly() -> None:
    wl = Workload.of({SHARE: 2, WHOLE: 3, PAIR: 1, CPU_ONLY: 5})
    assert wl.cpu_per_gpu_of("T4") == wl.cpu_per_gpu_milli == wl.cpu_per_gpu_of("G2")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        pytest.param("T4", 1.0, id="every-gpu-task"),
        pytest.param("A10", 0.75, id="all-but-the-t4-only-task"),
        pytest.param("", 0.75, id="no-model"),
    ],
)
def test_reach_is_the_share_of_gpu_tasks_accepting_the_model(model: str, expected: float) -> None:
    # GPU tasks: SHARE 3 + T4_ONLY 1 (CPU_ONLY does not count).
    wl = Workload.of({SHARE: 3.0, T4_ONLY: 1.0, CPU_ONLY: 4.0})
    assert wl.reach_of(model) == expected
    assert Workload.of({SHARE: 1.0}).reach_of("A10") == 1.0
    assert Workload.of({CPU_ONLY: 1.0}).reach_of("A10") == 0.0


def test_pinned_is_the_share_of_gpu_demand_pinned_to_models_that_accept_the_node() -> None:
    # GPU demand: SHARE 3 x 500 = 1500 (unpinned), T4_ONLY 1 x 500 = 500 (pinned to T4).
    wl = Workload.of({SHARE: 3.0, T4_ONLY: 1.0, CPU_ONLY: 4.0})
    assert wl.pinned_of("T4") == 0.25
    assert wl.pinned_of("A10") == 0.0
    assert Workload.of({SHARE: 1.0}).pinned_of("T4") == 0.0
    assert [wl.kind(m) for m in ("A10", "T4")] == [0, 1]
    assert wl.kind_pinned().tolist() == [0.0, 0.25]
