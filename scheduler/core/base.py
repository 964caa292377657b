"""The state the scheduler core's rooms share, the inbox's messages, and the two ways out
of the scheduling thread: cluster writes on the worker pool (``_io``) and failure reports.

``SchedulerBase`` only *declares* the shared state (``Scheduler.__init__`` builds it) so each
room (``events``, ``scheduling_cycle``, ``binding_cycle``, ``outcomes``) reads as a mixin over
one documented set of fields. Who may touch which field is the ownership rule stated once in
``scheduler.core.binding_cycle``'s docstring.
"""

from __future__ import annotations

import queue as stdqueue
import random
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from apis.core import Pod
from scheduler.backend.cache import Cache
from scheduler.backend.queue import SchedulingQueue
from scheduler.cluster import Cluster
from scheduler.config import SchedulerConfiguration
from scheduler.core.types import Placement, Preemption, QueueStats, SchedulerObserver
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import Change
from scheduler.framework.interfaces import Clock, QueuedPodInfo
from scheduler.framework.nominator import Nominator
from scheduler.framework.runtime import Framework
from scheduler.framework.status import Code, Status
from scheduler.framework.waiting import WaitingPods

log = structlog.get_logger("koord-scheduler")

T = TypeVar("T")
GANG_PLUGIN = "Coscheduling"
"""The plugin that schedules gangs, by name (the core never imports a plugin)."""


@dataclass(slots=True)
class Call:
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
class BindOutcome:
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
    nominated: bool = False
    """The binding cycle wrote ``status.nominatedNodeName`` (the pod waited at Permit): a
    failure clears it, as kube-scheduler's binding-cycle failure does."""


Inbox = stdqueue.SimpleQueue[Change | BindOutcome | Call]


class SchedulerBase:
    """The fields every room of the core reads; built by ``Scheduler.__init__``."""

    config: SchedulerConfiguration
    cluster: Cluster
    clock: Clock
    rng: random.Random
    observer: SchedulerObserver
    cache: Cache
    queue: SchedulingQueue
    profiles: dict[str, Framework]
    gang_profiles: set[str]
    waiting_pods: WaitingPods
    nominator: Nominator
    """Pods nominated to nodes by preemption, shared by every profile."""
    queue_stats: QueueStats | None
    preemptions: deque[Preemption]
    """The latest preemptions carried out (the simulator's report)."""
    failures: dict[str, str]
    """Pod key -> the last failure message, for pods still waiting (the simulator's report)."""

    _event_handlers: list[Callable[[Change], None]]
    _log_decisions: bool
    _inbox: Inbox
    _binder: Executor
    """Runs binding cycles and cluster writes; tests inject one that runs them on demand."""
    _in_flight: int
    """Binding cycles and read-backs submitted whose outcome is not applied yet."""
    _binds_queued: int
    _max_in_flight: int
    _closing: threading.Event
    _bind_lock: threading.Lock
    _bind_futures: set[Future[None]]
    _io_lock: threading.Lock
    _pending_io: set[Future[None]]
    _next_start_index: int
    _binding: set[str]
    """UIDs whose bind is in flight (scheduling thread)."""
    _deleted_while_binding: set[str]
    """Of those, the ones whose pod was deleted meanwhile (read by the bind workers)."""
    _deferred: dict[str, Change]
    """UID → a pod delete held back from the plugins until we know where its bind landed."""
    _read_back: dict[str, Pod]
    """UID → the pod of that name found bound when a bind's outcome was read back (bind
    workers write it before the outcome is queued): applied before the reservation goes."""
    _read_back_held: dict[str, Pod]
    """Pod key → a successor handed to the device ledger from a read-back, not (yet) from the
    watch: released when the next event of that name is another incarnation (scheduling
    thread), since the watch may never tell us of this one's delete."""
    _deleted_uids: OrderedDict[str, None]
    """UIDs of pods whose delete was applied (the latest ``DELETED_UIDS_KEPT``): a
    ``place`` for one of them comes from a read older than that delete."""

    def _responsible(self, pod: Pod) -> bool:
        return pod.scheduler_name in self.profiles

    def call_soon(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the scheduling thread, between cycles (so it sees the caches, the
        ledger and the plugins exactly as the next cycle will); the future has its result.
        For read-only questions from other threads (``/debug/explain``)."""
        future: Future[T] = Future()
        self._inbox.put(Call(fn, future))
        return future

    # -- failures ---------------------------------------------------------------------------------

    def _fail_status(
        self,
        fwk: Framework,
        qpi: QueuedPodInfo,
        status: Status,
        cycle: int,
        nominated: str | None = None,
    ) -> None:
        plugins = {status.plugin} if status.is_rejected and status.plugin else set()
        error = status.code == Code.ERROR
        self._fail(fwk, qpi, status.message, plugins, cycle, error=error, nominated=nominated)

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

        def report() -> None:
            if nominated is not None:
                client.set_nominated_node(pod, nominated)
            client.record_event(pod, "Warning", "FailedScheduling", message)
            client.set_pod_scheduled_condition(pod, "False", reason, message)

        self._io(report)

    # -- cluster writes ---------------------------------------------------------------------------

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
