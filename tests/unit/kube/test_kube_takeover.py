"""Issue 23, finding 2, in process: two Scheduler replicas over one true cluster, the Lease
handed from A to B while B's pod watch is behind but in order. B schedules through the
catch-up gate (``scheduler.kube.catchup.CatchUp``) as ``run``'s ``ready()`` does."""

from __future__ import annotations

import threading

import pytest

from scheduler.core import Scheduler
from scheduler.framework.events import Change
from scheduler.kube.catchup import CatchUp
from scheduler.simulator.cluster import InMemoryCluster
from tests.adversarial_cluster import AdversarialCluster
from tests.builders import make_pod
from tests.fakes import FakeClock
from tests.unit.test_scheduler_faults import (
    OURS,
    WHOLE_CARD,
    assert_no_card_overcommitted,
    gpu_node_truth,
    gpu_pod,
    scheduler_on,
)


class WatchedPods:
    """``PodFeed`` over an AdversarialCluster whose watch the test delivers in order
    (``deliver_all``): its last-seen version is that of the newest pod record delivered."""

    def __init__(self, adv: AdversarialCluster) -> None:
        self.resource_version = "0"
        self.lists_started = 0
        self.list_delivered = 0
        self.relists_asked = 0
        adv.subscribe(self._seen)

    def _seen(self, change: Change) -> None:
        if change.kind == "Pod" and change.new is not None:
            rv = change.new.resource_version
            self.resource_version = max(self.resource_version, rv, key=int)

    def relist(self) -> None:
        self.relists_asked += 1


def quorum_rv(truth: InMemoryCluster) -> str:
    """What a LIST with no resourceVersion answers: a version no older than any write so far."""
    return str(max(int(p.resource_version) for p in truth.pods.values()))


def ready_then_schedule(sched: Scheduler, gate: CatchUp) -> bool:
    """``run``'s loop: schedule only when ready."""
    if not gate.caught_up():
        sched.drain()  # caches stay warm meanwhile, as Scheduler.run does
        return False
    sched.run_until_idle()
    return True


@pytest.mark.parametrize("stale_uid", [False, True], ids=["bind", "stale-uid-bind"])
def test_a_new_leader_never_schedules_from_a_view_older_than_the_old_leaders_last_bind(
    stale_uid: bool,
) -> None:
    """A binds p1 (the only card, 100 %) during its graceful hand-over; B takes the Lease with
    p1's add and a higher-priority p2's add applied, not p1's binding. Stale-UID variant: p1 is
    deleted and re-created while A's bind is on the wire, and the bind lands on the successor
    (a v1.20 API server binds by name). Either way B must not put p2 on the card before it has
    applied every event up to its quorum LIST: no card shared twice at any step."""
    truth = gpu_node_truth(cards=1)
    adv_a, adv_b = AdversarialCluster(truth), AdversarialCluster(truth)
    adv_a.gate = threading.Event()
    adv_a.ignore_binding_uid = stale_uid
    pods_b = WatchedPods(adv_b)
    clock = FakeClock()
    gate = CatchUp(lambda: quorum_rv(truth), pods_b, clock=clock.now, relist_after=1.0)
    with scheduler_on(adv_a) as a, scheduler_on(adv_b) as b:
        truth.apply_pod(gpu_pod("p1", uid="uid-1"))
        adv_a.deliver_all()
        adv_b.deliver_all()
        assert a.schedule_one()  # A: p1 on card 0, its bind on the wire
        if stale_uid:
            truth.delete_pod("default/p1")
            truth.apply_pod(gpu_pod("p1", uid="uid-2"))
        truth.apply_pod(
            make_pod("p2").req(cpu="1").req(WHOLE_CARD).priority(1000).scheduler(OURS).obj()
        )
        adv_b.deliver_all()  # B's watch, in order: everything so far, p1's binding not yet
        adv_a.gate.set()
        assert a.stop_binding(10)  # A's graceful hand-over: its last bind lands, A releases
        p1 = truth.pods["default/p1"]
        assert p1.node_name == "g0" and p1.uid == ("uid-2" if stale_uid else "uid-1")

        gate.leading_changed(True)  # B takes the Lease
        gate.step()  # its quorum LIST
        for _ in range(3):
            assert not ready_then_schedule(b, gate)
            clock.advance(0.4)
            gate.step()
        assert adv_b.bind_calls == 0 and pods_b.relists_asked == 1  # a quiet watch: relist
        assert_no_card_overcommitted(truth)

        adv_b.deliver_all()  # B's watch applies p1's binding: caught up
        assert ready_then_schedule(b, gate)
        assert_no_card_overcommitted(truth)
        adv_b.deliver_all()  # whatever B's own writes caused (a preemption of p1)
        b.run_until_idle()
        assert_no_card_overcommitted(truth)
    assert "default/p1" not in truth.pods  # B saw p1 on the card and preempted it instead
