"""scheduler.kube.catchup.CatchUp: a new leader schedules only once its pod informer has applied
every event up to a quorum LIST made after the acquisition (issue 23, finding 2), on a fake
clock with a fake of the informer's side (``PodFeed``)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler.kube.catchup import CatchUp, in_flight_settle, rv_reached
from scheduler.kube.cluster import PODS_PATH, KubeCluster, pod_spec
from scheduler.kube.informer import Informer
from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import KubeError, RestClient, TransportError
from tests.fakes import FakeClock
from tests.unit.kube.kube_fakes import FakeStream, FakeTransport, event, object_list

RELIST_AFTER = 1.0


class FakePods:
    """The pod informer as the gate sees it: its last-seen resourceVersion, its numbered lists,
    and the relists asked of it."""

    def __init__(self, rv: str = "90") -> None:
        self.resource_version = rv
        self.lists_started = 1
        self.list_delivered = 1
        self.relists_asked = 0

    def relist(self) -> None:
        self.relists_asked += 1

    def start_list(self) -> int:
        self.lists_started += 1
        return self.lists_started

    def deliver(self, number: int, rv: str) -> None:
        self.list_delivered = number
        self.resource_version = rv


class Lists:
    """The quorum LIST: scripted answers (a version, or an exception), the last one repeated."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def gate(lists: Callable[[], str], pods: FakePods, clock: FakeClock) -> CatchUp:
    return CatchUp(
        lists,
        pods,
        clock=clock.now,
        backoff=Backoff(0.5, 4.0, jitter=0.0),
        relist_after=RELIST_AFTER,
    )


def test_a_new_leader_waits_for_its_pod_watch_to_reach_the_lists_version() -> None:
    """Replica B took the Lease with p1's binding still behind in its watch: not caught up
    (and /readyz says why) until the informer has applied the events up to the LIST's R."""
    clock, pods, lists = FakeClock(), FakePods("90"), Lists("100")
    g = gate(lists, pods, clock)
    g.leading_changed(True)
    assert not g.caught_up()  # leading, but no LIST yet
    g.step()
    assert lists.calls == 1
    assert not g.caught_up()
    assert g.waiting() == "leader: catching up with the cluster (pods at rv 90, need 100)"
    pods.resource_version = "99"
    assert not g.caught_up()
    pods.resource_version = "100"  # p1's bound record applied
    assert g.caught_up() and g.waiting() is None
    assert pods.relists_asked == 0  # the watch proved it: no relist


@pytest.mark.parametrize(
    ("seen", "target", "reached"),
    [
        ("100", "100", True),
        ("101", "100", True),
        ("99", "100", False),
        ("1000", "999", True),  # as integers, not as strings
        ("999", "1000", False),
        ("", "100", False),
        ("abc", "abc", True),  # not numeric: equality only
        ("abd", "abc", False),
        ("100", "abc", False),
    ],
)
def test_resource_versions_compare_as_integers(seen: str, target: str, reached: bool) -> None:
    assert rv_reached(seen, target) is reached


def test_no_leadership_is_never_caught_up() -> None:
    clock, pods, lists = FakeClock(), FakePods("500"), Lists("100")
    g = gate(lists, pods, clock)
    g.step()
    assert not g.caught_up() and lists.calls == 0
    assert g.waiting() is None  # a standby: the leader-election check speaks for it


def test_a_failed_list_is_retried_with_backoff_and_nothing_is_scheduled_meanwhile() -> None:
    clock, pods = FakeClock(), FakePods("500")  # the informer is far ahead: irrelevant
    lists = Lists(TransportError("connection refused"), KubeError("500 boom"), "100")
    g = gate(lists, pods, clock)
    g.leading_changed(True)
    assert g.step() == 0.5
    assert not g.caught_up()
    reason = g.waiting()
    assert reason is not None and "connection refused" in reason and "retrying" in reason
    clock.advance(0.4)
    assert g.step() == pytest.approx(0.1)  # not due yet: no LIST
    assert lists.calls == 1
    clock.advance(0.1)
    assert g.step() == 1.0  # the backoff doubles
    assert lists.calls == 2 and not g.caught_up()
    clock.advance(1.0)
    g.step()
    assert lists.calls == 3
    assert g.caught_up()


def test_a_list_without_a_version_is_a_failure() -> None:
    clock, pods = FakeClock(), FakePods("500")
    g = gate(Lists(""), pods, clock)
    g.leading_changed(True)
    g.step()
    assert not g.caught_up()
    assert "no resourceVersion" in (g.waiting() or "")


def test_every_acquisition_makes_a_new_list() -> None:
    clock, pods, lists = FakeClock(), FakePods("100"), Lists("100", "200")
    g = gate(lists, pods, clock)
    g.leading_changed(True)
    g.step()
    assert g.caught_up()
    g.leading_changed(False)
    assert not g.caught_up()
    assert g.step() == CatchUp.IDLE and lists.calls == 1
    g.leading_changed(True)
    assert not g.caught_up()  # the first term's proof does not count
    g.step()
    assert lists.calls == 2
    pods.resource_version = "150"
    assert not g.caught_up()
    pods.resource_version = "200"
    assert g.caught_up()


def test_a_quiet_watch_is_replaced_by_a_relist_started_after_the_list() -> None:
    """R is etcd's global revision (our own Lease write is below it), so a watch with no pod
    change never reaches it: after ``relist_after`` the informer is asked to relist once, and
    only a list that *started* after the LIST returned counts."""
    clock, pods, lists = FakeClock(), FakePods("90"), Lists("100")
    g = gate(lists, pods, clock)
    older = pods.start_list()  # a relist (after a 410, say) already running before the LIST
    g.leading_changed(True)
    assert g.step() == 0.0
    assert g.step() == RELIST_AFTER
    clock.advance(RELIST_AFTER - 0.1)
    g.step()
    assert pods.relists_asked == 0
    clock.advance(0.1)
    assert g.step() == CatchUp.IDLE
    assert pods.relists_asked == 1
    pods.deliver(older, "abc")  # an older list delivered meanwhile, non-numeric version
    assert not g.caught_up()
    fresh = pods.start_list()
    assert not g.caught_up()
    pods.deliver(fresh, "xyz")  # not comparable with "100", but started after the LIST
    assert g.caught_up()
    g.step()
    assert pods.relists_asked == 1  # once per acquisition


def test_a_lagging_watch_that_catches_up_within_relist_after_costs_no_relist() -> None:
    clock, pods, lists = FakeClock(), FakePods("90"), Lists("100")
    g = gate(lists, pods, clock)
    g.leading_changed(True)
    g.step()
    clock.advance(0.5)
    pods.resource_version = "105"
    clock.advance(RELIST_AFTER)
    assert g.step() == CatchUp.IDLE
    assert g.caught_up() and pods.relists_asked == 0


def test_a_take_over_of_an_expired_lease_waits_before_its_list() -> None:
    """Writes of a deposed leader may still be on the wire: the LIST is made after ``settle``."""
    clock, pods, lists = FakeClock(), FakePods("100"), Lists("100")
    g = gate(lists, pods, clock)
    g.leading_changed(True, settle=5.0)
    assert g.step() == 5.0 and lists.calls == 0
    assert "may still be on the wire" in (g.waiting() or "")
    assert not g.caught_up()
    clock.advance(5.0)
    g.step()
    assert lists.calls == 1 and g.caught_up()


@pytest.mark.parametrize(
    ("timeout", "lease", "renew", "settle"),
    [(10.0, 15.0, 10.0, 5.0), (10.0, 10.0, 7.0, 7.0), (3.0, 15.0, 10.0, 0.0)],
)
def test_in_flight_settle(timeout: float, lease: float, renew: float, settle: float) -> None:
    assert in_flight_settle(timeout, lease, renew) == settle


def test_leadership_lost_during_the_list_discards_its_answer() -> None:
    clock, pods = FakeClock(), FakePods("100")
    g: CatchUp

    def list_then_lose() -> str:
        g.leading_changed(False)
        g.leading_changed(True)  # a new term: this answer belongs to the old one
        return "100"

    g = gate(list_then_lose, pods, clock)
    g.leading_changed(True)
    g.step()
    assert not g.caught_up()


def test_the_thread_retries_until_the_list_succeeds() -> None:
    pods = FakePods("100")
    lists = Lists(TransportError("refused"), "100")
    g = CatchUp(lists, pods, backoff=Backoff(0.001, 0.002, rng=random.Random(0)))
    g.start()
    try:
        g.leading_changed(True)
        for _ in range(500):
            if g.caught_up():
                break
            time.sleep(0.01)
        assert g.caught_up() and lists.calls == 2
    finally:
        g.stop()
    assert not g.alive


# -- with the real pod informer and the real quorum LIST, at the HTTP boundary -----------------


class HeldStream(FakeStream):
    """A watch whose events are held back until ``release`` is set (a lagging watch)."""

    def __init__(self, chunks: list[bytes], release: threading.Event) -> None:
        super().__init__(chunks, end=False)
        self.release = release

    def chunks(self) -> Iterator[bytes]:
        self.release.wait(10)
        yield from super().chunks()


def kube_pod(name: str, uid: str, rv: str, node: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv},
        "spec": {"schedulerName": "koord-scheduler", "nodeName": node},
        "status": {"phase": "Pending"},
    }


def kube_setup(transport: FakeTransport) -> tuple[KubeCluster, Informer]:
    rest = RestClient(transport)
    pods = Informer(rest, pod_spec(), backoff=Backoff(0.01, 0.02, rng=random.Random(0)))
    cluster = KubeCluster(rest, None, informers=(pods, pods, pods))  # for quorum_pods_rv only
    pods.start()
    assert pods.wait_for_sync(5)
    return cluster, pods


def wait_until(predicate: Callable[[], bool]) -> None:
    for _ in range(500):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_a_stale_uid_binding_behind_the_list_is_applied_before_scheduling() -> None:
    """The old leader's last bind was sent for p1's first incarnation and landed on its
    same-name successor (v1.20 binds by name). B's watch has not delivered the delete, the
    re-creation nor the binding: not caught up until all three are applied, and by then B's
    cache holds the successor bound."""
    transport, release = FakeTransport(), threading.Event()
    transport.on(
        "GET",
        PODS_PATH,
        object_list([kube_pod("p1", "uid-1", "9"), kube_pod("p2", "uid-p2", "10")], rv="10"),
        object_list([kube_pod("p1", "uid-2", "13", node="g0")], rv="13", cont="more"),
    )
    transport.on_watch(
        PODS_PATH,
        HeldStream(
            [
                event("DELETED", kube_pod("p1", "uid-1", "11")),
                event("ADDED", kube_pod("p1", "uid-2", "12")),
                event("MODIFIED", kube_pod("p1", "uid-2", "13", node="g0")),
            ],
            release,
        ),
    )
    cluster, pods = kube_setup(transport)
    try:
        g = CatchUp(cluster.quorum_pods_rv, pods, relist_after=60.0)
        g.leading_changed(True)
        g.step()
        assert "need 13" in (g.waiting() or "")
        assert not g.caught_up()
        release.set()
        wait_until(g.caught_up)
        p1 = pods.get("ns/p1")
        assert p1 is not None and (p1.uid, p1.node_name) == ("uid-2", "g0")
        assert len(transport.sent("GET", PODS_PATH)) == 2  # no relist was needed
    finally:
        pods.stop()
        release.set()


def test_a_quiet_pod_watch_is_relisted_then_caught_up() -> None:
    transport = FakeTransport()
    transport.on(
        "GET",
        PODS_PATH,
        object_list([kube_pod("p1", "uid-1", "9")], rv="10"),  # the informer's list
        object_list([kube_pod("p1", "uid-1", "9")], rv="25"),  # the quorum LIST
        object_list([kube_pod("p1", "uid-1", "9")], rv="26"),  # the relist
    )
    cluster, pods = kube_setup(transport)
    try:
        clock = FakeClock()
        g = CatchUp(cluster.quorum_pods_rv, pods, clock=clock.now, relist_after=RELIST_AFTER)
        g.leading_changed(True)
        g.step()
        clock.advance(RELIST_AFTER)
        g.step()
        wait_until(g.caught_up)
        assert pods.resource_version == "26"
        assert [r.query.get("limit") for r in transport.sent("GET", PODS_PATH)] == [
            "500",
            "1",
            "500",
        ]
    finally:
        pods.stop()
