"""Events for pods (``Scheduled``, ``FailedScheduling``), aggregated and rate-limited.

Role: client-go's event broadcaster + correlator, sized for a scheduler. ``record()`` never
blocks and never does I/O: it folds the event into an ``EventAggregator`` entry keyed by
(pod, type, reason, message). A writer thread drains the aggregator: the first occurrence of a
key is a ``POST`` of an Event; later occurrences within the window are a ``PATCH`` of its
count on that Event.

The API is the one kube-scheduler writes, found by discovery before the first write:
``events.k8s.io/v1`` where served (GA since 1.19: every supported server), written as
client-go's events library does (``eventTime``, ``reportingController``/``reportingInstance``,
``action``, ``regarding``, ``note``; repeats as ``series.count``/``lastObservedTime``); else
core/v1 (``involvedObject``, ``count``, ``lastTimestamp``, ``source``). Both read back the same
through either API (``kubectl get events``, ``kubectl describe pod``).

Every write takes a token from one global bucket (``--event-qps``/``--event-burst``), so a
thousand pending pods failing every ten seconds cost at most that many writes per second;
occurrences waiting for a token fold into one write.

Invariants (``EventAggregator``, pure, clock injected):

- An entry is written in the order it became dirty (FIFO over keys), so one noisy pod cannot
  starve the others; a key re-dirtied while queued keeps its place.
- ``count`` on the API object never goes down and equals the occurrences folded in so far.
- A clean entry not seen for ``window`` seconds is forgotten: a later occurrence makes a new
  Event, as client-go does after its aggregation window. At most ``max_entries`` entries are
  kept; beyond that the oldest entry already written is forgotten, and only when every entry
  still waits to be written (a backlog the write rate cannot drain) are new keys dropped and
  counted in ``dropped``.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog

from apis.core import Pod
from scheduler.kube.ratelimit import TokenBucket
from scheduler.kube.rest import MERGE_PATCH, ApiError, KubeError, RestClient, path_segment

__all__ = ["EventAggregator", "EventEntry", "EventKey", "EventRecorder", "rfc3339"]

log = structlog.get_logger("koord-scheduler.events")

MAX_MESSAGE = 1024
EVENTS_V1 = "events.k8s.io/v1"
CORE_V1 = "v1"
# The events library's limits (core validation: ReportingInstanceLengthLimit, ActionLengthLimit).
MAX_REPORTING_INSTANCE = 128
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
# kube-scheduler's actions (pkg/scheduler: "Binding" for Scheduled, "Scheduling" for
# FailedScheduling, "Preempting" for Preempted), by reason; anything else is "Scheduling".
_ACTIONS = {"Scheduled": "Binding", "Preempted": "Preempting"}


def rfc3339(moment: datetime) -> str:
    """Kubernetes' ``metav1.Time`` text: seconds precision, UTC, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(moment: datetime) -> str:
    """Kubernetes' ``metav1.MicroTime`` text: microseconds, UTC, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def reporting_controller(component: str) -> str:
    """``component`` (the pod's scheduler name) when it is a qualified name, as
    events.k8s.io/v1 requires of ``reportingController``; else ``koord-scheduler``."""
    return component if _QUALIFIED_NAME.match(component) else "koord-scheduler"


@dataclass(frozen=True, slots=True)
class EventKey:
    namespace: str
    name: str
    uid: str
    type: str
    reason: str
    message: str
    component: str = "koord-scheduler"


@dataclass(slots=True)
class EventEntry:
    key: EventKey
    first_seen: datetime
    last_seen: datetime
    seen_at: float
    count: int = 1
    written_count: int = 0
    event_name: str = ""

    @property
    def dirty(self) -> bool:
        return self.count > self.written_count


class EventAggregator:
    """Folds occurrences into entries and orders the writes (see the module docstring)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        window: float = 600.0,
        max_entries: int = 10_000,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self.window = window
        self.max_entries = max_entries
        self._entries: dict[EventKey, EventEntry] = {}
        self._dirty: collections.OrderedDict[EventKey, None] = collections.OrderedDict()
        self.dropped = 0
        self.occurrences = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def pending(self) -> int:
        return len(self._dirty)

    def add(self, key: EventKey) -> None:
        now, wall = self._clock(), self._wall()
        self.occurrences += 1
        entry = self._entries.get(key)
        if entry is not None and not entry.dirty and now - entry.seen_at > self.window:
            del self._entries[key]
            entry = None
        if entry is None:
            if len(self._entries) >= self.max_entries:
                self.expire()
            if len(self._entries) >= self.max_entries and not self._evict_one_clean():
                self.dropped += 1  # every entry still waits to be written: a bounded backlog
                return
            entry = EventEntry(key, first_seen=wall, last_seen=wall, seen_at=now, count=1)
            self._entries[key] = entry
        else:
            entry.count += 1
            entry.last_seen = wall
            entry.seen_at = now
        if key not in self._dirty:
            self._dirty[key] = None

    def next_dirty(self) -> EventEntry | None:
        """The entry to write next (oldest dirty), taken off the dirty list."""
        while self._dirty:
            key, _ = self._dirty.popitem(last=False)
            entry = self._entries.get(key)
            if entry is not None and entry.dirty:
                return entry
        return None

    def written(self, entry: EventEntry, count: int, event_name: str) -> None:
        """``count`` occurrences of ``entry`` are now on the Event ``event_name`` (occurrences
        added meanwhile have queued the entry again)."""
        entry.written_count = max(entry.written_count, count)
        entry.event_name = event_name

    def failed(self, entry: EventEntry) -> None:
        """A write failed for good: forget what was not written (no retry storm)."""
        entry.written_count = entry.count

    def _evict_one_clean(self) -> bool:
        """Forget the oldest entry already written (a later occurrence of it starts a new
        Event instead of patching the count); False when every entry is still dirty."""
        for k, e in self._entries.items():
            if not e.dirty:
                del self._entries[k]
                return True
        return False

    def expire(self) -> int:
        """Forget clean entries idle longer than the window; returns how many."""
        now = self._clock()
        stale = [
            k for k, e in self._entries.items() if not e.dirty and now - e.seen_at > self.window
        ]
        for key in stale:
            del self._entries[key]
        return len(stale)


class EventRecorder:
    """Writes the aggregator's entries as Events from one background thread (``api``: the
    Events API to write, ``EVENTS_V1`` or ``CORE_V1``; None: discovered before the first
    write)."""

    def __init__(
        self,
        rest: RestClient,
        *,
        qps: float = 50.0,
        burst: int = 100,
        host: str = "",
        aggregator: EventAggregator | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        api: str | None = None,
    ) -> None:
        if api not in (None, EVENTS_V1, CORE_V1):
            raise ValueError(f"api must be {EVENTS_V1!r} or {CORE_V1!r}, got {api!r}")
        self._api = api
        self._rest = rest
        self._bucket = TokenBucket(qps, burst)
        self._host = host
        self._agg = aggregator if aggregator is not None else EventAggregator(wall=wall)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy = False
        self.writes = 0
        self.errors = 0

    @property
    def aggregator(self) -> EventAggregator:
        return self._agg

    @property
    def api(self) -> str | None:
        """The Events API written to (None until discovered)."""
        return self._api

    def _discover(self) -> str:
        """``events.k8s.io/v1`` when the server serves it, else core/v1 (a 404 on the group
        version's discovery document); any other failure raises and is retried next write."""
        if self._api is None:
            try:
                self._rest.request("GET", f"/apis/{EVENTS_V1}")
                self._api = EVENTS_V1
            except ApiError as exc:
                if exc.status != 404:
                    raise
                self._api = CORE_V1
            log.info("events API", api=self._api)
        return self._api

    def record(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        """Queue one occurrence (thread-safe, no I/O)."""
        key = EventKey(
            pod.namespace,
            pod.name,
            pod.uid,
            event_type,
            reason,
            message[:MAX_MESSAGE],
            pod.scheduler_name,
        )
        with self._cond:
            self._agg.add(key)
            self._cond.notify()

    # -- the writer thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until nothing is waiting to be written (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if self._agg.pending == 0 and not self._busy:
                    return True
            time.sleep(0.02)
        return False

    def _run(self) -> None:
        last_expire = time.monotonic()
        while not self._stop.is_set():
            with self._cond:
                entry = self._agg.next_dirty()
                if entry is None:
                    self._cond.wait(1.0)
                    if time.monotonic() - last_expire > 60:
                        self._agg.expire()
                        last_expire = time.monotonic()
                    continue
                self._busy = True
            try:
                wait = self._bucket.reserve()
                if wait > 0 and self._stop.wait(wait):
                    return
                with self._cond:  # what folded in while waiting for the token rides along
                    count, first, last = entry.count, entry.first_seen, entry.last_seen
                    name = entry.event_name
                name = self._write(entry, count, first, last, name)
                with self._cond:
                    self._agg.written(entry, count, name)
                self.writes += 1
            except KubeError as exc:
                self.errors += 1
                log.warning(
                    "event write failed",
                    pod=f"{entry.key.namespace}/{entry.key.name}",
                    reason=entry.key.reason,
                    error=str(exc),
                )
                with self._cond:
                    self._agg.failed(entry)
            finally:
                with self._cond:
                    self._busy = False

    def _write(
        self, entry: EventEntry, count: int, first: datetime, last: datetime, name: str
    ) -> str:
        if self._discover() == EVENTS_V1:
            return self._write_v1(entry, count, first, last, name)
        key = entry.key
        base = f"/api/v1/namespaces/{path_segment(key.namespace)}/events"
        if name:
            patch = {"count": count, "lastTimestamp": rfc3339(last), "message": key.message}
            try:
                self._rest.request(
                    "PATCH", f"{base}/{path_segment(name)}", body=patch, content_type=MERGE_PATCH
                )
                return name
            except ApiError as exc:
                if exc.status != 404:
                    raise
        name = f"{key.name}.{time.time_ns():x}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": key.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": key.namespace,
                "name": key.name,
                "uid": key.uid,
            },
            "reason": key.reason,
            "message": key.message,
            "type": key.type,
            "count": count,
            "firstTimestamp": rfc3339(first),
            "lastTimestamp": rfc3339(last),
            "source": {"component": key.component, **({"host": self._host} if self._host else {})},
        }
        self._rest.request("POST", base, body=event)
        return name

    def _write_v1(
        self, entry: EventEntry, count: int, first: datetime, last: datetime, name: str
    ) -> str:
        """An ``events.k8s.io/v1`` Event: a repeat patches its series (count >= 2)."""
        key = entry.key
        base = f"/apis/{EVENTS_V1}/namespaces/{path_segment(key.namespace)}/events"
        series = {"count": count, "lastObservedTime": micro_time(last)}
        if name:
            try:
                self._rest.request(
                    "PATCH",
                    f"{base}/{path_segment(name)}",
                    body={"series": series},
                    content_type=MERGE_PATCH,
                )
                return name
            except ApiError as exc:
                if exc.status != 404:
                    raise
        name = f"{key.name}.{time.time_ns():x}"
        controller = reporting_controller(key.component)
        instance = f"{controller}-{self._host}" if self._host else controller
        event: dict[str, object] = {
            "apiVersion": EVENTS_V1,
            "kind": "Event",
            "metadata": {"name": name, "namespace": key.namespace},
            "eventTime": micro_time(first),
            "reportingController": controller,
            "reportingInstance": instance[:MAX_REPORTING_INSTANCE],
            "action": _ACTIONS.get(key.reason, "Scheduling"),
            "reason": key.reason,
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": key.namespace,
                "name": key.name,
                "uid": key.uid,
            },
            "note": key.message,
            "type": key.type,
        }
        if count > 1:
            event["series"] = series
        self._rest.request("POST", base, body=event)
        return name
