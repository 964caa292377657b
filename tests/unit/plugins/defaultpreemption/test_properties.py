"""Hypothesis: preemption's victims are minimal, strictly lower in priority, and no card ends
over capacity — on random single-node clusters of fractional GPU pods."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scheduler.simulator.cluster import InMemoryCluster
from tests.builders import GPU_CORE, GPU_MEMORY_RATIO, NVIDIA_GPU
from tests.unit.plugins.defaultpreemption.test_plugin import (
    assert_no_overcommit,
    core_used,
    gpu_node,
    pod,
    scheduler,
    settle,
)

SHARES = st.sampled_from([10, 25, 30, 50, 60, 75, 100])
RESIDENT = st.tuples(st.integers(0, 5), SHARES)
"""(priority, gpu-core percent of one card) of a pod already running."""


def _request(share: int) -> dict[str, str]:
    if share == 100:
        return {NVIDIA_GPU: "1"}
    return {GPU_CORE: str(share), GPU_MEMORY_RATIO: str(share)}


def _place(cards: int, residents: list[tuple[int, int]]) -> tuple[InMemoryCluster, list[str]]:
    """A node of ``cards`` cards with as many of ``residents`` as fit, bound by the scheduler."""
    cluster = InMemoryCluster()
    gpu_node(cluster, "g0", cards)
    sched = scheduler(cluster)
    for i, (priority, share) in enumerate(residents):
        start = f"2026-01-01T00:00:{i:02d}Z"
        cluster.apply_pod(pod(f"r{i}", priority, _request(share), start=start))
    sched.run_until_idle()
    for key in [k for k, p in cluster.pods.items() if not p.node_name]:
        cluster.delete_pod(key)
    # Top every card up to full with priority-0 pods, so that the preemptor needs room.
    for j in range(4 * cards):
        used = core_used(cluster)
        free = [100 - used.get(("g0", m), 0) for m in range(cards)]
        if max(free) == 0:
            break
        cluster.apply_pod(pod(f"fill{j}", 0, _request(max(free)), start="2026-01-02T00:00:00Z"))
        sched.run_until_idle()
    sched.close()
    placed = [k for k, p in cluster.pods.items() if p.node_name]
    for key in [k for k, p in cluster.pods.items() if not p.node_name]:
        cluster.delete_pod(key)
    return cluster, placed


def _bound_copy(
    raws: dict[str, Any], cards: int, keep: list[str]
) -> InMemoryCluster:
    """A fresh cluster with the same node and exactly the pods ``keep`` (bound as they are)."""
    out = InMemoryCluster()
    gpu_node(out, "g0", cards)
    for key in keep:
        raw: dict[str, Any] = dict(raws[key])
        raw["metadata"] = {k: v for k, v in raw["metadata"].items() if k != "resourceVersion"}
        out.apply_pod(raw)
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    cards=st.integers(1, 3),
    residents=st.lists(RESIDENT, min_size=1, max_size=8),
    preemptor_priority=st.integers(1, 6),
    preemptor_share=SHARES,
)
def test_victims_are_lower_priority_minimal_and_nothing_is_overcommitted(
    cards: int,
    residents: list[tuple[int, int]],
    preemptor_priority: int,
    preemptor_share: int,
) -> None:
    cluster, placed = _place(cards, residents)
    raws = {key: cluster.pods[key].raw for key in placed}
    sched = scheduler(cluster)
    sched.run_until_idle()
    cluster.apply_pod(pod("preemptor", preemptor_priority, _request(preemptor_share)))
    settle(sched)
    sched.close()
    assert_no_overcommit(cluster)
    preemptions = list(sched.preemptions)
    event(f"{len(preemptions)} preemption(s)")
    if not preemptions:
        return
    (done,) = preemptions
    victims = [v.key for v in done.victims]
    assert victims, "a preemption with no victim is a plain placement"
    assert all(v.priority < preemptor_priority for v in done.victims)
    assert not set(victims) & set(cluster.pods), "every victim is deleted"
    survivors = [k for k in placed if k not in victims]
    for back in victims:
        # Minimal: with any one victim reprieved the preemptor no longer fits.
        what_if = _bound_copy(raws, cards, [*survivors, back])
        probe = scheduler(what_if)
        probe.run_until_idle()
        what_if.apply_pod(
            pod("probe", -1, _request(preemptor_share))  # too low to preempt anyone
        )
        probe.run_until_idle()
        probe.close()
        assert not what_if.pods["default/probe"].node_name, (
            f"{back} was evicted but the preemptor fits beside it"
        )
