"""The B3 lower bound: never below what a real placement achieves (brute force), and tight
where its rows say it must be."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.simulator.bound import Bound, arrived_at, gpu_bound
from scheduler.simulator.trace import GPU_MILLI, TraceNode, TracePod

pytest.importorskip("highspy", reason="the bound needs the optional 'bound' extra (highspy)")


def node(
    name: str, gpus: int, cpu: int = 64000, memory: int = 262144, model: str = "T4"
) -> TraceNode:
    return TraceNode(name, cpu, memory, gpus, model)


def pod(
    name: str,
    gpus: int,
    milli: int,
    cpu: int = 1000,
    memory: int = 1024,
    spec: tuple[str, ...] = (),
) -> TracePod:
    return TracePod(name, cpu, memory, gpus, milli if gpus else 0, spec)


def brute_force(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> int:
    """The most GPU milli any real placement of ``pods`` allocates (pods may stay unplaced)."""
    best = 0
    cards = [[GPU_MILLI] * n.gpus for n in nodes]
    cpu = [n.cpu_milli for n in nodes]
    mem = [n.memory_mib for n in nodes]

    def place(i: int, allocated: int) -> None:
        nonlocal best
        best = max(best, allocated)
        if i == len(pods):
            return
        p = pods[i]
        place(i + 1, allocated)  # left unplaced
        if not p.num_gpu:
            return
        for n, nd in enumerate(nodes):
            if p.gpu_spec and nd.model not in p.gpu_spec:
                continue
            if cpu[n] < p.cpu_milli or mem[n] < p.memory_mib:
                continue
            if p.gpu_milli == GPU_MILLI:
                options: list[tuple[int, ...]] = [
                    c
                    for c in itertools.combinations(range(nd.gpus), p.num_gpu)
                    if all(cards[n][j] == GPU_MILLI for j in c)
                ]
            else:
                options = [(j,) for j in range(nd.gpus) if cards[n][j] >= p.gpu_milli]
            for chosen in options:
                for j in chosen:
                    cards[n][j] -= p.gpu_milli
                cpu[n] -= p.cpu_milli
                mem[n] -= p.memory_mib
                place(i + 1, allocated + p.total_gpu_milli)
                for j in chosen:
                    cards[n][j] += p.gpu_milli
                cpu[n] += p.cpu_milli
                mem[n] += p.memory_mib

    place(0, 0)
    return best


@pytest.mark.parametrize(
    ("nodes", "pods", "expected"),
    [
        pytest.param([node("n", 1)], [pod("a", 1, 600), pod("b", 1, 600)], 600, id="two-over-half"),
        pytest.param(
            [node("n", 1)],
            [pod("a", 1, 400), pod("b", 1, 400), pod("c", 1, 400)],
            800,
            id="three-over-third",
        ),
        pytest.param(
            [node("n", 2, cpu=4000)],
            [pod("a", 1, 1000, cpu=3000), pod("b", 1, 1000, cpu=3000)],
            1000,
            id="cpu-bound",
        ),
        pytest.param(
            [node("n", 2, model="T4")],
            [pod("a", 1, 1000, spec=("A10",))],
            0,
            id="model",
        ),
        pytest.param([node("n", 2)], [pod("a", 4, 1000)], 0, id="too-many-gpus"),
        pytest.param(
            [node("n", 4)],
            [pod("a", 1, 1000), pod("b", 1, 500), pod("c", 2, 1000)],
            3500,
            id="mixed-fits",
        ),
        pytest.param([node("n", 2)], [pod("cpu", 0, 0)], 0, id="cpu-only"),
    ],
)
def test_bound_is_exact_on_small_cases(
    nodes: list[TraceNode], pods: list[TracePod], expected: int
) -> None:
    assert brute_force(nodes, pods) == expected
    bound = gpu_bound(nodes, pods)
    assert bound.allocatable_milli == pytest.approx(expected)
    assert bound.exact


_milli = st.sampled_from([100, 250, 300, 400, 500, 600, 700, 1000])


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[TraceNode], list[TracePod]]:
    nodes = [
        node(
            f"n{i}",
            draw(st.integers(1, 2)),
            cpu=draw(st.sampled_from([2000, 4000, 8000])),
            model=draw(st.sampled_from(["T4", "A10"])),
        )
        for i in range(draw(st.integers(1, 2)))
    ]
    pods = []
    for i in range(draw(st.integers(0, 5))):
        gpus = draw(st.sampled_from([0, 1, 1, 1, 2]))
        milli = 1000 if gpus == 2 else draw(_milli)
        spec = draw(st.sampled_from([(), (), ("T4",), ("A10",)]))
        pods.append(
            pod(f"p{i}", gpus, milli, cpu=draw(st.sampled_from([500, 1500, 3000])), spec=spec)
        )
    return nodes, pods


@settings(max_examples=150, deadline=None)
@given(instances())
def test_bound_never_below_the_best_real_placement(
    case: tuple[list[TraceNode], list[TracePod]],
) -> None:
    nodes, pods = case
    bound = gpu_bound(nodes, pods)
    best = brute_force(nodes, pods)
    assert bound.allocatable_milli >= best - 1e-6
    assert bound.allocatable_milli <= min(bound.capacity_milli, bound.arrived_milli) + 1e-6
    assert bound.unallocated_pct <= 100.0 * (1 - best / bound.capacity_milli) + 1e-9


@pytest.mark.parametrize(
    ("millis", "arrived"),
    [
        # capacity 1000: cumulative 30%, 60%, 99.6% (rounds to 100), 100.4% (100), 110%
        pytest.param([300, 300, 396, 8, 96], 4, id="last-pod-rounding-to-100"),
        # 98%, then 101%: no point rounds to 100, so the report uses the one within 1%
        pytest.param([980, 30, 10], 2, id="within-one-percent"),
        # 50%, then 150%: the report has no point at 100 either
        pytest.param([500, 1000], None, id="jump-over"),
    ],
)
def test_arrived_at_matches_the_report_bucket(millis: list[int], arrived: int | None) -> None:
    pods = [pod(f"p{i}", 1, m) for i, m in enumerate(millis)]
    assert arrived_at(pods, 1000) == (None if arrived is None else pods[:arrived])


def test_unallocated_pct() -> None:
    assert Bound(1000, 1000, 900.0, True).unallocated_pct == pytest.approx(10.0)
    assert Bound(0, 0, 0.0, True).unallocated_pct == 0.0
