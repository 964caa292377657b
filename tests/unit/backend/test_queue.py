"""Tests for scheduler.backend.queue: order, backoff, flush, moves on events, the move cycle."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis.core import Pod, decode_node, decode_pod
from scheduler.backend.queue import SchedulingQueue, backoff_duration
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    NODE_ADD,
    NODE_UPDATE,
    UNSCHEDULABLE_TIMEOUT,
    Action,
    ClusterEvent,
    Resource,
)
from scheduler.framework.interfaces import QueuedPodInfo
from scheduler.plugins.prioritysort import PrioritySort
from tests.fakes import FakeClock

# ---------------------------------------------------------------------------------------------
# helpers


def make_pod(name: str, priority: int = 0, **spec: Any) -> Pod:
    labels = spec.pop("labels", {})
    return decode_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"priority": priority, "containers": [{"name": "c"}], **spec},
        }
    )


def priority_sort(a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
    """kube's PrioritySort: higher priority first, then the earlier queue timestamp."""
    pa, pb = a.pod.priority, b.pod.priority
    return pa > pb or (pa == pb and a.timestamp < b.timestamp)


def make_queue(
    clock: FakeClock, registered: dict[ClusterEvent, frozenset[str]] | None = None
) -> tuple[SchedulingQueue, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    q = SchedulingQueue(
        priority_sort,
        clock,
        registered_events=registered,
        on_incoming=lambda queue, event: seen.append((queue, event)),
    )
    return q, seen


def fail(q: SchedulingQueue, qpi: QueuedPodInfo, *plugins: str, cycle: int | None = None) -> None:
    """Hand a popped pod back as the scheduler does after a failed attempt."""
    qpi.unschedulable_plugins.update(plugins)
    assert q.add_unschedulable_if_not_present(qpi, q.scheduling_cycle if cycle is None else cycle)


def where(q: SchedulingQueue, key: str) -> str:
    return q.sub_queue_of(key) or "none"


def pop_all(q: SchedulingQueue) -> list[str]:
    out = []
    while (qpi := q.pop()) is not None:
        out.append(qpi.pod.name)
    return out


# ---------------------------------------------------------------------------------------------
# QueueSort order


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            [("a", 0, 0.0), ("b", 10, 1.0), ("c", 5, 2.0)], ["b", "c", "a"], id="priority"
        ),
        pytest.param([("a", 0, 2.0), ("b", 0, 0.0), ("c", 0, 1.0)], ["b", "c", "a"], id="age"),
        pytest.param(
            [("a", 1, 3.0), ("b", 2, 4.0), ("c", 1, 0.0), ("d", 2, 1.0)],
            ["d", "b", "c", "a"],
            id="priority-then-age",
        ),
        pytest.param(
            [("a", 0, 0.0), ("b", 0, 0.0), ("c", 0, 0.0), ("d", 0, 0.0)],
            ["a", "b", "c", "d"],
            id="ties-fifo",
        ),
    ],
)
def test_pop_order(pods: list[tuple[str, int, float]], expected: list[str]) -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    for name, priority, t in sorted(pods, key=lambda p: p[2]):
        clock.set(t)
        q.add(make_pod(name, priority))
    assert pop_all(q) == expected


def test_pop_empty_and_bookkeeping() -> None:
    clock = FakeClock(5.0)
    q, _ = make_queue(clock)
    assert q.pop() is None
    assert q.scheduling_cycle == 0
    q.add(make_pod("a"))
    clock.advance(2)
    qpi = q.pop()
    assert qpi is not None
    assert (qpi.attempts, qpi.timestamp, qpi.initial_attempt_timestamp) == (1, 5.0, 7.0)
    assert q.scheduling_cycle == 1
    fail(q, qpi)  # an error: straight to backoff
    clock.advance(1)
    q.flush()
    qpi.unschedulable_plugins.add("stale")
    again = q.pop()
    assert again is qpi
    assert (qpi.attempts, qpi.initial_attempt_timestamp) == (2, 7.0)
    assert qpi.unschedulable_plugins == set()  # cleared for the new attempt
    assert q.scheduling_cycle == 2


# ---------------------------------------------------------------------------------------------
# backoff


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (6, 10.0), (500, 10.0)],
    ids=lambda v: str(v),
)
def test_backoff_duration(attempts: int, expected: float) -> None:
    assert backoff_duration(attempts, 1.0, 10.0) == expected


def test_backoff_sequence_with_clock() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    q.add(make_pod("a"))
    waits = []
    for _ in range(6):
        qpi = q.pop()
        assert qpi is not None
        clock.advance(0.25)  # the attempt takes a while; backoff counts from the failure
        fail(q, qpi)
        failed_at = clock.now()
        wakeup = q.next_wakeup()
        assert wakeup is not None
        waits.append(wakeup - failed_at)
        clock.set(wakeup - 0.001)
        q.flush()
        assert q.pop() is None, "still backing off"
        clock.set(wakeup)
        q.flush()
        assert q.pending_counts()["active"] == 1
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_flush_moves_only_completed_backoffs() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock)
    attempts = {"a": 1, "b": 2, "c": 3}  # backoffs 1 s, 2 s, 4 s
    for name in attempts:
        q.add(make_pod(name))
    for qpi in [q.pop() for _ in attempts]:
        assert qpi is not None
        qpi.attempts = attempts[qpi.pod.name]
        fail(q, qpi)
    seen.clear()
    clock.set(2.5)
    q.flush()
    assert q.pending_counts() == {"active": 2, "backoff": 1, "unschedulable": 0, "gated": 0}
    assert sorted(pop_all(q)) == ["a", "b"]
    assert seen == [("active", "BackoffComplete")] * 2
    assert q.next_wakeup() == 4.0


# ---------------------------------------------------------------------------------------------
# the unschedulable pool


def test_unschedulable_pool_flushed_after_timeout() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock, {NODE_ADD: frozenset({"A"})})
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    fail(q, qpi, "A")
    assert q.pending_counts() == {"active": 0, "backoff": 0, "unschedulable": 1, "gated": 0}
    assert q.next_wakeup() == 300.0
    clock.set(299.9)
    q.flush()
    assert where(q, qpi.key) == "unschedulable"
    clock.set(300.0)
    q.flush()
    assert where(q, qpi.key) == "active"
    assert seen[-1] == ("active", UNSCHEDULABLE_TIMEOUT.name)
    assert q.next_wakeup() is None


def test_pool_timeout_only_for_old_pods() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    for name in ("old", "new"):
        q.add(make_pod(name))
        qpi = q.pop()
        assert qpi is not None
        fail(q, qpi, "A")
        clock.advance(100)
    clock.set(350)
    q.flush()
    assert (where(q, "ns/old"), where(q, "ns/new")) == ("active", "unschedulable")


REGISTERED = {
    NODE_ADD: frozenset({"A"}),
    ClusterEvent(Resource.NODE, Action.UPDATE | Action.DELETE): frozenset({"C"}),
    ASSIGNED_POD_DELETE: frozenset({"B"}),
    ClusterEvent(Resource.WILDCARD, Action.DELETE): frozenset({"W"}),
}


@pytest.mark.parametrize(
    ("rejectors", "event", "moves"),
    [
        pytest.param({"A"}, NODE_ADD, True, id="A-on-NodeAdd"),
        pytest.param({"A"}, ASSIGNED_POD_DELETE, False, id="A-not-on-AssignedPodDelete"),
        pytest.param({"B"}, ASSIGNED_POD_DELETE, True, id="B-on-AssignedPodDelete"),
        pytest.param({"B"}, NODE_ADD, False, id="B-not-on-NodeAdd"),
        pytest.param({"A", "B"}, NODE_ADD, True, id="any-rejector-suffices"),
        pytest.param({"C"}, NODE_UPDATE, True, id="action-flags-match"),
        pytest.param({"C"}, NODE_ADD, False, id="action-flags-differ"),
        pytest.param({"W"}, ASSIGNED_POD_DELETE, True, id="wildcard-registration"),
        pytest.param({"Z"}, NODE_ADD, False, id="unregistered-plugin"),
        pytest.param({"Z"}, UNSCHEDULABLE_TIMEOUT, True, id="wildcard-event-moves-all"),
    ],
)
def test_move_on_registered_event_only(
    rejectors: set[str], event: ClusterEvent, moves: bool
) -> None:
    clock = FakeClock()
    q, seen = make_queue(clock, REGISTERED)
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    fail(q, qpi, *rejectors)
    clock.advance(1)  # backoff (1 s) over
    q.move_all_to_active_or_backoff(event)
    assert where(q, qpi.key) == ("active" if moves else "unschedulable")
    if moves:
        assert seen[-1] == ("active", event.name)


def test_moved_pod_still_backing_off_goes_to_backoff() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock, REGISTERED)
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    fail(q, qpi, "A")
    clock.advance(0.5)
    q.node_added(decode_node({"metadata": {"name": "n1"}}))
    assert where(q, qpi.key) == "backoff"
    assert seen[-1] == ("backoff", "NodeAdd")
    assert q.next_wakeup() == 1.0


@pytest.mark.parametrize(
    ("unschedulable", "pending", "event", "expected"),
    [
        pytest.param({"A"}, set(), NODE_ADD, "active", id="unschedulable-plugin"),
        pytest.param(set(), {"A"}, NODE_ADD, "active", id="pending-plugin"),
        pytest.param(set(), {"A"}, ASSIGNED_POD_DELETE, "unschedulable", id="pending-no-match"),
        pytest.param({"B"}, {"A"}, NODE_ADD, "active", id="union-of-both"),
    ],
)
def test_pending_plugins_are_rejectors(
    unschedulable: set[str], pending: set[str], event: ClusterEvent, expected: str
) -> None:
    clock = FakeClock()
    q, _ = make_queue(clock, REGISTERED)
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    qpi.pending_plugins.update(pending)
    fail(q, qpi, *unschedulable)
    assert where(q, qpi.key) == "unschedulable"
    qpi.unschedulable_plugins.clear()  # the pool indexed the rejectors on entry
    clock.advance(5)
    q.move_all_to_active_or_backoff(event)
    assert where(q, qpi.key) == expected


def test_move_keeps_pool_order() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock, REGISTERED)
    for name, plugin in [("a", "A"), ("b", "B"), ("c", "A"), ("d", "C"), ("e", "A")]:
        q.add(make_pod(name))
        qpi = q.pop()
        assert qpi is not None
        fail(q, qpi, plugin)
    clock.advance(5)
    q.move_all_to_active_or_backoff(ClusterEvent(Resource.NODE, Action.ALL))
    assert pop_all(q) == ["a", "c", "d", "e"]  # timestamps tie-break in pool order
    assert q.pending_counts() == {"active": 0, "backoff": 0, "unschedulable": 1, "gated": 0}


@pytest.mark.parametrize(
    ("hook", "args", "moves"),
    [
        pytest.param("node_added", ("n",), True, id="node-added"),
        pytest.param("node_updated", ("n", "n-labelled"), True, id="node-updated"),
        pytest.param("node_updated", ("n", "n-new-rv"), False, id="node-status-only"),
        pytest.param("node_deleted", ("n",), True, id="node-deleted"),
        pytest.param("assigned_pod_added", ("p",), False, id="assigned-pod-added"),
        pytest.param("assigned_pod_updated", ("p", "p-labelled"), True, id="assigned-updated"),
        pytest.param("assigned_pod_updated", ("p", "p"), False, id="assigned-unchanged"),
        pytest.param("assigned_pod_deleted", ("p",), True, id="assigned-pod-deleted"),
        pytest.param("device_changed", (Action.UPDATE,), True, id="device-update"),
        pytest.param("device_changed", (Action.ADD,), False, id="device-add"),
    ],
)
def test_event_hooks(hook: str, args: tuple[Any, ...], moves: bool) -> None:
    objects: dict[str, Any] = {
        "n": decode_node({"metadata": {"name": "n", "resourceVersion": "1"}}),
        "n-labelled": decode_node({"metadata": {"name": "n", "labels": {"x": "y"}}}),
        "n-new-rv": decode_node({"metadata": {"name": "n", "resourceVersion": "2"}}),
        "p": make_pod("p", nodeName="n"),
        "p-labelled": make_pod("p", nodeName="n", labels={"x": "y"}),
    }
    registered = {
        ClusterEvent(Resource.NODE, Action.ALL): frozenset({"N"}),
        ClusterEvent(Resource.ASSIGNED_POD, Action.UPDATE | Action.DELETE): frozenset({"N"}),
        ClusterEvent(Resource.DEVICE, Action.UPDATE | Action.DELETE): frozenset({"N"}),
    }
    clock = FakeClock()
    q, _ = make_queue(clock, registered)
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    fail(q, qpi, "N")
    clock.advance(1)
    getattr(q, hook)(*(objects.get(a, a) if isinstance(a, str) else a for a in args))
    assert where(q, qpi.key) == ("active" if moves else "unschedulable")


# ---------------------------------------------------------------------------------------------
# moveRequestCycle


@pytest.mark.parametrize(
    ("move_before_pop", "move_after_pop", "plugins", "expected"),
    [
        pytest.param(False, False, ("A",), "unschedulable", id="no-move"),
        pytest.param(True, False, ("A",), "unschedulable", id="move-before-its-cycle"),
        pytest.param(False, True, ("A",), "backoff", id="move-during-its-cycle"),
        pytest.param(False, True, ("B",), "backoff", id="any-move-counts"),
        pytest.param(False, False, (), "backoff", id="error-goes-to-backoff"),
    ],
)
def test_move_request_cycle(
    move_before_pop: bool, move_after_pop: bool, plugins: tuple[str, ...], expected: str
) -> None:
    clock = FakeClock()
    q, seen = make_queue(clock, REGISTERED)
    q.add(make_pod("a"))
    if move_before_pop:
        q.move_all_to_active_or_backoff(NODE_ADD)
    qpi = q.pop()
    assert qpi is not None
    cycle = q.scheduling_cycle
    if move_after_pop:
        # an event applied while the pod was out of the queue, e.g. between its scheduling
        # cycle and the handling of its failure; the pool is empty, the request still counts
        q.move_all_to_active_or_backoff(NODE_ADD)
    fail(q, qpi, *plugins, cycle=cycle)
    assert where(q, qpi.key) == expected
    assert seen[-1] == (expected, "ScheduleAttemptFailure")


def test_move_request_cycle_of_earlier_pod_does_not_count() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock, REGISTERED)
    q.add(make_pod("a"))
    q.add(make_pod("b"))
    first = q.pop()
    q.move_all_to_active_or_backoff(NODE_ADD)  # during a's cycle
    second = q.pop()
    assert first is not None and second is not None
    fail(q, second, "A", cycle=2)
    fail(q, first, "A", cycle=1)
    assert (where(q, first.key), where(q, second.key)) == ("backoff", "unschedulable")


def test_add_unschedulable_if_present_is_a_no_op() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    q.add(make_pod("a", priority=3))  # re-added while in flight (e.g. updated)
    qpi.unschedulable_plugins.add("A")
    assert not q.add_unschedulable_if_not_present(qpi, q.scheduling_cycle)
    assert not q.requeue_with_backoff(qpi)
    assert q.pending_counts() == {"active": 1, "backoff": 0, "unschedulable": 0, "gated": 0}


def test_requeue_with_backoff() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock)
    q.add(make_pod("a"))
    qpi = q.pop()
    assert qpi is not None
    clock.advance(3)
    qpi.unschedulable_plugins.add("A")  # ignored: a bind failure always backs off
    assert q.requeue_with_backoff(qpi)
    assert where(q, qpi.key) == "backoff"
    assert q.next_wakeup() == 4.0
    assert seen[-1] == ("backoff", "ScheduleAttemptFailure")


# ---------------------------------------------------------------------------------------------
# add / update / delete


def _put(q: SchedulingQueue, clock: FakeClock, pod: Pod, queue: str) -> QueuedPodInfo:
    q.add(pod)
    if queue == "active":
        qpi = q.get(pod.key)
        assert qpi is not None
        return qpi
    qpi = q.pop()
    assert qpi is not None
    fail(q, qpi, *(("A",) if queue == "unschedulable" else ()))
    return qpi


@pytest.mark.parametrize("queue", ["active", "backoff", "unschedulable"])
def test_delete_from_each_sub_queue(queue: str) -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    q.add(make_pod("other"))
    pod = make_pod("a", priority=1)
    _put(q, clock, pod, queue)
    assert where(q, pod.key) == queue
    q.delete(pod)
    assert pod.key not in q
    assert q.get(pod.key) is None
    assert len(q) == 1
    q.delete(pod)  # deleting an unknown pod is harmless
    assert len(q) == 1


@pytest.mark.parametrize(
    ("queue", "change", "expected"),
    [
        pytest.param("active", "labels", "active", id="active-stays"),
        pytest.param("backoff", "labels", "backoff", id="backoff-stays"),
        pytest.param("unschedulable", "labels", "active", id="pool-moves-on-change"),
        pytest.param("unschedulable", "rv", "unschedulable", id="pool-stays-on-status-only"),
        pytest.param("none", "labels", "active", id="unknown-is-added"),
    ],
)
def test_update_of_queued_pod(queue: str, change: str, expected: str) -> None:
    clock = FakeClock()
    q, seen = make_queue(clock)
    old = make_pod("a")
    if queue != "none":
        qpi = _put(q, clock, old, queue)
    clock.advance(1)
    new = (
        make_pod("a", labels={"x": "y"})
        if change == "labels"
        else decode_pod({**old.raw, "metadata": {**old.raw["metadata"], "resourceVersion": "9"}})
    )
    q.update(old, new)
    assert where(q, new.key) == expected
    got = q.get(new.key)
    assert got is not None and got.pod is new
    if queue != "none":
        assert got is qpi  # history kept
    if expected != queue:
        assert seen[-1] == (expected, "PodUpdate")


def test_update_reorders_active_queue() -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    for name in "abc":
        q.add(make_pod(name))
    q.update(make_pod("c"), make_pod("c", priority=5))
    q.add(make_pod("a", priority=-1))  # add of a queued pod updates it in place
    assert pop_all(q) == ["c", "b", "a"]


def test_counts_len_contains_pending() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock)
    for name, queue in [("a", "active"), ("b", "backoff"), ("c", "unschedulable")]:
        _put(q, clock, make_pod(name, priority=10), queue)
    q.add(make_pod("d"))
    assert q.pending_counts() == {"active": 2, "backoff": 1, "unschedulable": 1, "gated": 0}
    assert len(q) == 4
    assert "ns/c" in q and "ns/zz" not in q and 3 not in q
    assert sorted(p.pod.name for p in q.pending_pods()) == ["a", "b", "c", "d"]
    assert seen.count(("active", "PodAdd")) == 4


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="initial_backoff"):
        SchedulingQueue(priority_sort, FakeClock(), initial_backoff=5, max_backoff=1)
    with pytest.raises(ValueError, match="unschedulable_timeout"):
        SchedulingQueue(priority_sort, FakeClock(), unschedulable_timeout=0)


# ---------------------------------------------------------------------------------------------
# heap order under random adds, deletes and priority updates

_op = st.tuples(
    st.sampled_from(["add", "delete", "update"]), st.integers(0, 15), st.integers(-3, 3)
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=60))
def test_active_order_matches_model(ops: list[tuple[str, int, int]]) -> None:
    clock = FakeClock()
    q, _ = make_queue(clock)
    model: dict[str, tuple[int, float, int]] = {}  # name -> (priority, timestamp, entry seq)
    seq = 0
    for op, i, priority in ops:
        name = f"p{i}"
        clock.advance(0.5 if i % 2 else 0.0)
        if op == "delete":
            q.delete(make_pod(name))
            model.pop(name, None)
        elif name in model and op == "add":
            q.add(make_pod(name, priority))  # an add of a queued pod updates it in place
            model[name] = (priority, *model[name][1:])
        elif name in model:
            q.update(make_pod(name), make_pod(name, priority))
            model[name] = (priority, *model[name][1:])
        else:
            q.add(make_pod(name, priority))
            seq += 1
            model[name] = (priority, clock.now(), seq)
    expected = sorted(model, key=lambda n: (-model[n][0], model[n][1], model[n][2]))
    assert pop_all(q) == expected


# -- the sort key -------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-3, 3), st.integers(0, 5), st.booleans(), st.integers(-3, 3)),
        min_size=1,
        max_size=25,
    )
)
def test_a_sort_key_pops_in_exactly_the_order_of_less(
    ops: list[tuple[int, int, bool, int]],
) -> None:
    """With PrioritySort's ``sort_key`` the activeQ pops exactly as with its ``less`` — through
    adds at different times, priority updates in place, and pops in between."""
    sort = PrioritySort()
    orders: list[list[str]] = []
    for key in (None, sort.sort_key):
        clock = FakeClock()
        q = SchedulingQueue(sort.less, clock, sort_key=key)
        popped: list[str] = []
        pods: dict[str, Pod] = {}
        for i, (priority, advance, pop, new_priority) in enumerate(ops):
            clock.advance(advance)
            pod = make_pod(f"p{i}", priority)
            pods[pod.key] = pod
            q.add(pod)
            if i % 3 == 2:  # change an earlier pod's priority while it waits
                old = pods[f"ns/p{i - 1}"]
                new = make_pod(f"p{i - 1}", new_priority)
                q.update(old, new)
                pods[new.key] = new
            if pop:
                qpi = q.pop()
                assert qpi is not None
                popped.append(qpi.key)
        while (qpi := q.pop()) is not None:
            popped.append(qpi.key)
        orders.append(popped)
    assert orders[0] == orders[1]


# ---------------------------------------------------------------------------------------------
# Scheduling gates (kube-scheduler's SchedulingGates PreEnqueue)

GATES = [{"name": "example.com/quota"}, {"name": "example.com/image"}]


def test_a_gated_pod_is_never_popped_moved_or_timed_out() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock, {NODE_ADD: frozenset({"NodeResourcesFit"})})
    q.add(make_pod("gated", schedulingGates=GATES))
    q.add(make_pod("free"))
    assert where(q, "ns/gated") == "gated"
    assert q.pending_counts() == {"active": 1, "backoff": 0, "unschedulable": 0, "gated": 1}
    assert ("gated", "PodAdd") in seen
    assert pop_all(q) == ["free"]
    q.move_all_to_active_or_backoff(NODE_ADD)
    clock.advance(10_000)  # far past the unschedulable timeout
    q.flush()
    assert q.pop() is None
    assert where(q, "ns/gated") == "gated" and len(q) == 1 and "ns/gated" in q


def test_removing_the_last_gate_queues_the_pod() -> None:
    clock = FakeClock()
    q, seen = make_queue(clock)
    two = make_pod("p", schedulingGates=GATES)
    one = make_pod("p", schedulingGates=GATES[1:])
    none = make_pod("p")
    q.add(two)
    q.update(two, one)
    assert where(q, "ns/p") == "gated"
    assert q.get("ns/p") is not None and q.get("ns/p").pod is one  # type: ignore[union-attr]
    q.update(one, none)
    assert where(q, "ns/p") == "active"
    assert seen[-1] == ("active", "PodUpdate")
    qpi = q.pop()
    assert qpi is not None and qpi.pod is none and qpi.attempts == 1


def test_a_gated_pod_deleted_leaves_the_queue() -> None:
    q, _ = make_queue(FakeClock())
    pod = make_pod("p", schedulingGates=GATES)
    q.add(pod)
    q.delete(pod)
    assert len(q) == 0 and q.sub_queue_of("ns/p") is None and q.pending_pods() == []


def test_a_gated_record_of_a_queued_pod_takes_it_out_of_activeq() -> None:
    """A record that arrives gated for a pod queued ungated (the queue missed the create, a
    relist) follows the record: the API server's word wins."""
    q, _ = make_queue(FakeClock())
    free = make_pod("p")
    q.add(free)
    q.update(free, make_pod("p", schedulingGates=GATES))
    assert where(q, "ns/p") == "gated" and q.pop() is None
