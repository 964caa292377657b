"""The scheduler (kube-scheduler's scheduler.go): builds the profiles, the cache and the queue,
and owns the loop of the scheduling thread — ``drain`` (the inbox: cluster changes, binding
outcomes, ``call_soon`` calls), ``schedule_one``, ``run``, ``run_until_idle`` — and the
graceful stop (``stop_binding``, ``close``).

The rooms it is made of: ``scheduler.core.events`` (changes in), ``scheduler.core.
scheduling_cycle`` (one pod up to Permit), ``scheduler.core.binding_cycle`` (the bind on a
worker, and the ownership rule: what only the scheduling thread may touch, what a bind worker
may) and ``scheduler.core.outcomes`` (a bind's outcome applied).

Invariants: every placement is assumed in the cache before its bind starts; a bind that
*certainly* failed releases everything it reserved, and one whose outcome is uncertain (answer
lost, 409) is resolved by reading the pod back first — a reservation is never released for a
pod the cluster shows bound to our node, and never by a timer; an unschedulable pod gets
exactly one FitError message built by ``scheduler.framework.types.fit_error_message``.

Fencing: ``stop_binding`` closes the binding path (no bind starts after it) and waits, bounded,
for the binds in flight; the Kubernetes adapter also checks the leader lease immediately
before each POST. At most ``max_in_flight`` binds are queued or running, so a deposed leader
has no long backlog of old decisions.
"""

from __future__ import annotations

import queue as stdqueue
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

from scheduler.backend.cache import Cache
from scheduler.backend.queue import SchedulingQueue
from scheduler.cluster import Cluster
from scheduler.config import Plugins, SchedulerConfiguration
from scheduler.core.base import GANG_PLUGIN, BindOutcome, Call
from scheduler.core.outcomes import BindingOutcomes
from scheduler.core.scheduling_cycle import SchedulingCycle
from scheduler.core.types import (
    MonotonicClock,
    NullSchedulerObserver,
    Placement,
    Preemption,
    QueueStats,
    SchedulerObserver,
)
from scheduler.framework.events import ClusterEvent
from scheduler.framework.interfaces import Clock, Handle, PluginFactory
from scheduler.framework.nominator import Nominator
from scheduler.framework.runtime import Framework, FrameworkError
from scheduler.framework.waiting import WaitingPods

NOT_READY_POLL = 0.1
QUEUE_STATS_INTERVAL = 1.0
PREEMPTIONS_KEPT = 1000

__all__ = ["Placement", "Preemption", "QueueStats", "Scheduler", "SchedulerObserver"]


class Scheduler(SchedulingCycle, BindingOutcomes):
    """Builds the profiles and runs the scheduling loop against a Cluster."""

    def __init__(
        self,
        config: SchedulerConfiguration,
        cluster: Cluster,
        registry: Mapping[str, PluginFactory],
        default_plugins: Plugins | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        observer: SchedulerObserver | None = None,
        bind_workers: int = 4,
        max_in_flight: int | None = None,
        executor: Executor | None = None,
        on_incoming: Callable[[str, str], None] | None = None,
        log_decisions: bool = False,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.clock = clock or MonotonicClock()
        self.rng = rng or random.Random()
        self.observer = observer or NullSchedulerObserver()
        self.cache = Cache(self.clock)
        self._event_handlers = []
        shared: dict[str, Any] = {}
        self.waiting_pods = WaitingPods()
        self.nominator = Nominator()
        self.profiles = {}
        for profile in config.profiles:
            handle = Handle(
                self.cache.snapshot,
                cluster,
                self.clock,
                profile.scheduler_name,
                shared=shared,
                event_handlers=self._event_handlers,
                waiting_pods=self.waiting_pods,
                nominator=self.nominator,
                write_soon=self._io,
            )
            self.profiles[profile.scheduler_name] = Framework(
                profile, registry, handle, default_plugins, self.observer
            )
        self.gang_profiles = {
            name for name, f in self.profiles.items() if GANG_PLUGIN in f.plugins_at("permit")
        }
        """Profiles that schedule gangs (the others refuse gang pods, saying how)."""
        sorts = {tuple(f.plugins_at("queue_sort")) for f in self.profiles.values()}
        if len(sorts) > 1:
            raise FrameworkError("all profiles must use the same queueSort plugin")
        first = next(iter(self.profiles.values()))
        registered: dict[ClusterEvent, set[str]] = {}
        for fwk in self.profiles.values():
            for event, names in fwk.events_to_register().items():
                registered.setdefault(event, set()).update(names)
        self.queue = SchedulingQueue(
            first.queue_sort.less,
            self.clock,
            initial_backoff=config.pod_initial_backoff_seconds,
            max_backoff=config.pod_max_backoff_seconds,
            registered_events={e: frozenset(n) for e, n in registered.items()},
            on_incoming=on_incoming,
            sort_key=getattr(first.queue_sort, "sort_key", None),
        )
        self._log_decisions = log_decisions
        self.queue_stats = None
        self._stats_due = float("-inf")
        self._inbox = stdqueue.SimpleQueue()
        self._binder = executor or ThreadPoolExecutor(
            max(1, bind_workers), thread_name_prefix="bind"
        )
        self._in_flight = 0
        self._binds_queued = 0
        self._max_in_flight = max_in_flight or 4 * max(1, bind_workers)
        self._closing = threading.Event()
        self._bind_lock = threading.Lock()
        self._bind_futures = set()
        self._io_lock = threading.Lock()
        self._pending_io = set()
        self._next_start_index = 0
        self._binding = set()
        self._deleted_while_binding = set()
        self._deferred = {}
        self._read_back = {}
        self._read_back_held = {}
        self._deleted_uids = OrderedDict()
        self.preemptions = deque(maxlen=PREEMPTIONS_KEPT)
        self.failures = {}
        self.cluster.subscribe(self._inbox.put)

    # -- the loop ---------------------------------------------------------------------------------

    def drain(self, block: bool = False, timeout: float | None = None) -> int:
        """Apply every queued change and bind outcome; returns how many were applied."""
        n = 0
        while True:
            try:
                item = self._inbox.get(block=block and n == 0, timeout=timeout)
            except stdqueue.Empty:
                return n
            n += 1
            if isinstance(item, BindOutcome):
                self._finish_binding(item)
            elif isinstance(item, Call):
                item.run()
            else:
                self._apply(item)

    def schedule_one(self) -> bool:
        """Apply pending changes and schedule at most one pod; False when none was ready."""
        self.drain()
        if self._closing.is_set() or self._binds_queued >= self._max_in_flight:
            return False
        self.queue.flush()
        qpi = self.queue.pop()
        if qpi is None:
            return False
        fwk = self.profiles.get(qpi.pod.scheduler_name)
        if fwk is None or qpi.pod.terminating or self.cache.get_pod(qpi.pod) is not None:
            return True
        self._schedule(fwk, qpi)
        return True

    def run_until_idle(self, timeout: float = 60.0) -> None:
        """Schedule until no pod is ready and no bind is in flight (the simulator's loop).

        Pods left backing off or unschedulable stay where they are: nothing more will change.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.schedule_one():
                continue
            if self._in_flight == 0:
                self.drain()
                if self._in_flight == 0 and not self.queue.pending_counts()["active"]:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("scheduler did not become idle")
            self.drain(block=True, timeout=0.05)

    def run(self, stop: threading.Event, ready: Callable[[], bool] = lambda: True) -> None:
        """The long-running loop: schedule while ``ready()``, sleep on the inbox otherwise.

        Also publishes ``queue_stats`` (for metrics) at most every ``QUEUE_STATS_INTERVAL``."""
        while not stop.is_set():
            self._publish_queue_stats()
            if not ready():
                # Readiness (leadership, cache sync) changes outside the inbox: poll it often
                # so a new leader starts within ~0.1 s, and keep caches warm meanwhile.
                self.drain(block=True, timeout=NOT_READY_POLL)
                continue
            if self.schedule_one():
                continue
            wake = self.queue.next_wakeup()
            wait = 1.0 if wake is None else min(1.0, max(0.0, wake - self.clock.now()))
            self.drain(block=True, timeout=max(wait, 0.001))

    def stop_binding(self, timeout: float) -> bool:
        """Graceful stop, step one: no new scheduling cycle or bind starts from now on; wait
        up to ``timeout`` s for the binds in flight. True when none is left running."""
        self._closing.set()
        with self._bind_lock:
            pending = list(self._bind_futures)
        _, not_done = futures_wait(pending, timeout=timeout)
        self.drain()
        return not not_done

    def close(self) -> None:
        self._closing.set()
        self._binder.shutdown(wait=True)
        self.drain()

    def _publish_queue_stats(self) -> None:
        now = self.clock.now()
        if now < self._stats_due:
            return
        self._stats_due = now + QUEUE_STATS_INTERVAL
        unschedulable: dict[tuple[str, str], int] = {}
        for qpi in self.queue.pending_pods():
            if self.queue.sub_queue_of(qpi.key) != "unschedulable":
                continue
            for plugin in qpi.unschedulable_plugins | qpi.pending_plugins:
                key = (plugin, qpi.pod.scheduler_name)
                unschedulable[key] = unschedulable.get(key, 0) + 1
        self.queue_stats = QueueStats(self.queue.pending_counts(), unschedulable)
