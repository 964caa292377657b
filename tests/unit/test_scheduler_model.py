"""Model-based test of Scheduler + cache + DeviceShare + preemption over an adversarial cluster,
with two replicas and leader hand-overs.

A hypothesis ``RuleBasedStateMachine`` interleaves, in any order: pods of two priorities
created, deleted and re-created under the same name (new UID); each replica's watch delivering
late, out of order across objects, twice, or dropping everything until a relist; scheduling
cycles of the leader (with preemption: victims deleted, the preemptor nominated); binds held
"on the wire" and released in any order, answered ``ok``, ``409``, ``500`` or ``lost``
(applied, the answer lost); the API server binding by *name* as v1.20 does (a stale bind lands
on a same-name successor); the lease handed over, gracefully (the leader's binds finish first)
or not (its binds still queued are fenced), to a standby whose watch is behind; the deposed
replica restarting with a clean cache; kube-scheduler's binds through the extender
(``Scheduler.place``) of pods it read earlier, which may since have been deleted, re-created
or bound; time passing.

The hand-over follows the rule ``koord-scheduler run`` keeps: a new leader schedules only once
its informers have applied every change up to a consistent LIST made at acquisition (here:
its view delivers everything pending). Every leader-only write (bind, victim delete,
nomination) goes through the replica's lease fence.

After every step: no GPU card carries more than its capacity in the cluster's TRUE state (the
device-allocated annotations of live bound pods). At the end, once faults stop and everything
settles: every live pod is bound exactly once, or is reported unschedulable by the leader and
really fits on no card; the leader's cache counts exactly the pods the cluster shows bound.

Bounded for ``make test`` (a few seconds); ``MODEL_EXAMPLES=500 MODEL_STEPS=120`` (env) runs
a longer search. Gangs have their own machine (tests/unit/plugins/coscheduling/test_gang_model.py).
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apis.core import Pod
from apis.resources import GPU_CORE, GPU_MEMORY_RATIO
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.run import SimulatedClock
from tests.adversarial_cluster import BIND_ANSWERS, AdversarialCluster, card_usage
from tests.builders import make_pod
from tests.fakes import ManualExecutor
from tests.unit.test_scheduler_faults import CONFIG, DS, OURS, gpu_node_truth

NODES, CARDS = 2, 1
NAMES = [f"p{i}" for i in range(5)]
EXTENDER_NAMES = ["e0", "e1"]
"""Pods of kube-scheduler's (``default-scheduler``), bound through our extender's bind verb."""
KUBE = "default-scheduler"
SIZES = (50, 100)
PRIORITIES = (0, 100)
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("MODEL_STEPS", "50"))


class Replica:
    """One ``koord-scheduler run`` process: its own watch of the truth, its own bind pool, and
    a lease fence on every leader-only write."""

    def __init__(self, model: SchedulerUnderFaults, name: str) -> None:
        self.name = name
        self.view = AdversarialCluster(model.truth)  # starts from a LIST of the truth
        self.view.ignore_binding_uid = True  # v1.20: a Binding lands on whoever has the name
        self.view.fence = lambda: model.leader is self
        self.executor = ManualExecutor()
        self.sched = Scheduler(
            parse_config(CONFIG),
            self.view,
            in_tree_registry() | {DS: new_deviceshare},
            default_plugins(),
            clock=model.clock,
            rng=random.Random(0),
            executor=self.executor,
            max_in_flight=6,
        )


class SchedulerUnderFaults(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.truth = gpu_node_truth(nodes=NODES, cards=CARDS)
        self.clock = SimulatedClock()
        self.uids = 0
        self.incarnations = 0
        self.leader: Replica | None = None
        self.leader = self._start()
        self.other = self._start()
        self.reads: list[Pod] = []
        self.deposed = False
        """The other replica lost the lease and has not restarted yet (it never schedules)."""

    def _start(self) -> Replica:
        self.incarnations += 1
        return Replica(self, f"replica-{self.incarnations}")

    @property
    def lead(self) -> Replica:
        assert self.leader is not None
        return self.leader

    def _replica(self, which: int) -> Replica:
        return self.lead if which == 0 else self.other

    # -- the cluster's users ------------------------------------------------------------------

    def _create(self, name: str, size: int, priority: int) -> None:
        self.uids += 1
        pod = (
            make_pod(name)
            .uid(f"uid-{self.uids}")
            .req(cpu="1")
            .req({GPU_CORE: str(size), GPU_MEMORY_RATIO: str(size)})
            .priority(priority)
            .scheduler(KUBE if name in EXTENDER_NAMES else OURS)
        )
        self.truth.apply_pod(pod.obj())

    @rule(
        name=st.sampled_from(NAMES),
        size=st.sampled_from(SIZES),
        priority=st.sampled_from(PRIORITIES),
    )
    def create_pod(self, name: str, size: int, priority: int) -> None:
        if f"default/{name}" not in self.truth.pods:
            self._create(name, size, priority)

    @rule(name=st.sampled_from(EXTENDER_NAMES), size=st.sampled_from(SIZES))
    def create_extender_pod(self, name: str, size: int) -> None:
        if f"default/{name}" not in self.truth.pods:
            self._create(name, size, 0)

    @rule(name=st.sampled_from(NAMES + EXTENDER_NAMES))
    def delete_pod(self, name: str) -> None:
        self.truth.delete_pod(f"default/{name}")

    @rule(
        name=st.sampled_from(NAMES + EXTENDER_NAMES),
        size=st.sampled_from(SIZES),
        priority=st.sampled_from(PRIORITIES),
    )
    def recreate_pod(self, name: str, size: int, priority: int) -> None:
        """Same name, new UID (a StatefulSet's pod), maybe while the old bind is in flight."""
        self.truth.delete_pod(f"default/{name}")
        self._create(name, size, priority)

    # -- the watches --------------------------------------------------------------------------

    @rule(which=st.integers(0, 1), i=st.integers(0, 20))
    def deliver_one(self, which: int, i: int) -> None:
        self._replica(which).view.deliver(i)

    @rule(which=st.integers(0, 1))
    def deliver_all(self, which: int) -> None:
        self._replica(which).view.deliver_all()

    @rule(which=st.integers(0, 1), i=st.integers(0, 20))
    def duplicate(self, which: int, i: int) -> None:
        self._replica(which).view.duplicate(i)

    @rule(which=st.integers(0, 1))
    def watch_breaks_then_relist(self, which: int) -> None:
        view = self._replica(which).view
        view.drop_pending()
        view.relist()

    # -- the replicas, their binds and the lease ----------------------------------------------

    @rule()
    def schedule_one(self) -> None:
        self.lead.sched.schedule_one()

    @precondition(lambda self: not self.deposed)
    @rule()
    def standby_applies_its_watch(self) -> None:
        self.other.sched.drain()

    @rule(which=st.integers(0, 1), i=st.integers(0, 10), answer=st.sampled_from(BIND_ANSWERS))
    def a_bind_or_write_returns(self, which: int, i: int, answer: str) -> None:
        """One bind (or event/condition write) held on a replica's wire comes back; a bind is
        answered ``answer``. A deposed replica's bind reaches its fence and is not sent."""
        replica = self._replica(which)
        if not replica.executor.tasks:
            return
        replica.view.bind_plan.append(answer)
        replica.executor.run(i)
        replica.view.bind_plan.clear()

    @precondition(lambda self: not self.deposed)
    @rule(graceful=st.booleans())
    def hand_over(self, graceful: bool) -> None:
        """The standby takes the lease. Graceful (SIGTERM): the leader's binds finish while it
        still holds the lease, then it releases it. Not graceful (frozen, partitioned): its lease
        expires, and whatever it still has queued meets the fence. Either way the new leader
        first applies everything its watch has up to the moment it acquired (the catch-up on a
        consistent LIST) before its first cycle."""
        old, new = self.lead, self.other
        if graceful:
            old.executor.run_all()
        self.leader = new
        self.other, self.deposed = old, True
        new.view.deliver_all()
        new.sched.drain()

    @precondition(lambda self: self.deposed)
    @rule()
    def deposed_replica_restarts(self) -> None:
        """A replica that lost the lease exits (its remaining binds meet the fence) and its
        supervisor starts it again with a clean cache: it stands by."""
        self.other.sched.close()
        self.other, self.deposed = self._start(), False

    # -- kube-scheduler through the extender ------------------------------------------------

    @rule(name=st.sampled_from(EXTENDER_NAMES))
    def extender_reads_a_pod(self, name: str) -> None:
        """The bind verb's GET of the pod it names (the UID check): the record it will place,
        which the pod may outlive or not by the time ``place`` runs."""
        pod = self.truth.pods.get(f"default/{name}")
        if pod is not None and not pod.node_name:
            self.reads.append(pod)

    @precondition(lambda self: bool(self.reads))
    @rule(i=st.integers(0, 5), node=st.integers(0, NODES - 1))
    def extender_binds(self, i: int, node: int) -> None:
        """kube-scheduler's bind reaches ``Scheduler.place`` on the leader (it may meanwhile
        have been deleted, re-created, or bound by an earlier bind)."""
        pod = self.reads.pop(i % len(self.reads))
        self.lead.sched.place(OURS, pod, f"g{node}")
        self.lead.sched.drain()

    @rule(seconds=st.sampled_from([0.5, 2.0, 30.0, 400.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- the guarantees -----------------------------------------------------------------------

    @invariant()
    def no_card_over_its_capacity_in_the_true_state(self) -> None:
        for card, used in card_usage(self.truth).items():
            assert max(used) <= 100, f"card {card} carries {used}"

    def teardown(self) -> None:
        try:
            if self.deposed:
                self.deposed_replica_restarts()
            self._settle()
            self._check_settled()
        finally:
            self.lead.sched.close()
            self.other.sched.close()

    def _settle(self) -> None:
        lead = self.lead
        lead.view.bind_plan.clear()
        for _ in range(40):
            lead.view.relist()
            lead.executor.run_all()
            lead.sched.drain()
            while lead.sched.schedule_one():
                lead.executor.run_all()
                lead.sched.drain()
            lead.executor.run_all()
            lead.view.deliver_all()
            lead.sched.drain()
            self._kube_scheduler_retries()
            self.clock.advance(600)  # backoffs and the unschedulable pool's timeout
            if not lead.executor.tasks and not lead.view.pending and not self._ready():
                break

    def _kube_scheduler_retries(self) -> None:
        """kube-scheduler retries its unbound pods: a fresh read, a bind on each node in turn
        until one lands."""
        lead = self.lead
        for name in EXTENDER_NAMES:
            for node in range(NODES):
                pod = self.truth.pods.get(f"default/{name}")
                if pod is None or pod.node_name:
                    break
                lead.sched.place(OURS, pod, f"g{node}")
                lead.sched.drain()
                lead.executor.run_all()
                lead.sched.drain()
                lead.view.deliver_all()
                lead.sched.drain()

    def _ready(self) -> bool:
        """Pods left to try: active, or backing off (the clock has just moved past it)."""
        queue = self.lead.sched.queue
        queue.flush()
        counts = queue.pending_counts()
        return bool(counts["active"] or counts["backoff"])

    def _check_settled(self) -> None:
        self.no_card_over_its_capacity_in_the_true_state()
        sched = self.lead.sched
        usage = card_usage(self.truth)
        free = {
            (f"g{n}", m): 100 - max(usage.get((f"g{n}", m), (0, 0)))
            for n in range(NODES)
            for m in range(CARDS)
        }
        # The node's gpu-core (100 per card) as the kubelet admits it: by requests. A stale
        # bind can give a successor another pod's allocation, smaller than its request.
        requested = {f"g{n}": 0 for n in range(NODES)}
        for pod in self.truth.pods.values():
            if pod.node_name:
                requested[pod.node_name] += pod.requests.get(GPU_CORE, 0)
        bound_uids = set()
        for pod in self.truth.pods.values():
            if pod.node_name:
                bound_uids.add(pod.uid)
                continue
            size = pod.requests.get(GPU_CORE, 0)
            if pod.scheduler_name == OURS:
                assert pod.key in sched.failures, f"{pod.key} ({pod.uid}): not bound nor reported"
            fits = [
                card
                for card, left in free.items()
                if left >= size and 100 * CARDS - requested[card[0]] >= size
            ]
            assert not fits, f"{pod.key} needs {size}, fits on {fits}: {free}, {requested}"
        cached = {p.uid for info in sched.cache.snapshot.node_infos() for p in info.pods.values()}
        assert cached == bound_uids
        assert not sched.cache.assumed_pods()


SchedulerUnderFaults.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_scheduler_under_faults = SchedulerUnderFaults.TestCase
