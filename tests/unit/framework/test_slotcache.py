"""``SlotColumns`` (per-key columns recomputed only at the slots whose ``slot_version``
changed) == the column computed from scratch, after every step of random snapshot histories:
nodes added, updated and removed (slots freed and reused, the capacity doubling), pods placed
and removed, pods on nodes the snapshot does not know. NodeResourcesFit's whole-cluster forms,
which keep their columns this way, are held to their per-node forms over the same histories."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.framework.cycle_state import CycleState
from scheduler.framework.slotcache import SlotColumns
from scheduler.framework.types import IntArray, Snapshot
from scheduler.plugins.noderesources import NodeResourcesFit
from scheduler.plugins.noderesources import parse_args as fit_args
from tests.builders import make_node, make_pod

NAMES = [f"n{i}" for i in range(12)]
BULK = 60
"""Nodes set before each history: enough slots that a few changed ones are refreshed alone
(``SlotColumns`` recomputes everything when more than 1/8 of the slots changed)."""


def _free_cpu(snapshot: Snapshot, key: int) -> IntArray:
    def compute(at: IntArray | slice) -> IntArray:
        out: IntArray = (
            (snapshot.allocatable("cpu")[at] - snapshot.requested("cpu")[at] - key) * 2
            + snapshot.pod_count[at]
            + snapshot.live[: snapshot.size][at]
        )
        return out

    return compute  # type: ignore[return-value]


steps = st.lists(
    st.tuples(
        st.sampled_from(["node", "remove", "pod", "unpod", "again", "query"]),
        st.sampled_from(NAMES),
        st.integers(0, 8),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=steps,
    limit=st.sampled_from([1, 3, 32]),
    strategy=st.sampled_from(["LeastAllocated", "MostAllocated"]),
)
def test_columns_equal_a_fresh_computation(
    history: list[tuple[str, str, int]], limit: int, strategy: str
) -> None:
    snapshot = Snapshot(capacity=2)
    for i in range(BULK):
        snapshot.set_node(make_node(f"bulk{i}").cpu(str(i % 9)).memory(f"{i % 7}Gi").build())
    columns = SlotColumns(limit=limit)
    plugin = NodeResourcesFit(fit_args({"scoringStrategy": {"type": strategy}}))
    pods: list[tuple[str, str]] = []
    for i, (what, name, amount) in enumerate(history):
        if what == "node":
            snapshot.set_node(
                make_node(name).cpu(str(amount)).memory(f"{amount}Gi").pods(amount % 4).build()
            )
        elif what == "remove":
            snapshot.remove_node(name)
        elif what == "pod":
            pod = make_pod(f"p{i}").req(cpu=str(amount % 3), memory=f"{amount}Mi").build()
            snapshot.add_pod(name, pod)
            pods.append((name, pod.uid or pod.key))
        elif what == "unpod" and pods:
            node, ident = pods.pop(amount % len(pods))
            snapshot.remove_pod(node, ident)
        elif what == "again" and pods:
            # The same pod again (a bind's echo): the same requests, or others.
            node, ident = pods[amount % len(pods)]
            name = ident.split("/", 1)[1]
            again = make_pod(name).req(cpu=str(amount % 2), memory=f"{amount}Mi").build()
            snapshot.add_pod(node, again)
        for key in (amount % 3, 0, 1):  # every key is kept between steps (unless evicted)
            got = columns.get(snapshot, key, _free_cpu(snapshot, key))
            want = _free_cpu(snapshot, key)(slice(0, snapshot.size))
            assert got.tolist() == want.tolist()
            assert not got.flags.writeable
        # NodeResourcesFit over the same history: mask and scores equal the per-node forms.
        pod = make_pod("x").req(cpu=str(amount % 2), memory=f"{amount}Gi").build()
        state = CycleState()
        plugin.pre_filter(state, pod)
        plugin.pre_score(state, pod, [])
        mask = plugin.filter_nodes(state, pod, snapshot)
        slots = snapshot.live_slots()
        infos = [snapshot.info(int(s)) for s in slots]
        assert [bool(mask[s]) for s in slots] == [
            plugin.filter(state, pod, info) is None for info in infos
        ]
        assert plugin.score_nodes(state, pod, snapshot, slots).tolist() == [
            plugin.score(state, pod, info) for info in infos
        ]


def test_another_snapshot_is_computed_afresh() -> None:
    a, b = Snapshot(), Snapshot()
    a.set_node(make_node("n0").cpu("4").build())
    b.set_node(make_node("n0").cpu("8").build())
    columns = SlotColumns()
    assert columns.get(a, 0, _free_cpu(a, 0)).tolist() == [8 * 1000 + 0 + 1]
    assert columns.get(b, 0, _free_cpu(b, 0)).tolist() == [16 * 1000 + 0 + 1]


def test_the_view_is_read_only() -> None:
    snapshot = Snapshot()
    snapshot.set_node(make_node("n0").cpu("4").build())
    column = SlotColumns().get(snapshot, 0, _free_cpu(snapshot, 0))
    with pytest.raises(ValueError):
        column[0] = 1
    assert np.array_equal(column, [8001])
