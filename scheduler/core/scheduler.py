"""The scheduler: a serial scheduling cycle and a binding cycle that runs beside it.

One thread (the caller of ``schedule_one``/``run``) owns all scheduling state: it applies
cluster changes to the cache, the queue and the stateful plugins, runs each pod's scheduling
cycle (PreFilter → Filter with node sampling → PostFilter when nothing fits → PreScore/Score/
Normalize → select → assume → Reserve → Permit), and hands the pod to the binding cycle
(WaitOnPermit → PreBind → Bind → PostBind) on a worker pool, so the next pod never waits for the
API. Binding outcomes come back through the same inbox as cluster changes; a failure is undone
on the scheduling thread (Unreserve, forget, requeue with backoff).

Invariants: caches, queue and plugin state are only touched on the scheduling thread; every
placement is assumed in the cache before its bind starts; a bind that *certainly* failed
releases everything it reserved, and one whose outcome is uncertain (answer lost, 409) is
resolved by reading the pod back first — a reservation is never released for a pod the
cluster shows bound to our node, and never by a timer; an unschedulable pod gets exactly one
FitError message built by ``scheduler.framework.types.fit_error_message``.

Fencing: ``stop_binding`` closes the binding path (no bind starts after it) and waits, bounded,
for the binds in flight; the Kubernetes adapter also checks the leader lease immediately
before each POST. At most ``max_in_flight`` binds are queued or running, so a deposed leader
has no long backlog of old decisions.
"""

from __future__ import annotations

import dataclasses
import queue as stdqueue
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import structlog

from apis.core import Pod
from scheduler.backend.cache import Cache
from scheduler.backend.queue import SchedulingQueue
from scheduler.cluster import Cluster
from scheduler.config import (
    Plugins,
    SchedulerConfiguration,
    num_feasible_nodes_to_find,
)
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    POD_GROUP_KIND,
    Action,
    Change,
    ClusterEvent,
    Resource,
)
from scheduler.framework.interfaces import BindError, Clock, Handle, PluginFactory, QueuedPodInfo
from scheduler.framework.nominator import Nominator
from scheduler.framework.runtime import Framework, FrameworkError, Observer
from scheduler.framework.status import Code, Status
from scheduler.framework.types import Diagnosis, FitError, NodeStatuses, SlotNodes
from scheduler.framework.waiting import PERMIT_TIMED_OUT_KEY, WaitingPod, WaitingPods

PLUGIN_METRICS_SAMPLE_PERCENT = 10
RESOLVE_BACKOFF = (0.2, 5.0)
"""First and largest pause between reads of a pod whose bind outcome is uncertain."""
NOT_READY_POLL = 0.1
QUEUE_STATS_INTERVAL = 1.0
PREEMPTIONS_KEPT = 1000
DELETED_UIDS_KEPT = 10_000
"""Deleted pod UIDs remembered for ``place`` (an extender bind arrives within seconds)."""

log = structlog.get_logger("koord-scheduler")


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


class SchedulerObserver(Observer, Protocol):
    """What the metrics module is told, beyond extension-point timings."""

    def attempt(self, result: str, profile: str, seconds: float) -> None: ...

    def scheduled(self, attempts: int, sli_seconds: float) -> None: ...

    def preemption(self, victims: int | None) -> None:
        """A preemption attempt; ``victims`` is how many pods it evicted (None: it found none)."""
        ...


class _NullSchedulerObserver:
    def extension_point(self, profile: str, ep: str, status: str, seconds: float) -> None:
        pass

    def plugin(self, plugin: str, ep: str, status: str, seconds: float) -> None:
        pass

    def attempt(self, result: str, profile: str, seconds: float) -> None:
        pass

    def scheduled(self, attempts: int, sli_seconds: float) -> None:
        pass

    def preemption(self, victims: int | None) -> None:
        pass


T = TypeVar("T")
_NOTHING = Change("Pod")
"""``_defer_if_binding``'s answer when nothing is to be forwarded now."""


@dataclass(slots=True)
class _Call:
    """A function to run on the scheduling thread (``Scheduler.call_soon``)."""

    fn: Callable[[], Any]
    future: Future[Any]

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except Exception as exc:  # handed to the caller, never raised on this thread
            self.future.set_exception(exc)


@dataclass(slots=True)
class _BindOutcome:
    """Sent from the binding cycle back to the scheduling thread."""

    framework: Framework
    state: CycleState
    qpi: QueuedPodInfo
    assumed: Pod
    status: Status | None
    started: float = 0.0
    """``perf_counter`` at the start of the pod's scheduling attempt (attempt duration)."""
    resolution: str = ""
    """"bound", "failed", "gone", "fenced", "rejected" or "unknown" (see ``_resolve``)."""
    counted: bool = False
    """Counted in ``_binds_queued`` (pods that waited on Permit are not)."""
    placed: Future[Placement] | None = None
    """Set for a placement decided elsewhere (``Scheduler.place``): the outcome goes to this
    future instead of the queue (no retry, no failure report: the caller owns the pod)."""
    landed: bool = False
    """"bound" read back from the API server under this UID (not only a 201, which a v1.20
    server may have applied to a same-name successor)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """The outcome of ``Scheduler.place``: ``resolution`` as ``_BindOutcome``'s ("bound",
    "failed", "gone", "fenced", "rejected", "unknown") or "unschedulable" when the node no
    longer fits; ``message`` says why when it is not "bound"."""

    resolution: str
    message: str = ""

    @property
    def bound(self) -> bool:
        return self.resolution == "bound"


@dataclass(frozen=True, slots=True)
class Preemption:
    """A preemption this scheduler carried out: the preemptor, its node, the victims."""

    pod: Pod
    node: str
    victims: tuple[Pod, ...]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of the queue for metrics, published by ``run`` on the scheduling thread:
    pods per sub-queue, and pods in the unschedulable pool per (rejecting plugin, profile)."""

    pending: Mapping[str, int]
    unschedulable: Mapping[tuple[str, str], int]


class Scheduler:
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
        self.clock: Clock = clock or MonotonicClock()
        self.rng = rng or random.Random()
        self.observer: SchedulerObserver = observer or _NullSchedulerObserver()
        self.cache = Cache(self.clock)
        self._event_handlers: list[Callable[[Change], None]] = []
        shared: dict[str, Any] = {}
        self.waiting_pods = WaitingPods()
        self.nominator = Nominator()
        """Pods nominated to nodes by preemption, shared by every profile."""
        self.profiles: dict[str, Framework] = {}
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
        self.queue_stats: QueueStats | None = None
        self._stats_due = float("-inf")
        self._inbox: stdqueue.SimpleQueue[Change | _BindOutcome | _Call] = stdqueue.SimpleQueue()
        self._binder: Executor = executor or ThreadPoolExecutor(
            max(1, bind_workers), thread_name_prefix="bind"
        )
        """Runs binding cycles and cluster writes; tests inject one that runs them on demand."""
        self._in_flight = 0
        self._binds_queued = 0
        self._max_in_flight = max_in_flight or 4 * max(1, bind_workers)
        self._closing = threading.Event()
        self._bind_lock = threading.Lock()
        self._bind_futures: set[Future[None]] = set()
        self._io_lock = threading.Lock()
        self._pending_io: set[Future[None]] = set()
        self._next_start_index = 0
        self._binding: set[str] = set()
        """UIDs whose bind is in flight (scheduling thread)."""
        self._deleted_while_binding: set[str] = set()
        """Of those, the ones whose pod was deleted meanwhile (read by the bind workers)."""
        self._deferred: dict[str, Change] = {}
        self._read_back: dict[str, Pod] = {}
        """UID → the pod of that name found bound when a bind's outcome was read back (bind
        workers write it before the outcome is queued): applied before the reservation goes."""
        self._deleted_uids: OrderedDict[str, None] = OrderedDict()
        """UIDs of pods whose delete was applied (the latest ``DELETED_UIDS_KEPT``): a
        ``place`` for one of them comes from a read older than that delete."""
        self.preemptions: deque[Preemption] = deque(maxlen=PREEMPTIONS_KEPT)
        """The latest preemptions carried out (the simulator's report)."""
        self.failures: dict[str, str] = {}
        """Pod key -> the last failure message, for pods still waiting (the simulator's report)."""
        self.cluster.subscribe(self._inbox.put)

    # -- events -----------------------------------------------------------------------------------

    def _responsible(self, pod: Pod) -> bool:
        return pod.scheduler_name in self.profiles

    def drain(self, block: bool = False, timeout: float | None = None) -> int:
        """Apply every queued change and bind outcome; returns how many were applied."""
        n = 0
        while True:
            try:
                item = self._inbox.get(block=block and n == 0, timeout=timeout)
            except stdqueue.Empty:
                return n
            n += 1
            if isinstance(item, _BindOutcome):
                self._finish_binding(item)
            elif isinstance(item, _Call):
                item.run()
            else:
                self._apply(item)

    def call_soon(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the scheduling thread, between cycles (so it sees the caches, the
        ledger and the plugins exactly as the next cycle will); the future has its result.
        For read-only questions from other threads (``/debug/explain``)."""
        future: Future[T] = Future()
        self._inbox.put(_Call(fn, future))
        return future

    def _apply(self, change: Change) -> None:
        never_sent = False
        if change.kind == "Node":
            self.cache.apply(change)
            if change.action is Action.ADD:
                self.queue.node_added(change.new)
            elif change.action is Action.UPDATE:
                self.queue.node_updated(change.old, change.new)
            else:
                self.queue.node_deleted(change.old)
        elif change.kind == "Pod":
            for superseded in self._superseded_assumed(change):
                self._apply(Change("Pod", superseded, None))
            self._remember_deleted(change)
            never_sent = self._reject_if_waiting(change)
            unconfirmed = self._bound_unconfirmed(change)
            self._apply_pod(change.old, change.new)
            if unconfirmed:
                self._read_back_before_release(change.old)
        elif change.kind == "Device":
            self.queue.device_changed(change.action)
        elif change.kind == POD_GROUP_KIND:
            event = ClusterEvent(Resource.POD_GROUP, change.action)
            self.queue.move_all_to_active_or_backoff(event)  # gangs waiting for their PodGroup
        forward = change if never_sent else self._defer_if_binding(change)
        if forward is not _NOTHING:
            for handler in self._event_handlers:
                handler(forward)

    def _reject_if_waiting(self, change: Change) -> bool:
        """A pod deleted (or re-created) while it waits at Permit is rejected at once, as
        kube-scheduler's RejectWaitingPod on delete: its binding cycle ends now, so its
        reservation is settled without waiting for a timeout. True when the pod's wait is
        rejected: its bind will never be sent, so its delete reaches the plugins at once (a
        gang must not count a deleted member as waiting)."""
        old, new = change.old, change.new
        if old is None or (new is not None and new.uid == old.uid):
            return False
        waiting = self.waiting_pods.get(old.uid)
        if waiting is None:
            return False
        return waiting.reject("", f"pod {old.key} was deleted while waiting on Permit")

    def _superseded_assumed(self, change: Change) -> list[Pod]:
        """An assumed pod whose name a *newer* incarnation now holds: it is gone, though its
        delete may never reach us — the informer may never have seen it (a pod the extender
        read from the API server, deleted before our watch delivered it, then folded away by a
        relist). Newer by resourceVersion (etcd's revision), so a late event of an older
        incarnation never displaces a newer assumed one."""
        new = change.new
        if new is None or not new.resource_version.isdigit():
            return []
        replaced = change.old.uid if change.old is not None else ""  # _apply_pod splits that
        return [
            pod
            for pod in self.cache.assumed_named(new.key)
            if pod.uid not in (new.uid, replaced)
            and pod.resource_version.isdigit()
            and int(new.resource_version) > int(pod.resource_version)
        ]

    def _remember_deleted(self, change: Change) -> None:
        old, new = change.old, change.new
        if old is not None and (new is None or new.uid != old.uid):
            self._deleted_uids[old.uid] = None
            if len(self._deleted_uids) > DELETED_UIDS_KEPT:
                self._deleted_uids.popitem(last=False)

    def _bound_unconfirmed(self, change: Change) -> bool:
        """The delete (or same-name replacement) of a pod whose bind answered 201 while its
        bound event has not arrived yet. On an API server that binds by name (v1.20 ignores a
        Binding's UID) that 201 may have bound a same-name successor instead: its cards are
        then held by the successor, whose bound event may still be in the watch."""
        old, new = change.old, change.new
        if old is None or old.uid in self._binding or old.uid in self._deferred:
            return False
        if new is not None and new.uid == old.uid:
            return False
        return self.cache.is_assumed(old)

    def _defer_if_binding(self, change: Change) -> Change:
        """A pod whose bind is in flight, or whose 201 is not confirmed by its bound event,
        leaves the device ledger only once we know where the bind landed: an API server that
        binds by name may have put the old incarnation's allocation on a same-name successor,
        so its cards must not be handed out before that is known."""
        old, new = change.old, change.new
        if change.kind != "Pod" or old is None or (new is not None and new.uid == old.uid):
            return change
        if old.uid in self._binding:
            self._deleted_while_binding.add(old.uid)
        elif old.uid not in self._deferred:
            return change
        self._deferred[old.uid] = Change("Pod", old, None)
        return Change("Pod", None, new) if new is not None else _NOTHING

    def _read_back_before_release(self, old: Pod) -> None:
        """Find out on the worker pool what holds ``old``'s name now; its cards leave the
        ledger (``_release_deferred``) only after a bound successor's allocation reached it."""
        self._deferred[old.uid] = Change("Pod", old, None)

        def read_back() -> None:
            resolution = self._where_it_landed(old)

            def settle() -> None:
                self._in_flight -= 1
                self._release_deferred(old.uid, resolution)

            self._inbox.put(_Call(settle, Future()))

        try:
            self._binder.submit(read_back)
        except RuntimeError:  # the pool is shut down (closing): keep holding the cards
            log.info("closing: the cards of a deleted pod stay held", pod=old.key)
            return
        self._in_flight += 1  # counted as a bind is: run_until_idle waits for it

    def _apply_pod(self, old: Pod | None, new: Pod | None) -> None:
        if old is not None and new is not None and old.uid != new.uid:
            # Deleted and re-created under the same name, seen as one update (a relist):
            # two pods — the old one leaves (cache or queue), the new one arrives.
            self._apply_pod(old, None)
            self._apply_pod(None, new)
            return
        was_assigned = old is not None and old.assigned
        if new is None or new.assigned or new.terminal:
            if old is not None:
                self.nominator.remove(old.uid)  # bound (anywhere) or gone: the room is free
        elif self._responsible(new):
            self.nominator.update(old, new)
        if new is not None and new.assigned:
            if was_assigned:
                assert old is not None
                self.cache.update_pod(old, new)
                self.queue.assigned_pod_updated(old, new)
            else:
                if old is not None:
                    self.queue.delete(old)
                self.failures.pop(new.key, None)
                self.cache.add_pod(new)
                self.queue.assigned_pod_added(new)
            return
        if was_assigned:
            assert old is not None
            self.cache.remove_pod(old)
            self.queue.assigned_pod_deleted(old)
            return
        if new is None and old is not None and self.cache.is_assumed(old):
            # Deleted while assumed — its bind may even have landed unseen (a relist folds
            # "bound" and "deleted" into one delete of the unassigned record we knew): it
            # leaves the cache, as its reservation leaves the device ledger.
            self.cache.remove_pod(old)
            self.queue.assigned_pod_deleted(old)
        # Unassigned pods: the queue's business, when one of our profiles owns them.
        if new is None or new.terminal or new.terminating or not self._responsible(new):
            if old is not None:
                self.queue.delete(old)
                self.failures.pop(old.key, None)
            return
        if old is None:
            self.queue.add(new)
        elif _spec_changed(old, new):
            self.queue.update(old, new)

    # -- the loop ---------------------------------------------------------------------------------

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

    # -- scheduling cycle -------------------------------------------------------------------------

    def _schedule(self, fwk: Framework, qpi: QueuedPodInfo) -> None:
        pod = qpi.pod
        start = time.perf_counter()  # attempt duration: algorithm + binding, as kube counts
        state = CycleState()
        state.record_metrics = self.rng.randrange(100) < PLUGIN_METRICS_SAMPLE_PERCENT
        cycle = self.queue.scheduling_cycle
        try:
            node_name = self._select_node(fwk, state, pod)
        except FitError as err:
            self._fail(
                fwk,
                qpi,
                err.message,
                err.diagnosis.unschedulable_plugins,
                cycle,
                nominated=err.diagnosis.nominated_node,
            )
            self.observer.attempt("unschedulable", fwk.name, time.perf_counter() - start)
            if self._log_decisions:
                log.info(
                    "unschedulable",
                    pod=pod.key,
                    cycle=cycle,
                    attempts=qpi.attempts,
                    reason=err.message,
                )
            return
        except _CycleError as err:
            self._fail(fwk, qpi, err.status.message, set(), cycle, error=True)
            self.observer.attempt("error", fwk.name, time.perf_counter() - start)
            if self._log_decisions:
                log.warning("scheduling error", pod=pod.key, cycle=cycle, error=err.status.message)
            return

        if self._log_decisions:
            log.info("scheduled", pod=pod.key, node=node_name, cycle=cycle, attempts=qpi.attempts)
        status = self._reserve_and_bind(fwk, state, qpi, node_name, start)
        if status is not None:
            self._fail_status(fwk, qpi, status, cycle)
            self.observer.attempt(_result_of(status), fwk.name, time.perf_counter() - start)

    def _reserve_and_bind(
        self,
        fwk: Framework,
        state: CycleState,
        qpi: QueuedPodInfo,
        node_name: str,
        start: float,
        placed: Future[Placement] | None = None,
    ) -> Status | None:
        """Assume → Reserve → Permit, then hand the pod to the binding cycle; the Reserve or
        Permit status when the pod did not get that far (everything undone)."""
        assumed = dataclasses.replace(qpi.pod, node_name=node_name)
        self.cache.assume_pod(assumed)
        self.nominator.remove(assumed.uid)
        status = fwk.run_reserve(state, assumed, node_name)
        if status is not None:
            fwk.run_unreserve(state, assumed, node_name)
            self.cache.forget_pod(assumed)
            return status
        status, waits = fwk.run_permit(state, assumed, node_name)
        if status is not None and status.code != Code.WAIT:
            fwk.run_unreserve(state, assumed, node_name)
            self.cache.forget_pod(assumed)
            return status
        waiting = None
        if waits:
            waiting = WaitingPod(assumed, waits)
            self.waiting_pods.add(waiting)
        else:
            self._binds_queued += 1  # pods waiting on Permit do not count against the bound
        self._in_flight += 1
        self._binding.add(assumed.uid)
        future = self._binder.submit(
            self._binding_cycle, fwk, state, qpi, assumed, waiting, start, placed
        )
        with self._bind_lock:
            self._bind_futures.add(future)
        future.add_done_callback(self._bind_done)
        return None

    def place(self, profile: str, pod: Pod, node_name: str) -> Future[Placement]:
        """Bind ``pod`` to ``node_name``, a node chosen elsewhere (the extender's bind verb),
        through this scheduler's own cycle: PreFilter and Filter on that node against the
        caches and the reservations of every bind in flight, then assume, Reserve, Permit and
        the binding cycle with its fencing and outcome resolution. Callable from any thread;
        the future has the outcome once the bind's outcome is known. A pod already assumed or
        bound here, or a node that no longer fits, is answered without a write."""
        placed: Future[Placement] = Future()

        def attempt() -> None:
            fwk = self.profiles.get(profile)
            if fwk is None:
                placed.set_result(Placement("failed", f"no profile {profile!r}"))
                return
            if self._closing.is_set():
                placed.set_result(Placement("fenced", "scheduler stopping"))
                return
            if self.cache.get_pod(pod) is not None or pod.uid in self._binding:
                placed.set_result(Placement("failed", f"pod {pod.key} is already being bound"))
                return
            if pod.uid in self._deleted_uids:
                # Read before a delete we have applied: no delete will come again to release
                # what we would reserve, and a v1.20 bind would land on a same-name successor.
                placed.set_result(Placement("gone", f"pod {pod.key} (uid {pod.uid}) was deleted"))
                return
            start = time.perf_counter()
            state = CycleState()
            status = self._fit_on(fwk, state, pod, node_name)
            if status is None:
                qpi = QueuedPodInfo(pod, self.clock.now(), attempts=1)
                status = self._reserve_and_bind(fwk, state, qpi, node_name, start, placed)
            if status is not None:
                resolution = "failed" if status.code == Code.ERROR else "unschedulable"
                placed.set_result(Placement(resolution, status.message))

        self.call_soon(attempt)
        return placed

    def _fit_on(self, fwk: Framework, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        """PreFilter and Filter for one named node (scheduling thread)."""
        info = self.cache.snapshot.get(node_name)
        if info is None:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (f"node {node_name} not found",))
        status = fwk.run_pre_filter(state, pod)
        if status is None:
            status = fwk.run_filter(state, pod, info)
        return None if status is None or status.is_success else status

    def _bind_done(self, future: Future[None]) -> None:
        with self._bind_lock:
            self._bind_futures.discard(future)

    def _select_node(self, fwk: Framework, state: CycleState, pod: Pod) -> str:
        snapshot = self.cache.snapshot
        num_nodes = snapshot.num_nodes
        if num_nodes == 0:
            raise FitError(pod, 0, Diagnosis())
        status = fwk.run_pre_filter(state, pod)
        if status is not None:
            if status.code == Code.ERROR:
                raise _CycleError(status)
            slots = snapshot.live_slots()
            every_node = NodeStatuses(
                snapshot, {}, [(slots, np.zeros(len(slots), np.int64), [status])]
            )  # as kube-scheduler: every node has the PreFilter's status
            diagnosis = Diagnosis(
                node_to_status=every_node,
                pre_filter_msg=status.message,
                unschedulable_plugins={status.plugin},
            )
            self._post_filter(fwk, state, pod, diagnosis)
            raise FitError(pod, num_nodes, diagnosis)

        percentage = fwk.profile.percentage_of_nodes_to_score
        if percentage is None:
            percentage = self.config.percentage_of_nodes_to_score
        to_find = num_feasible_nodes_to_find(percentage, num_nodes)
        outcome = fwk.find_feasible(state, pod, snapshot, to_find, self._next_start_index)
        self._next_start_index = (self._next_start_index + outcome.processed) % num_nodes
        feasible = outcome.feasible
        if len(feasible) == 0:
            node_to_status = outcome.diagnose()
            error = node_to_status.first_error()
            if error is not None:
                raise _CycleError(error)
            diagnosis = Diagnosis(
                node_to_status=node_to_status, unschedulable_plugins=node_to_status.plugins()
            )
            self._post_filter(fwk, state, pod, diagnosis)
            raise FitError(pod, num_nodes, diagnosis)
        if len(feasible) == 1:
            return snapshot.info(int(feasible[0])).name

        status = fwk.run_pre_score(state, pod, SlotNodes(snapshot, feasible))
        if status is not None:
            raise _CycleError(status)
        if not fwk.has_score_plugins(state):
            return snapshot.info(int(feasible[0])).name
        totals = fwk.run_score(state, pod, snapshot, feasible)
        if isinstance(totals, Status):
            raise _CycleError(totals)
        best = np.flatnonzero(totals == totals.max())
        pick = int(best[0]) if len(best) == 1 else int(best[self.rng.randrange(len(best))])
        return snapshot.info(int(feasible[pick])).name

    def _post_filter(
        self, fwk: Framework, state: CycleState, pod: Pod, diagnosis: Diagnosis
    ) -> None:
        if not fwk.plugins_at("post_filter"):
            return
        result, status = fwk.run_post_filter(state, pod, diagnosis.node_to_status)
        if status is not None and status.code == Code.ERROR:
            raise _CycleError(status)
        if status is not None and status.message:
            diagnosis.post_filter_msg = status.message
        victims = None
        if result is not None:
            diagnosis.nominated_node = result.nominated_node
            self.nominator.add(pod, result.nominated_node)
            if result.nominated_node:
                victims = len(result.victims)
                self.preemptions.append(Preemption(pod, result.nominated_node, result.victims))
                if self._log_decisions:
                    log.info(
                        "preempted",
                        pod=pod.key,
                        node=result.nominated_node,
                        victims=[v.key for v in result.victims],
                    )
        self.observer.preemption(victims)

    # -- binding cycle (worker thread) ------------------------------------------------------------

    def _binding_cycle(
        self,
        fwk: Framework,
        state: CycleState,
        qpi: QueuedPodInfo,
        assumed: Pod,
        waiting: WaitingPod | None,
        started: float,
        placed: Future[Placement] | None = None,
    ) -> None:
        node = assumed.node_name
        status: Status | None = None
        try:
            if waiting is not None:
                status = waiting.wait()  # it stays registered until its outcome is applied
                if waiting.timed_out_plugin:
                    state.write(PERMIT_TIMED_OUT_KEY, waiting.timed_out_plugin)
            if status is None and self._closing.is_set():
                fenced = BindError("scheduler stopping: bind not sent", fenced=True)
                status = Status(Code.ERROR, (str(fenced),), fenced)
            if status is None:
                status = fwk.run_pre_bind(state, assumed, node)
            if status is None:
                status = fwk.run_bind(state, assumed, node)
            if status is None:
                fwk.run_post_bind(state, assumed, node)
        except Exception as exc:  # never lose a pod to a bug in the binding cycle
            status = Status(Code.ERROR, (str(exc),), exc)
        resolution = self._resolve(assumed, status)
        landed = resolution == "bound" and status is not None  # read back: bound, this UID
        self._inbox.put(
            _BindOutcome(
                fwk, state, qpi, assumed, status, started, resolution, waiting is None, placed,
                landed,
            )
        )

    def _resolve(self, assumed: Pod, status: Status | None) -> str:
        """What the binding cycle did, in the cluster's terms (worker thread).

        "bound" (the pod is bound to our node), "failed" (certainly not bound: retry),
        "gone" (deleted, re-created or bound elsewhere: nothing to retry), "fenced" (not sent:
        leadership lost or stopping), "rejected" (a Permit verdict), or "unknown" (uncertain
        and the pod could not be read before the scheduler stopped: keep everything)."""
        if status is None:
            return "bound"  # 201; on whom (v1.20 binds by name) only matters if it is deleted
        err = status.error
        if not isinstance(err, BindError):
            return "rejected" if status.is_rejected else "failed"
        if err.gone:
            return "gone"
        if err.fenced:
            return "fenced"
        if not err.uncertain:
            return "failed"
        pause = RESOLVE_BACKOFF[0]
        while True:
            try:
                current = self.cluster.lookup_pod(assumed)
            except Exception as exc:  # the API is unreachable: the answer is still unknown
                log.info(
                    "bind outcome unknown, reading the pod again", pod=assumed.key, error=str(exc)
                )
                if self._closing.wait(pause):
                    return "unknown"
                pause = min(RESOLVE_BACKOFF[1], pause * 2)
                continue
            if current is not None and current.node_name:
                # Bound: by our bind, by a stale bind of ours that landed on a same-name
                # successor (v1.20 binds by name), or by someone else's. Whichever, the cards
                # its annotation names are taken now: the ledger learns them before our
                # reservation goes, as the watch may bring the pod much later.
                self._read_back[assumed.uid] = current
                same = current.uid == assumed.uid and current.node_name == assumed.node_name
                return "bound" if same else "gone"
            if current is None or current.uid != assumed.uid:
                return "gone"
            return "failed"

    def _where_it_landed(self, assumed: Pod) -> str:
        """A 201 for a pod since deleted (worker thread): "successor" when the pod of that name
        now is another incarnation, bound (maybe by that very bind: its allocation is then
        ours; the ledger learns it before the old reservation goes), else "bound"; "unknown"
        when the API could not be read before the scheduler stopped."""
        pause = RESOLVE_BACKOFF[0]
        while True:
            try:
                current = self.cluster.lookup_pod(assumed)
            except Exception as exc:
                log.info("reading a re-created pod's bind target", pod=assumed.key, error=str(exc))
                if self._closing.wait(pause):
                    return "unknown"
                pause = min(RESOLVE_BACKOFF[1], pause * 2)
                continue
            if current is not None and current.uid != assumed.uid and current.node_name:
                self._read_back[assumed.uid] = current
                return "successor"
            return "bound"

    def _finish_binding(self, outcome: _BindOutcome) -> None:
        uid = outcome.assumed.uid
        self._binding.discard(uid)
        self.waiting_pods.remove(uid)
        self._hand_read_back_to_ledger(uid)
        self._finish_binding_outcome(outcome)
        self._deleted_while_binding.discard(uid)
        if uid in self._deferred and outcome.resolution == "bound" and not outcome.landed:
            # A 201 for a pod deleted meanwhile (before or after the worker saw the answer):
            # it may have bound a same-name successor. Read the name before releasing.
            del self._deferred[uid]
            self._read_back_before_release(outcome.assumed)
            return
        # A failed bind moved the waiting pods already, when it released its reservation.
        self._release_deferred(uid, outcome.resolution, move=outcome.resolution == "bound")

    def _hand_read_back_to_ledger(self, uid: str) -> None:
        read_back = self._read_back.pop(uid, None)
        if read_back is not None:
            change = Change("Pod", None, read_back)
            for handler in self._event_handlers:
                handler(change)  # what the cluster shows bound under that name holds its cards

    def _release_deferred(self, uid: str, resolution: str, move: bool = True) -> None:
        """Apply a delete held back from the plugins (``_defer_if_binding``) once we know
        where the bind landed; "unknown" (stopping, the API unreadable) keeps it held."""
        self._hand_read_back_to_ledger(uid)
        deferred = self._deferred.pop(uid, None)
        if deferred is None or resolution == "unknown":
            return
        for handler in self._event_handlers:
            handler(deferred)
        if move:
            # The delete moved the waiting pods when it arrived, while the ledger still held
            # the cards; they are free only now.
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)

    def _finish_binding_outcome(self, outcome: _BindOutcome) -> None:
        self._in_flight -= 1
        fwk, assumed, status = outcome.framework, outcome.assumed, outcome.status
        qpi = outcome.qpi
        resolution = outcome.resolution or ("bound" if status is None else "failed")
        seconds = time.perf_counter() - outcome.started if outcome.started else 0.0
        if outcome.counted:
            self._binds_queued -= 1
        if outcome.placed is not None:
            self._finish_placement(outcome, resolution)
            return
        if resolution == "bound":
            self.cache.finish_binding(assumed)
            self.failures.pop(assumed.key, None)
            if assumed.nominated_node_name and assumed.nominated_node_name != assumed.node_name:
                # Bound elsewhere than a preemption made room: the nomination is void.
                self._io(fwk.handle.client.set_nominated_node, assumed, "")
            self.observer.attempt("scheduled", fwk.name, seconds)
            first = qpi.initial_attempt_timestamp or qpi.timestamp
            self.observer.scheduled(qpi.attempts, self.clock.now() - first)
            self._io(
                fwk.handle.client.record_event,
                assumed,
                "Normal",
                "Scheduled",
                f"Successfully assigned {assumed.key} to {assumed.node_name}",
            )
            return
        assert status is not None
        if resolution == "unknown":
            # The bind may have landed and the cluster cannot say: keep the pod assumed and
            # its reservation held (never over-commit); the informer settles it.
            log.warning("bind outcome unknown at stop", pod=assumed.key, node=assumed.node_name)
            return
        uid_deleted = assumed.uid in self._deleted_while_binding
        fwk.run_unreserve(outcome.state, assumed, assumed.node_name)
        self.cache.forget_pod(assumed)
        if resolution != "rejected" or uid_deleted:
            # Forgetting an assumed pod frees what it held, like an assigned pod's delete: the
            # pods it turned away are retried now, not at the unschedulable pool's flush (the
            # pod itself is requeued below, after the move, so it does not move with them).
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)
        self.observer.attempt(
            "unschedulable" if resolution == "rejected" else "error", fwk.name, seconds
        )
        if self._log_decisions:
            log.warning(
                "binding failed",
                pod=assumed.key,
                node=assumed.node_name,
                outcome=resolution,
                error=status.message,
            )
        if resolution == "gone" or uid_deleted:
            return  # deleted, re-created or bound elsewhere: nothing to retry for this UID
        if resolution == "fenced":
            self.queue.requeue_with_backoff(qpi)  # whoever leads next schedules it
            return
        if resolution == "rejected":
            # A Permit plugin rejected the waiting pod (or its wait timed out): a verdict, so
            # the pod waits for an event that plugin registered, like any unschedulable pod.
            self._fail_status(fwk, qpi, status, self.queue.scheduling_cycle)
            # After the verdict, as kube-scheduler defers it: the others it turned away move,
            # the rejected pod stays in the pool for its own plugin's event.
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE, except_key=qpi.key)
            return
        message = f"Binding rejected: {status.message}"
        self.failures[assumed.key] = message
        self.queue.requeue_with_backoff(qpi)
        self._report_failure(fwk, qpi.pod, message, error=True)

    def _finish_placement(self, outcome: _BindOutcome, resolution: str) -> None:
        """The end of a ``place``: the caller (kube-scheduler, through the extender) owns the
        pod's retries and its events, so nothing is requeued or reported here."""
        assert outcome.placed is not None
        assumed = outcome.assumed
        if resolution == "bound":
            self.cache.finish_binding(assumed)
        elif resolution != "unknown":  # unknown: keep the reservation, the informer settles it
            outcome.framework.run_unreserve(outcome.state, assumed, assumed.node_name)
            self.cache.forget_pod(assumed)
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)
        message = "" if outcome.status is None else outcome.status.message
        outcome.placed.set_result(Placement(resolution, message))

    # -- failures ---------------------------------------------------------------------------------

    def _fail_status(self, fwk: Framework, qpi: QueuedPodInfo, status: Status, cycle: int) -> None:
        plugins = {status.plugin} if status.is_rejected and status.plugin else set()
        self._fail(fwk, qpi, status.message, plugins, cycle, error=status.code == Code.ERROR)

    def _fail(
        self,
        fwk: Framework,
        qpi: QueuedPodInfo,
        message: str,
        plugins: set[str],
        cycle: int,
        error: bool = False,
        nominated: str | None = None,
    ) -> None:
        qpi.unschedulable_plugins = set(plugins)
        qpi.last_failure = message
        self.failures[qpi.key] = message
        self.queue.add_unschedulable_if_not_present(qpi, cycle)
        self._report_failure(fwk, qpi.pod, message, error, nominated)

    def _report_failure(
        self, fwk: Framework, pod: Pod, message: str, error: bool, nominated: str | None = None
    ) -> None:
        client = fwk.handle.client
        reason = "SchedulerError" if error else "Unschedulable"
        if nominated is not None and nominated == pod.nominated_node_name:
            nominated = None  # the status already says so

        def report() -> None:
            if nominated is not None:
                client.set_nominated_node(pod, nominated)
            client.record_event(pod, "Warning", "FailedScheduling", message)
            client.set_pod_scheduled_condition(pod, "False", reason, message)

        self._io(report)

    def _io(self, fn: Callable[..., None], *args: Any) -> None:
        """Cluster writes that are not binds run on the worker pool, never on the hot path."""

        def call() -> None:
            try:
                fn(*args)
            except Exception as exc:  # reporting must never break scheduling
                log.warning("cluster write failed", action=fn.__name__, error=str(exc))

        try:
            future = self._binder.submit(call)
        except RuntimeError:  # the pool is shut down: a bind answered after close() began
            log.info("closing: cluster write dropped", action=fn.__name__)
            return
        with self._io_lock:
            self._pending_io.add(future)
        future.add_done_callback(self._io_done)

    def _io_done(self, future: Future[None]) -> None:
        with self._io_lock:
            self._pending_io.discard(future)

    def wait_for_writes(self, timeout: float | None = None) -> None:
        """Block until every event/condition write submitted so far has finished."""
        with self._io_lock:
            pending = list(self._pending_io)
        futures_wait(pending, timeout=timeout)


class _CycleError(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status


def _result_of(status: Status) -> str:
    return "error" if status.code == Code.ERROR else "unschedulable"


def _spec_changed(old: Pod, new: Pod) -> bool:
    """Status-only updates (our own condition writes) must not requeue the pod."""
    def spec(pod: Pod) -> Pod:
        return dataclasses.replace(
            pod, resource_version="", phase="", nominated_node_name="", start_time=""
        )

    return spec(old) != spec(new)
