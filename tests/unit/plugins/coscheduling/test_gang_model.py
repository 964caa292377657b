"""Model-based test of Coscheduling + DeviceShare over the adversarial cluster (a lagging,
relisting watch; binding by name as v1.20 does).

A hypothesis ``RuleBasedStateMachine`` interleaves, in any order: gang members created (two
Strict gangs by annotation, one by a PodGroup, one NonStrict), plain pods created, pods
deleted, scheduling cycles, binds and cluster writes held "on the wire" and released in any
order, and time passing beyond the gangs' waiting time (their Permit waits time out; their
pods get the timeout mark). After every step:

- a Strict gang is never partly bound: every bind of a member (checked in the cluster's bind,
  at the moment it lands) happens only once ``min-available`` members of its gang were let
  through Permit (allowed, or bound) in the gang's current life (from its first pod until its
  last is gone), so a gang's bound members are 0 or came from a complete group;
- no GPU card carries more than its capacity in the cluster's true state;
- a pod carrying the timeout mark is never bound afterwards.

Binds run on a ``ManualExecutor`` (in the test thread); a held Permit wait blocks for at most
the gangs' waiting time (``WAIT``, real time, a few milliseconds). Bounded for ``make test``;
``MODEL_EXAMPLES`` / ``MODEL_STEPS`` (env) run a longer search.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apis.core import Pod
from apis.gang import ANNOTATION_TIMEOUT, gang_of
from apis.resources import GPU_CORE, GPU_MEMORY_RATIO
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.framework.waiting import WaitingPod
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.run import SimulatedClock
from tests.adversarial_cluster import AdversarialCluster, card_usage
from tests.builders import make_pod
from tests.fakes import ManualExecutor
from tests.unit.test_scheduler_faults import DS, OURS, gpu_node_truth

G = "gang.scheduling.koordinator.sh"
CS = "Coscheduling"
WAIT = 0.015  # seconds: the gangs' waiting time (real time: Permit waits block on it)
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("MODEL_STEPS", "40"))
NODES, CARDS = 2, 2

# gang -> (min-available, mode, by PodGroup)
GANGS: dict[str, tuple[int, str, bool]] = {
    "a": (3, "Strict", False),
    "b": (2, "Strict", False),
    "pg": (2, "Strict", True),
    "loose": (2, "NonStrict", False),
}
MEMBERS = [f"{g}-{i}" for g in GANGS for i in range(4)]
PLAIN = [f"plain-{i}" for i in range(3)]
SIZES = (50, 100)

STRADDLE = "Straddle"


class Straddle:
    """A Filter plugin that, when armed, runs one held binding cycle (or write) in the middle
    of the next scheduling cycle: a Permit wait that times out in its bind worker while
    another member's cycle is under way — the interleaving a real worker pool produces."""

    name = STRADDLE

    def __init__(self, executor: ManualExecutor) -> None:
        self.executor = executor
        self.armed: int | None = None

    def filter(self, state: Any, pod: Pod, node: Any) -> None:
        if self.armed is not None:
            i, self.armed = self.armed, None
            self.executor.run(i)


CONFIG: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": OURS,
            "plugins": {
                "queueSort": {"enabled": [{"name": CS}], "disabled": [{"name": "*"}]},
                "preFilter": {"enabled": [{"name": DS}, {"name": CS}]},
                "filter": {"enabled": [{"name": DS}, {"name": STRADDLE}]},
                "preScore": {"enabled": [{"name": DS}]},
                "score": {"enabled": [{"name": DS}]},
                "reserve": {"enabled": [{"name": DS}, {"name": CS}]},
                "permit": {"enabled": [{"name": CS}]},
                "preBind": {"enabled": [{"name": DS}]},
            },
        }
    ],
}


class GangsOnCards(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.truth = gpu_node_truth(nodes=NODES, cards=CARDS)
        self.truth.apply_pod_group(
            {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "pg", "namespace": "default"},
                "spec": {"minMember": GANGS["pg"][0], "scheduleTimeoutSeconds": 1},
            }
        )
        self.clock = SimulatedClock()
        self.executor = ManualExecutor()
        self.straddle = Straddle(self.executor)
        self.adv = AdversarialCluster(self.truth)
        self.adv.ignore_binding_uid = True  # v1.20 binds by name
        self.prompt_watch = False
        """True: every change reaches the scheduler before its next step (the examples
        replayed below were found with a prompt watch)."""
        self.sched = Scheduler(
            parse_config(CONFIG),
            self.adv,
            in_tree_registry() | {STRADDLE: lambda args, handle: self.straddle},
            default_plugins(),
            clock=self.clock,
            rng=random.Random(0),
            executor=self.executor,
            max_in_flight=8,
        )
        self.waits: dict[str, WaitingPod] = {}
        """Every Permit wait by pod uid (the latest), kept after the scheduler drops it."""
        register = self.sched.waiting_pods.add

        def add(waiting: WaitingPod) -> None:
            self.waits[waiting.pod.uid] = waiting
            register(waiting)

        self.sched.waiting_pods.add = add  # type: ignore[method-assign]
        self.uids = 0
        self.let_through: dict[str, set[str]] = {g: set() for g in GANGS}
        """Per gang, in its current life: uids ever seen past Permit (allowed or bound)."""
        self.marked: set[str] = set()
        self.violations: list[str] = []
        self.truth.bind_hook = self._binding

    # -- the cluster's users ------------------------------------------------------------------

    def _create(self, name: str, size: int) -> None:
        self.uids += 1
        pod = (
            make_pod(name)
            .uid(f"uid-{self.uids}")
            .req(cpu="1")
            .req({GPU_CORE: str(size), GPU_MEMORY_RATIO: str(size)})
            .scheduler(OURS)
        )
        gang = name.rsplit("-", 1)[0]
        if gang in GANGS:
            min_available, mode, by_pod_group = GANGS[gang]
            if by_pod_group:
                pod = pod.label("pod-group.scheduling.sigs.k8s.io", gang)
            else:
                pod = (
                    pod.annotation(f"{G}/name", gang)
                    .annotation(f"{G}/min-available", str(min_available))
                    .annotation(f"{G}/mode", mode)
                    .annotation(f"{G}/waiting-time", f"{WAIT * 1000:g}ms")
                )
        self.truth.apply_pod(pod.obj())

    @rule(name=st.sampled_from(MEMBERS), size=st.sampled_from(SIZES))
    def create_member(self, name: str, size: int) -> None:
        if f"default/{name}" not in self.truth.pods:
            self._create(name, size)

    @rule(name=st.sampled_from(PLAIN), size=st.sampled_from(SIZES))
    def create_plain_pod(self, name: str, size: int) -> None:
        if f"default/{name}" not in self.truth.pods:
            self._create(name, size)

    @rule(name=st.sampled_from(MEMBERS + PLAIN))
    def delete_pod(self, name: str) -> None:
        self.truth.delete_pod(f"default/{name}")

    # -- the watch ----------------------------------------------------------------------------

    @rule(i=st.integers(0, 20))
    def deliver_one(self, i: int) -> None:
        self.adv.deliver(i)

    @rule()
    def deliver_all(self) -> None:
        self.adv.deliver_all()

    @rule()
    def watch_breaks_then_relist(self) -> None:
        self.adv.drop_pending()
        self.adv.relist()

    # -- the scheduler, its binds and time ----------------------------------------------------

    def _watch(self) -> None:
        if self.prompt_watch:
            self.adv.deliver_all()

    @rule(n=st.integers(1, 3))
    def schedule(self, n: int) -> None:
        for _ in range(n):
            self._watch()
            self.sched.schedule_one()

    @precondition(lambda self: bool(self.executor.tasks))
    @rule(i=st.integers(0, 10))
    def a_bind_or_write_returns_during_a_cycle(self, i: int) -> None:
        """One held binding cycle or write runs while the next pod's cycle is under way
        (between its Filter and its Permit), as a worker does beside the scheduling thread."""
        self._watch()
        self.straddle.armed = i
        self.sched.schedule_one()
        self.straddle.armed = None

    @precondition(lambda self: bool(self.executor.tasks))
    @rule(i=st.integers(0, 10))
    def a_bind_or_write_returns(self, i: int) -> None:
        """One binding cycle (a held Permit wait ends: allowed, or timed out) or one cluster
        write (an event, a condition, a timeout mark) runs."""
        self._watch()
        self.executor.run(i)
        self._watch()
        self.sched.drain()

    @rule()
    def time_passes_beyond_the_waiting_time(self) -> None:
        time.sleep(WAIT * 1.2)
        self.clock.advance(30.0)  # past every backoff
        self._watch()
        self.executor.run_all()
        self._watch()
        self.sched.drain()

    # -- the guarantees -----------------------------------------------------------------------

    def _observe(self) -> dict[str, list[Pod]]:
        """Each gang's live pods; records who got past Permit; a gang with no pod left
        starts a new life."""
        live: dict[str, list[Pod]] = {g: [] for g in GANGS}
        for pod in self.truth.pods.values():
            spec = gang_of(pod, self.truth.pod_groups)
            if spec is not None:
                live[spec.id.split("/", 1)[1]].append(pod)
        for gang, pods in live.items():
            if not pods:
                self.let_through[gang] = set()
            for pod in pods:
                # Allowed: assumed, and never parked at Permit or let go by every plugin (a
                # wait that timed out or was rejected keeps its pending plugins).
                waiting = self.waits.get(pod.uid)
                allowed = self.sched.cache.is_assumed(pod) and (
                    waiting is None or not waiting.pending_plugins
                )
                if pod.node_name or allowed:
                    self.let_through[gang].add(pod.uid)
        return live

    def _binding(self, pod: Pod, node_name: str) -> Exception | None:
        """The cluster's bind hook: a Strict member binds only after its gang was complete."""
        spec = gang_of(pod, self.truth.pod_groups)
        if spec is not None and spec.mode == "Strict":
            self._observe()
            through = self.let_through[spec.id.split("/", 1)[1]]
            if len(through) < spec.min_available:
                self.violations.append(
                    f"{pod.key} bound with {len(through)} of min-available "
                    f"{spec.min_available} members of {spec.id} let through Permit"
                )
        return None

    @invariant()
    def a_strict_gang_is_never_partly_bound(self) -> None:
        self._observe()
        assert not self.violations, self.violations

    @invariant()
    def no_card_over_its_capacity(self) -> None:
        for card, used in card_usage(self.truth).items():
            assert max(used) <= 100, f"card {card} carries {used}"

    @invariant()
    def an_assumed_pod_is_never_also_nominated(self) -> None:
        """A member waiting at Permit is written nominated to its node (as kube-scheduler
        v1.37 does); the echo of that write must not put it in the nominator too, where it
        would count twice on that node."""
        both = [
            p.key
            for p in self.sched.cache.assumed_pods()
            if self.sched.nominator.node_of(p.uid)
        ]
        assert not both, both

    @invariant()
    def a_marked_pod_is_never_bound_afterwards(self) -> None:
        for pod in self.truth.pods.values():
            if pod.uid in self.marked:
                assert not pod.node_name, f"{pod.key} bound after its gang timed out"
            if pod.annotations.get(ANNOTATION_TIMEOUT) == "true" and not pod.node_name:
                self.marked.add(pod.uid)

    def teardown(self) -> None:
        self.sched.close()


GangsOnCards.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_gangs_on_cards = GangsOnCards.TestCase


def test_a_member_deleted_while_waiting_at_permit_does_not_complete_its_gang() -> None:
    """The example the state machine found (shrunk, replayed step by step with the invariants
    checked after each, as hypothesis does): b-1 waits at Permit for its gang (2 of 2) and is
    deleted; b-0 then reaches Permit. The delete must reach Coscheduling at once (b-1's wait is
    rejected, so its bind can never be sent) and b-0 must wait instead of being let through
    with a gang of one. Before, that delete was held back like the delete of a pod whose bind
    is on the wire, and b-0 was bound alone."""
    s = GangsOnCards()
    s.prompt_watch = True
    steps: list[tuple[str, dict[str, Any]]] = [
        *[("time_passes_beyond_the_waiting_time", {})] * 5,
        ("delete_pod", {"name": "a-0"}),
        ("create_member", {"name": "loose-1", "size": 50}),
        ("time_passes_beyond_the_waiting_time", {}),
        ("create_member", {"name": "b-1", "size": 50}),
        ("time_passes_beyond_the_waiting_time", {}),
        ("schedule", {"n": 2}),
        *[("time_passes_beyond_the_waiting_time", {})] * 4,
        ("create_member", {"name": "loose-0", "size": 50}),
        *[("time_passes_beyond_the_waiting_time", {})] * 3,
        ("create_member", {"name": "b-0", "size": 50}),
        *[("time_passes_beyond_the_waiting_time", {})] * 8,
        ("schedule", {"n": 3}),  # b-1 waits at Permit for a second member
        ("delete_pod", {"name": "b-1"}),
        ("schedule", {"n": 1}),  # b-0 reaches Permit
        ("time_passes_beyond_the_waiting_time", {}),
    ]
    try:
        for rule_name, kwargs in steps:
            getattr(s, rule_name)(**kwargs)
            s.a_marked_pod_is_never_bound_afterwards()
            s.a_strict_gang_is_never_partly_bound()
            s.no_card_over_its_capacity()
    finally:
        s.teardown()


def test_a_member_whose_wait_timed_out_is_not_counted_by_the_next_members_permit() -> None:
    """b-0 waits at Permit for its gang (2 of 2, Strict); its wait times out in its bind
    worker while b-1's scheduling cycle is under way, so b-0's Unreserve has not run yet when
    b-1 reaches Permit. b-1 must not count b-0 (its wait is decided: rejected) and must not be
    let through alone: before, b-1 was bound with a gang of one and b-0 was never retried."""
    s = GangsOnCards()
    s.prompt_watch = True
    try:
        s.create_member("b-0", 50)
        s.create_member("b-1", 50)
        s.schedule(1)  # b-0 waits at Permit, its binding cycle held
        assert len(s.executor.tasks) == 1
        time.sleep(WAIT * 1.5)  # b-0's wait is past its deadline
        s.a_bind_or_write_returns_during_a_cycle(0)  # b-0 times out during b-1's cycle
        s.a_strict_gang_is_never_partly_bound()
        s.time_passes_beyond_the_waiting_time()
        s.a_strict_gang_is_never_partly_bound()
        s.no_card_over_its_capacity()
    finally:
        s.teardown()
