"""Model-based test of Scheduler + cache + DeviceShare over an adversarial cluster.

A hypothesis ``RuleBasedStateMachine`` interleaves, in any order: pods created, deleted and
re-created under the same name (new UID); the watch delivering late, out of order across
objects, twice, or dropping everything until a relist; scheduling cycles; binds held "on the
wire" and released in any order, answered ``ok``, ``409``, ``500`` or ``lost`` (applied, the
answer lost); time passing. After every step: no GPU card carries more than its capacity in
the cluster's TRUE state (the device-allocated annotations of live bound pods). At the end,
once faults stop and everything settles: every live pod is bound exactly once, or is
reported unschedulable and really fits on no card; the scheduler's cache counts exactly the
pods the cluster shows bound.

Bounded for ``make test`` (a few seconds); ``MODEL_EXAMPLES=500 MODEL_STEPS=120`` (env) runs
a longer search.
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apis.resources import GPU_CORE, GPU_MEMORY_RATIO
from scheduler.config import parse_config
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.scheduler import Scheduler
from scheduler.simulator.run import SimulatedClock
from tests.adversarial_cluster import BIND_ANSWERS, AdversarialCluster, card_usage
from tests.builders import make_pod
from tests.fakes import ManualExecutor
from tests.unit.test_scheduler_faults import CONFIG, DS, OURS, gpu_node_truth

NODES, CARDS = 2, 1
NAMES = [f"p{i}" for i in range(5)]
SIZES = (50, 100)
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("MODEL_STEPS", "50"))


class SchedulerUnderFaults(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.truth = gpu_node_truth(nodes=NODES, cards=CARDS)
        self.adv = AdversarialCluster(self.truth)
        self.clock = SimulatedClock()
        self.executor = ManualExecutor()
        self.sched = Scheduler(
            parse_config(CONFIG),
            self.adv,
            in_tree_registry() | {DS: new_deviceshare},
            default_plugins(),
            clock=self.clock,
            rng=random.Random(0),
            executor=self.executor,
            max_in_flight=6,
        )
        self.uids = 0

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
        self.truth.apply_pod(pod.obj())

    @rule(name=st.sampled_from(NAMES), size=st.sampled_from(SIZES))
    def create_pod(self, name: str, size: int) -> None:
        if f"default/{name}" not in self.truth.pods:
            self._create(name, size)

    @rule(name=st.sampled_from(NAMES))
    def delete_pod(self, name: str) -> None:
        self.truth.delete_pod(f"default/{name}")

    @rule(name=st.sampled_from(NAMES), size=st.sampled_from(SIZES))
    def recreate_pod(self, name: str, size: int) -> None:
        """Same name, new UID (a StatefulSet's pod), maybe while the old bind is in flight."""
        self.truth.delete_pod(f"default/{name}")
        self._create(name, size)

    # -- the watch ----------------------------------------------------------------------------

    @rule(i=st.integers(0, 20))
    def deliver_one(self, i: int) -> None:
        self.adv.deliver(i)

    @rule()
    def deliver_all(self) -> None:
        self.adv.deliver_all()

    @rule(i=st.integers(0, 20))
    def duplicate(self, i: int) -> None:
        self.adv.duplicate(i)

    @rule()
    def watch_breaks_then_relist(self) -> None:
        self.adv.drop_pending()
        self.adv.relist()

    # -- the scheduler and its binds ----------------------------------------------------------

    @rule()
    def schedule_one(self) -> None:
        self.sched.schedule_one()

    @precondition(lambda self: bool(self.executor.tasks))
    @rule(i=st.integers(0, 10), answer=st.sampled_from(BIND_ANSWERS))
    def a_bind_or_write_returns(self, i: int, answer: str) -> None:
        """One bind (or event/condition write) held on the wire comes back; a bind is
        answered ``answer``."""
        self.adv.bind_plan.append(answer)
        self.executor.run(i)
        self.adv.bind_plan.clear()

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
            self._settle()
            self._check_settled()
        finally:
            self.sched.close()

    def _settle(self) -> None:
        self.adv.bind_plan.clear()
        for _ in range(40):
            self.adv.relist()
            self.executor.run_all()
            self.sched.drain()
            while self.sched.schedule_one():
                self.executor.run_all()
                self.sched.drain()
            self.executor.run_all()
            self.adv.deliver_all()
            self.sched.drain()
            self.clock.advance(600)  # backoffs and the unschedulable pool's timeout
            if not self.executor.tasks and not self.adv.pending and not self._ready():
                break

    def _ready(self) -> bool:
        """Pods left to try: active, or backing off (the clock has just moved past it)."""
        self.sched.queue.flush()
        counts = self.sched.queue.pending_counts()
        return bool(counts["active"] or counts["backoff"])

    def _check_settled(self) -> None:
        self.no_card_over_its_capacity_in_the_true_state()
        usage = card_usage(self.truth)
        free = {
            (f"g{n}", m): 100 - max(usage.get((f"g{n}", m), (0, 0)))
            for n in range(NODES)
            for m in range(CARDS)
        }
        bound_uids = set()
        for pod in self.truth.pods.values():
            if pod.node_name:
                bound_uids.add(pod.uid)
                continue
            size = pod.requests.get(GPU_CORE, 0)
            assert pod.key in self.sched.failures, (
                f"{pod.key} ({pod.uid}) neither bound nor reported"
            )
            assert max(free.values()) < size, f"{pod.key} needs {size}, free cards: {free}"
        cached = {
            p.uid for info in self.sched.cache.snapshot.node_infos() for p in info.pods.values()
        }
        assert cached == bound_uids
        assert not self.sched.cache.assumed_pods()


SchedulerUnderFaults.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_scheduler_under_faults = SchedulerUnderFaults.TestCase
