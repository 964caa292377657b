"""The scheduler under faults: late watch events, lost bind answers, re-created pods, fencing.

Each test drives ``tests.adversarial_cluster.AdversarialCluster``: the true state changes at
once, the scheduler learns about it only when the test delivers the watch event.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, decode_allocations
from apis.resources import GPU_CORE, GPU_MEMORY_RATIO
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from tests.adversarial_cluster import AdversarialCluster, card_usage
from tests.builders import make_node, make_pod

OURS = "koord-scheduler"
DS = "DeviceShare"
CONFIG: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": OURS,
            "plugins": {
                ep: {"enabled": [{"name": DS}]}
                for ep in ("preFilter", "filter", "preScore", "score", "reserve", "preBind")
            },
        }
    ],
}
WHOLE_CARD = {GPU_CORE: "100", GPU_MEMORY_RATIO: "100"}


class Attempts:
    """A SchedulerObserver that records attempt results in order."""

    def __init__(self) -> None:
        self.results: list[str] = []
        self.scheduled_pods = 0

    def extension_point(self, profile: str, ep: str, status: str, seconds: float) -> None:
        pass

    def plugin(self, plugin: str, ep: str, status: str, seconds: float) -> None:
        pass

    def attempt(self, result: str, profile: str, seconds: float) -> None:
        assert seconds >= 0
        self.results.append(result)

    def scheduled(self, attempts: int, sli_seconds: float) -> None:
        self.scheduled_pods += 1

    def preemption(self, victims: int | None) -> None:
        pass


def gpu_node_truth(nodes: int = 1, cards: int = 1) -> InMemoryCluster:
    truth = InMemoryCluster()
    for n in range(nodes):
        name = f"g{n}"
        truth.apply_node(
            make_node(name).cpu("32").memory("64Gi").gpu_resources(cards, "16Gi").obj()
        )
        truth.apply_device(
            {
                "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                "kind": "Device",
                "metadata": {"name": name},
                "spec": {
                    "devices": [
                        {
                            "type": "gpu",
                            "id": f"GPU-{name}-{m}",
                            "minor": m,
                            "health": True,
                            "resources": {
                                GPU_CORE: "100",
                                "koordinator.sh/gpu-memory": "16Gi",
                                GPU_MEMORY_RATIO: "100",
                            },
                        }
                        for m in range(cards)
                    ]
                },
            }
        )
    return truth


@contextmanager
def scheduler_on(
    adv: AdversarialCluster, clock: SimulatedClock | None = None, **kwargs: Any
) -> Iterator[Scheduler]:
    sched = Scheduler(
        parse_config(CONFIG),
        adv,
        in_tree_registry() | {DS: new_deviceshare},
        default_plugins(),
        clock=clock or SimulatedClock(),
        rng=random.Random(0),
        **({"bind_workers": 1} | kwargs),
    )
    try:
        yield sched
    finally:
        if adv.gate is not None:
            adv.gate.set()
        sched.close()


def gpu_pod(name: str, uid: str = "") -> dict[str, Any]:
    pod = make_pod(name).req(cpu="1").req(WHOLE_CARD).scheduler(OURS)
    if uid:
        pod.uid(uid)
    return pod.obj()


def assert_no_card_overcommitted(truth: InMemoryCluster) -> None:
    over = {card: used for card, used in card_usage(truth).items() if max(used) > 100}
    assert not over, f"over-committed cards (gpu-core, ratio): {over}"


# -- finding 1: an assumed pod never expires ----------------------------------------------------


def test_a_bound_pods_card_stays_reserved_while_its_watch_event_is_late() -> None:
    """a's bind succeeds but its watch event is 60 s late; b wants the same (only) card. The
    reservation of a bound pod is never released by a timer, so b must wait."""
    truth, clock = gpu_node_truth(), SimulatedClock()
    adv = AdversarialCluster(truth)
    with scheduler_on(adv, clock) as sched:
        truth.apply_pod(gpu_pod("a"))
        adv.deliver_all()
        sched.run_until_idle()
        assert truth.pods["default/a"].node_name == "g0"
        assert len(adv.pending) == 1  # a's bound update, not delivered
        clock.advance(60)
        truth.apply_pod(gpu_pod("b"))
        adv.deliver(1)  # b's add overtakes a's update (another object: allowed)
        sched.run_until_idle()
        assert truth.pods["default/b"].node_name == ""
        assert_no_card_overcommitted(truth)
        adv.deliver_all()  # a's event arrives at last: counted once, b still waits
        clock.advance(60)
        sched.run_until_idle()
    assert truth.pods["default/b"].node_name == ""
    assert_no_card_overcommitted(truth)


# -- uncertain bind answers are read back --------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "binds", "results"),
    [
        pytest.param("lost", 1, ["scheduled"], id="timed-out-but-applied-is-bound"),
        pytest.param("409", 2, ["error", "scheduled"], id="409-not-applied-is-retried"),
        pytest.param("500", 2, ["error", "scheduled"], id="500-is-retried-after-backoff"),
    ],
)
def test_a_bind_answer_is_resolved_against_the_truth(
    answer: str, binds: int, results: list[str]
) -> None:
    truth, clock = gpu_node_truth(), SimulatedClock()
    adv = AdversarialCluster(truth)
    attempts = Attempts()
    with scheduler_on(adv, clock, observer=attempts) as sched:
        adv.bind_plan.append(answer)
        truth.apply_pod(gpu_pod("a"))
        adv.deliver_all()
        sched.run_until_idle()
        truth.apply_pod(gpu_pod("b"))  # wants the same card while a's event is late
        adv.deliver(len(adv.pending) - 1)
        clock.advance(2)  # past a's first backoff
        sched.run_until_idle()
        adv.deliver_all()
        sched.run_until_idle()
    assert truth.pods["default/a"].node_name == "g0"
    assert truth.pods["default/b"].node_name == ""
    assert_no_card_overcommitted(truth)
    assert adv.bind_calls == binds
    assert [r for r in attempts.results if r != "unschedulable"] == results
    assert attempts.scheduled_pods == 1


# -- finding 6: attempts are counted as kube-scheduler counts them -------------------------------


def test_scheduled_is_counted_after_the_bind_and_a_failed_bind_is_an_error() -> None:
    truth = gpu_node_truth()
    adv = AdversarialCluster(truth)
    attempts = Attempts()
    adv.gate = threading.Event()
    with scheduler_on(adv, observer=attempts) as sched:
        truth.apply_pod(gpu_pod("a"))
        adv.deliver_all()
        assert sched.schedule_one()
        assert attempts.results == []  # assumed, bind on the wire: not "scheduled" yet
        adv.gate.set()
        sched.run_until_idle()
    assert attempts.results == ["scheduled"]


# -- finding 4: identity is the UID ---------------------------------------------------------------


def test_a_pod_recreated_while_its_old_bind_is_in_flight_is_scheduled() -> None:
    """uid-1's bind is on the wire; the pod is deleted and re-created (uid-2), both events
    arrive; uid-1's bind then fails ("gone"). uid-2 must be scheduled, not dropped as
    "already assumed", and uid-1's outcome must not forget it."""
    truth = gpu_node_truth(cards=2)
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    with scheduler_on(adv) as sched:
        truth.apply_pod(gpu_pod("web-0", uid="uid-1"))
        adv.deliver_all()
        assert sched.schedule_one()  # uid-1 assumed, its bind blocked on the gate
        truth.delete_pod("default/web-0")
        truth.apply_pod(gpu_pod("web-0", uid="uid-2"))
        adv.deliver_all()
        sched.schedule_one()  # uid-2: must be scheduled
        adv.gate.set()
        sched.run_until_idle()
        adv.deliver_all()
        sched.run_until_idle()
        pod = truth.pods["default/web-0"]
        assert (pod.uid, pod.node_name) == ("uid-2", "g0")
        assert sched.cache.pod_count() == 1
    assert_no_card_overcommitted(truth)


# -- finding 2: fencing and the bounded bind queue -----------------------------------------------


def test_binds_in_flight_are_bounded() -> None:
    truth = gpu_node_truth(nodes=4, cards=2)
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    with scheduler_on(adv, max_in_flight=3) as sched:
        for i in range(6):
            truth.apply_pod(gpu_pod(f"p{i}"))
        adv.deliver_all()
        scheduled = 0
        while sched.schedule_one():
            scheduled += 1
        assert scheduled == 3  # the fourth waits until a bind comes back
        adv.gate.set()
        sched.run_until_idle()
    assert sum(1 for p in truth.pods.values() if p.node_name) == 6


def test_after_stop_binding_no_bind_is_sent_and_reservations_are_released() -> None:
    truth = gpu_node_truth(nodes=1, cards=2)
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    with scheduler_on(adv) as sched:
        for i in range(2):
            truth.apply_pod(gpu_pod(f"p{i}"))
        adv.deliver_all()
        assert sched.schedule_one() and sched.schedule_one()  # p0 on the wire, p1 queued
        assert not sched.stop_binding(timeout=0.05)  # p0 is still on the wire
        assert not sched.schedule_one()  # no new cycle once stopping
        adv.gate.set()
        assert sched.stop_binding(timeout=30)
        sched.drain()
        assert adv.bind_calls == 1  # p1's bind was never sent
        assert sched.cache.pod_count() == 1  # p1 forgotten, its card released
        assert sched.queue.pending_counts()["backoff"] == 1


# -- found by the model test: a relist folds several changes into one ---------------------------


def test_a_pod_bound_then_deleted_behind_a_relist_releases_its_card() -> None:
    """a's bind succeeds, its "bound" event is lost, a is deleted, and the relist reports the
    delete of the *unassigned* record the scheduler knew. Its card must be freed for b (once
    a read of the name shows no same-name successor holding it: b may be turned away until
    then, and is retried when the card is released)."""
    truth, clock = gpu_node_truth(), SimulatedClock()
    adv = AdversarialCluster(truth)
    with scheduler_on(adv, clock) as sched:
        truth.apply_pod(gpu_pod("a"))
        adv.deliver_all()
        sched.run_until_idle()
        truth.delete_pod("default/a")
        adv.drop_pending()
        adv.relist()
        truth.apply_pod(gpu_pod("b"))
        adv.deliver_all()
        sched.run_until_idle()
        clock.advance(20)  # past b's backoff, far short of the unschedulable pool's flush
        sched.run_until_idle()
        assert truth.pods["default/b"].node_name == "g0"
        adv.deliver_all()
        sched.drain()
        assert not sched.cache.assumed_pods()
        assert sched.cache.pod_count() == 1


def test_a_bound_pod_recreated_behind_a_relist_is_scheduled() -> None:
    """The relist shows one update: bound uid-1 -> unassigned uid-2. That is two pods: uid-1
    leaves the cache, uid-2 joins the queue."""
    truth = gpu_node_truth()
    adv = AdversarialCluster(truth)
    with scheduler_on(adv) as sched:
        truth.apply_pod(gpu_pod("web-0", uid="uid-1"))
        adv.deliver_all()
        sched.run_until_idle()
        adv.deliver_all()
        truth.delete_pod("default/web-0")
        truth.apply_pod(gpu_pod("web-0", uid="uid-2"))
        adv.drop_pending()
        adv.relist()
        sched.run_until_idle()
        pod = truth.pods["default/web-0"]
        assert (pod.uid, pod.node_name) == ("uid-2", "g0")


def test_an_uncertain_bind_that_cannot_be_read_back_keeps_its_reservation() -> None:
    """The bind's answer is lost and the API server cannot be read: the worker keeps asking;
    when the scheduler stops meanwhile, the pod stays assumed and its card held."""
    truth = gpu_node_truth()
    adv = AdversarialCluster(truth)
    adv.unreadable = True
    adv.bind_plan.append("lost")
    with scheduler_on(adv) as sched:
        truth.apply_pod(gpu_pod("a"))
        adv.deliver_all()
        assert sched.schedule_one()
        wait_until = 0
        while adv.lookups < 2 and wait_until < 600:  # at least one retry after a backoff
            sched.drain(block=True, timeout=0.1)
            wait_until += 1
        assert adv.lookups >= 2
        assert sched.stop_binding(timeout=30)
        pod = truth.pods["default/a"]
        assert sched.cache.is_assumed(pod) and sched.cache.pod_count() == 1


def test_a_stale_bind_that_lands_on_a_same_name_successor_never_overcommits() -> None:
    """v1.20 API servers bind by name: uid-1's bind, on the wire while web-0 is deleted and
    re-created (uid-2), lands on uid-2 with uid-1's card. The card must stay reserved until the
    outcome is known (not freed by the delete), then be held by uid-2's allocation."""
    truth = gpu_node_truth(cards=1)
    adv = AdversarialCluster(truth)
    adv.ignore_binding_uid = True
    adv.gate = threading.Event()
    with scheduler_on(adv, bind_workers=1) as sched:
        truth.apply_pod(gpu_pod("web-0", uid="uid-1"))
        adv.deliver_all()
        assert sched.schedule_one()  # uid-1 assumed on the only card, its bind on the wire
        truth.delete_pod("default/web-0")
        truth.apply_pod(gpu_pod("z", uid="uid-z"))
        adv.deliver_all()
        while sched.schedule_one():
            pass  # z must not get the card uid-1's bind may still take
        truth.apply_pod(gpu_pod("web-0", uid="uid-2"))  # the successor, before the bind lands
        adv.deliver_all()
        while sched.schedule_one():
            pass
        adv.gate.set()
        sched.run_until_idle()
        adv.deliver_all()
        sched.run_until_idle()
        assert truth.pods["default/web-0"].uid == "uid-2"
        assert truth.pods["default/web-0"].node_name == "g0"  # the stale bind landed
        assert not truth.pods["default/z"].node_name
    assert_no_card_overcommitted(truth)


# -- a failed binding cycle frees room: the pods it blocked are retried at once ------------------


def test_a_bind_that_fails_for_a_deleted_pod_wakes_the_pods_its_card_turned_away() -> None:
    """a's bind is on the wire when a is deleted (churn); b, turned away meanwhile because a's
    card was still reserved, must be retried as soon as the bind's outcome frees the card — not
    after the unschedulable pool's 5-minute flush (chaos seed 1397707095: two pods that fit
    waited 300 s). kube-scheduler treats a forgotten assumed pod as an AssignedPodDelete."""
    truth, clock = gpu_node_truth(), SimulatedClock()
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    with scheduler_on(adv, clock) as sched:
        truth.apply_pod(gpu_pod("a", uid="uid-a"))
        adv.deliver_all()
        assert sched.schedule_one()  # a assumed on the only card, its bind on the wire
        truth.apply_pod(gpu_pod("b", uid="uid-b"))
        adv.deliver_all()
        assert sched.schedule_one()  # b: no room
        truth.delete_pod("default/a")
        adv.deliver_all()  # the delete moves b, but a's card waits for the bind's outcome
        clock.advance(20)
        while sched.schedule_one():
            pass  # b turned away again: the card may still be taken by a's bind
        assert truth.pods["default/b"].node_name == ""
        adv.gate.set()  # a's bind answers 404: the card is free now
        sched.run_until_idle()
        clock.advance(20)  # past any backoff, far short of the 300 s flush
        sched.run_until_idle()
        assert truth.pods["default/b"].node_name == "g0"
    assert_no_card_overcommitted(truth)


def test_a_bind_that_fails_moves_the_unschedulable_pods() -> None:
    """A certain bind failure (500) releases the pod's card: the pods waiting in the
    unschedulable pool leave it (as kube-scheduler's handleBindingCycleError moves them)."""
    truth, clock = gpu_node_truth(), SimulatedClock()
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    adv.bind_plan.append("500")
    with scheduler_on(adv, clock) as sched:
        truth.apply_pod(gpu_pod("a"))
        adv.deliver_all()
        assert sched.schedule_one()  # a assumed, its bind on the wire
        truth.apply_pod(gpu_pod("b"))
        adv.deliver_all()
        assert sched.schedule_one()  # b: no room
        assert sched.queue.pending_counts()["unschedulable"] == 1
        adv.gate.set()
        sched.run_until_idle()  # a's bind fails: a backs off, b must leave the pool
        assert sched.queue.pending_counts()["unschedulable"] == 0
        clock.advance(20)
        sched.run_until_idle()
        adv.deliver_all()
        sched.run_until_idle()
        assert sorted(bool(truth.pods[k].node_name) for k in ("default/a", "default/b")) == [
            False,
            True,
        ]
    assert_no_card_overcommitted(truth)


def test_an_unanswered_stale_bind_that_landed_on_a_successor_never_overcommits() -> None:
    """As above, but uid-1's bind gets no answer (the connection reset after the write landed):
    reading web-0 back finds uid-2 bound with uid-1's card. That card must pass to uid-2 at
    once, not be released while uid-2's bound event is still on its way (z would take it)."""
    truth, clock = gpu_node_truth(cards=1), SimulatedClock()
    adv = AdversarialCluster(truth)
    adv.ignore_binding_uid = True
    adv.gate = threading.Event()
    adv.bind_plan.append("lost")
    with scheduler_on(adv, clock, bind_workers=1) as sched:
        truth.apply_pod(gpu_pod("web-0", uid="uid-1"))
        adv.deliver_all()
        assert sched.schedule_one()  # uid-1 assumed on the only card, its bind on the wire
        truth.apply_pod(gpu_pod("z", uid="uid-z"))  # z: ahead of uid-2 in the queue
        adv.deliver_all()
        assert sched.schedule_one()  # z: no room
        truth.delete_pod("default/web-0")
        truth.apply_pod(gpu_pod("web-0", uid="uid-2"))
        adv.deliver_all()
        while sched.schedule_one():
            pass
        adv.gate.set()
        sched.run_until_idle()  # uid-1's outcome; uid-2's bound event not delivered yet
        clock.advance(20)
        sched.run_until_idle()  # z retried: the card must not look free
        adv.deliver_all()
        sched.run_until_idle()
        assert truth.pods["default/web-0"].node_name == "g0"  # the stale bind landed
        assert not truth.pods["default/z"].node_name
    assert_no_card_overcommitted(truth)


def test_a_successor_the_read_back_found_bound_is_never_reserved_again() -> None:
    """uid-1's stale bind lands on the re-created uid-2 (card 0); uid-1's delete makes the
    scheduler read web-0 back and hand uid-2's card 0 to the ledger. uid-2's unbound add then
    arrives (its bound event still in the watch), so uid-2 is scheduled again: its Reserve on
    card 1 must not replace the holding the cluster showed (card 0 would look free while uid-2
    sits on it, and z takes it; chaos seed 584939813's stale-UID over-commit)."""
    truth, clock = gpu_node_truth(cards=2), SimulatedClock()
    adv = AdversarialCluster(truth)
    adv.ignore_binding_uid = True
    adv.gate = threading.Event()
    with scheduler_on(adv, clock, bind_workers=1) as sched:
        truth.apply_pod(gpu_pod("web-0", uid="uid-1"))
        adv.deliver_all()
        assert sched.schedule_one()  # uid-1 assumed on card 0, its bind on the wire
        truth.delete_pod("default/web-0")
        truth.apply_pod(gpu_pod("web-0", uid="uid-2"))
        adv.gate.set()
        assert sched.drain(block=True, timeout=10) == 1  # 201: it landed on uid-2
        landed = truth.pods["default/web-0"]
        assert landed.uid == "uid-2" and landed.node_name == "g0"
        adv.deliver(0)  # uid-1's delete: the read-back hands uid-2's card 0 to the ledger
        sched.run_until_idle()
        adv.gate.clear()  # binds wait on the wire from here
        adv.deliver(0)  # uid-2's unbound add (its bound event stays pending)
        sched.schedule_one()  # uid-2 again: card 0 is its own, so card 1 if anything
        truth.apply_pod(gpu_pod("z", uid="uid-z"))
        adv.deliver(1)  # z's add
        sched.schedule_one()  # z must not find card 0 free
        adv.gate.set()
        clock.advance(20)
        sched.run_until_idle()
        adv.deliver_all()
        clock.advance(20)
        sched.run_until_idle()
    assert_no_card_overcommitted(truth)


class _SlowAnswer(AdversarialCluster):
    """Binds land at once; their answers wait for ``answered`` (a slow response)."""

    def __init__(self, truth: InMemoryCluster) -> None:
        super().__init__(truth)
        self.answered = threading.Event()

    def bind(self, pod: Any, node_name: str, annotations: Any) -> None:
        super().bind(pod, node_name, annotations)
        assert self.answered.wait(60), "bind answer never released"


def test_a_bound_pod_deleted_before_its_bind_answered_wakes_the_pods_its_card_turned_away() -> None:
    """a's bind lands but its answer is slow; a is deleted meanwhile, so its card leaves the
    ledger only once the answer comes (it might have landed on a successor). b, turned away
    while the card was held, must be retried when it is freed — not at the 5-minute flush."""
    truth, clock = gpu_node_truth(), SimulatedClock()
    adv = _SlowAnswer(truth)
    with scheduler_on(adv, clock) as sched:
        truth.apply_pod(gpu_pod("a", uid="uid-a"))
        adv.deliver_all()
        assert sched.schedule_one()  # a bound in the cluster, the answer on its way
        truth.apply_pod(gpu_pod("b", uid="uid-b"))
        adv.deliver_all()
        sched.schedule_one()  # b: no room
        truth.delete_pod("default/a")
        adv.deliver_all()  # a's delete: its card waits for the bind's answer
        clock.advance(20)
        while sched.schedule_one():
            pass  # b turned away again
        assert truth.pods["default/b"].node_name == ""
        adv.answered.set()
        sched.run_until_idle()
        clock.advance(20)  # past any backoff, far short of the 300 s flush
        sched.run_until_idle()
        assert truth.pods["default/b"].node_name == "g0"
    assert_no_card_overcommitted(truth)


# -- a 201 for a stale bind, with the old pod's delete seen only afterwards -----------------------


def test_a_stale_bind_answered_201_before_the_delete_is_seen_never_overcommits() -> None:
    """v1.20 binds by name: uid-1's bind lands on the re-created uid-2 and answers 201 before
    the scheduler has seen either change, so uid-1 counts as bound. Then uid-1's delete
    arrives, ahead of uid-2's bound event: the card is held by uid-2 through that binding and
    must not be handed to z in between (chaos seed 371751008: two cards at 125 %)."""
    truth, clock = gpu_node_truth(cards=1), SimulatedClock()
    adv = AdversarialCluster(truth)
    adv.ignore_binding_uid = True
    adv.gate = threading.Event()
    with scheduler_on(adv, clock, bind_workers=1) as sched:
        truth.apply_pod(gpu_pod("web-0", uid="uid-1"))
        adv.deliver_all()
        assert sched.schedule_one()  # uid-1 assumed on the only card, its bind on the wire
        truth.delete_pod("default/web-0")
        truth.apply_pod(gpu_pod("web-0", uid="uid-2"))  # none of it seen yet
        adv.gate.set()
        assert sched.drain(block=True, timeout=10) == 1  # uid-1's outcome: 201, "bound"
        assert truth.pods["default/web-0"].node_name == "g0"  # it landed on uid-2
        adv.deliver(0)  # uid-1's delete, alone: uid-2's add and bound event still pending
        truth.apply_pod(gpu_pod("z", uid="uid-z"))
        adv.deliver(1)  # z's add (web-0's next change stays pending)
        clock.advance(20)
        for _ in range(5):
            sched.run_until_idle()  # z must find no room while uid-2 holds the card
            clock.advance(20)
        adv.deliver_all()
        sched.run_until_idle()
        assert not truth.pods["default/z"].node_name
    assert_no_card_overcommitted(truth)


def test_close_survives_a_bind_that_answers_after_the_shutdown_wait() -> None:
    """SIGTERM: stop_binding's wait runs out with a bind on the wire; the bind answers while
    close() shuts the pool down. Its outcome (an event to write) must not raise out of close()
    ("cannot schedule new futures after shutdown"): run's shutdown would stop half-way."""
    truth = gpu_node_truth(cards=1)
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    with scheduler_on(adv, bind_workers=1) as sched:
        truth.apply_pod(gpu_pod("p", uid="uid-p"))
        adv.deliver_all()
        assert sched.schedule_one()
        assert not sched.stop_binding(timeout=0.01)  # still on the wire
        threading.Timer(0.1, adv.gate.set).start()
        sched.close()  # waits for the bind, then applies its outcome
        assert truth.pods["default/p"].node_name == "g0"

# -- issue 23, finding 3: a hostile device-allocated annotation never frees a card ---------------

NEGATIVE_CARD_0 = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-100",'
    '"koordinator.sh/gpu-memory":"-16Gi","koordinator.sh/gpu-memory-ratio":"-100"}}]}'
)


def gpu_minors(truth: InMemoryCluster, key: str) -> list[int]:
    text = truth.pods[key].annotations.get(ANNOTATION_DEVICE_ALLOCATED, "")
    return [a.minor for a in decode_allocations(text).get("gpu", [])] if text else []


def test_negative_amounts_on_a_pod_bound_by_node_name_never_let_two_pods_share_a_card() -> None:
    """A pod created with spec.nodeName (no scheduler runs) and -100 on card 0 made the ledger
    count card 0 as 200 % free, so the next two whole-card pods were both given card 0. The
    annotation is invalid: card 0 counts as fully taken, and the pod gets one Warning."""
    truth = gpu_node_truth(cards=2)
    adv = AdversarialCluster(truth)
    with scheduler_on(adv) as sched:
        truth.apply_pod(
            make_pod("hostile").req(cpu="1").node("g0")
            .annotation(ANNOTATION_DEVICE_ALLOCATED, NEGATIVE_CARD_0).obj()
        )
        truth.apply_pod(gpu_pod("a"))
        truth.apply_pod(gpu_pod("b"))
        adv.deliver_all()
        sched.run_until_idle()
        adv.deliver_all()
        sched.run_until_idle()
        sched.wait_for_writes()
    placed = {k: gpu_minors(truth, k) for k in ("default/a", "default/b")}
    assert sorted(m for ms in placed.values() for m in ms) == [1], placed
    warnings = [e for e in truth.events
                if e.pod_key == "default/hostile" and e.reason == "InvalidDeviceAllocation"]
    assert len(warnings) == 1 and warnings[0].type == "Warning", truth.events


def test_a_placement_for_a_pod_whose_delete_was_applied_reserves_nothing() -> None:
    """The extender's bind reads the pod, then the pod is deleted and the scheduler applies
    that delete before the bind reaches ``place``: assuming it now would hold its card for ever
    (no delete will come again) and, on v1.20, bind a same-name successor. It answers "gone"."""
    truth = gpu_node_truth(cards=1)
    adv = AdversarialCluster(truth)
    adv.ignore_binding_uid = True
    with scheduler_on(adv) as sched:
        ext = make_pod("e").uid("uid-e").req(cpu="1").req(WHOLE_CARD).scheduler("default-scheduler")
        truth.apply_pod(ext.obj())
        adv.deliver_all()
        sched.drain()
        read = truth.pods["default/e"]  # what the extender's GET returned
        truth.delete_pod("default/e")
        adv.deliver_all()
        sched.drain()  # the delete is applied before the bind arrives
        placement = sched.place(OURS, read, "g0")
        sched.run_until_idle()
        assert placement.result(timeout=10).resolution == "gone"
        truth.apply_pod(gpu_pod("z", uid="uid-z"))
        adv.deliver_all()
        sched.run_until_idle()
        assert truth.pods["default/z"].node_name == "g0"
        assert adv.bind_calls == 1  # z's only
    assert_no_card_overcommitted(truth)


def _extender_pod(uid: str) -> dict[str, Any]:
    return make_pod("e").uid(uid).req(cpu="1").req(WHOLE_CARD).scheduler("default-scheduler").obj()


def test_a_placed_pod_the_informer_never_saw_is_released_when_a_newer_one_takes_its_name() -> None:
    """The extender places uid-1, read from the API server before our watch delivered it; it
    is deleted and re-created (uid-2) and a relist folds all of that into "uid-2 exists": no
    delete of uid-1 will ever come. uid-1's bind (v1.20: it landed on uid-2) must not hold a
    card for ever: a newer incarnation holding the name supersedes the assumed one."""
    truth, clock = gpu_node_truth(cards=2), SimulatedClock()
    adv = AdversarialCluster(truth)
    adv.ignore_binding_uid = True
    with scheduler_on(adv, clock) as sched:
        truth.apply_pod(_extender_pod("uid-1"))
        first = truth.pods["default/e"]  # the extender's read; our watch has not delivered it
        truth.delete_pod("default/e")
        truth.apply_pod(_extender_pod("uid-2"))
        placed = sched.place(OURS, first, "g0")
        sched.run_until_idle()
        assert placed.result(timeout=10).bound  # 201: it landed on uid-2
        adv.drop_pending()
        adv.relist()  # "uid-2 exists, bound": uid-1 was never seen
        sched.run_until_idle()
        for name in ("a", "b"):
            truth.apply_pod(gpu_pod(name, uid=f"uid-{name}"))
        adv.deliver_all()
        clock.advance(20)
        sched.run_until_idle()
        clock.advance(20)
        sched.run_until_idle()
        bound = sorted(p.name for p in truth.pods.values() if p.node_name)
        assert bound == ["a", "e"], bound  # one card for uid-2, the other for a; b: none
        adv.deliver_all()
        sched.drain()
        assert not sched.cache.assumed_pods()
    assert_no_card_overcommitted(truth)


def test_a_late_event_of_an_older_incarnation_never_releases_a_newer_assumed_one() -> None:
    """The extender places uid-2 (read from the API server) while our watch still has to
    deliver uid-1's add: that older record must not count as superseding uid-2."""
    truth = gpu_node_truth(cards=1)
    adv = AdversarialCluster(truth)
    adv.gate = threading.Event()
    with scheduler_on(adv) as sched:
        truth.apply_pod(_extender_pod("uid-1"))
        truth.delete_pod("default/e")
        truth.apply_pod(_extender_pod("uid-2"))
        placed = sched.place(OURS, truth.pods["default/e"], "g0")
        sched.drain(block=True, timeout=5)  # uid-2 assumed, its bind on the wire
        adv.deliver(0)  # uid-1's add, late
        sched.drain()
        assert [p.uid for p in sched.cache.assumed_pods()] == ["uid-2"]
        adv.gate.set()
        sched.run_until_idle()
        assert placed.result(timeout=10).bound


@pytest.mark.parametrize(
    "marker",
    [
        {"annotation": ("gang.scheduling.koordinator.sh/name", "train")},
        {"label": ("pod-group.scheduling.sigs.k8s.io", "train")},
    ],
    ids=["gang-annotation", "pod-group-label"],
)
def test_a_gang_pod_is_refused_with_how_when_the_profile_has_no_coscheduling(
    marker: dict[str, tuple[str, str]],
) -> None:
    """Without Coscheduling a gang's members would be bound one by one, silently — the
    opposite of what the annotation asks. The pod is refused with a message saying how."""
    truth = gpu_node_truth(cards=1)
    adv = AdversarialCluster(truth)
    with scheduler_on(adv) as sched:
        pod = make_pod("worker-0").uid("uid-w").req(cpu="1").req(WHOLE_CARD).scheduler(OURS)
        for kind, (key, value) in marker.items():
            pod = pod.annotation(key, value) if kind == "annotation" else pod.label(key, value)
        truth.apply_pod(pod.obj())
        adv.deliver_all()
        sched.run_until_idle()
        assert not truth.pods["default/worker-0"].node_name
        message = sched.failures["default/worker-0"]
        assert "gang default/train" in message and "Coscheduling" in message, message
