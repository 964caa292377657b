"""The scheduling queue: activeQ, backoffQ and the unschedulable pool, as kube-scheduler has them.

A pending pod lives in exactly one of three places:

- **activeQ** — a heap ordered by the profile's QueueSort ``less`` (ties broken by the order in
  which pods entered activeQ, so equal pods come out first-in, first-out); ``pop()`` takes the
  next pod to schedule from here;
- **backoffQ** — a heap ordered by backoff expiry; a pod that failed waits here
  ``initial_backoff * 2**(attempts-1)`` seconds (capped at ``max_backoff``) counted from its
  last failure, then ``flush()`` moves it to activeQ;
- **the unschedulable pool** — pods some plugins rejected (``unschedulable_plugins`` or
  ``pending_plugins``, kube's "rejectors"); they leave it when a cluster event that one of
  those plugins registered (EnqueueExtensions) happens, when the pod itself is updated, or
  after ``unschedulable_timeout`` seconds. A moved pod goes to backoffQ while its backoff
  lasts, else to activeQ.

A pod with scheduling gates (``spec.schedulingGates``) waits in a fourth place, **gated**
(kube-scheduler's SchedulingGates PreEnqueue: such a pod never enters activeQ, so it is never
attempted, reported unschedulable or counted as a failure). Only the update that removes its
last gate moves it to activeQ; no cluster event and no timeout does.

A pod the scheduler has popped and is still working on (scheduling or binding) is in none of
them; the scheduler hands it back with ``add_unschedulable_if_not_present`` or
``requeue_with_backoff``, or drops it when it is bound. kube's *moveRequestCycle* rule covers
the gap: if a move request happened at or after the cycle in which a pod was popped, the event
may have helped the pod, so a failed pod goes to backoffQ instead of the pool.

Invariants:
- Single-threaded by design: the scheduler applies every cluster event and runs every
  scheduling cycle on one thread, so no method here locks or blocks; ``pop()`` returns None
  when activeQ is empty and the loop sleeps until ``next_wakeup()`` or the next event.
- A pod key is in at most one sub-queue; ``len()`` counts each queued pod once.
- The clock is monotonic; ``flush()`` moves a pod at exactly its expiry or timeout (``>=``), so
  a loop that sleeps until ``next_wakeup()`` and then flushes always makes progress.
- ``pop()`` clears ``unschedulable_plugins`` and ``pending_plugins``: the scheduler fills them
  again from the attempt's diagnosis; empty means the attempt ended in an error, not a verdict,
  and such a pod goes to backoffQ — so every pod in the pool has a rejector, and kube's "a pod
  without rejectors moves on any event" never arises. The pool indexes a pod by its rejectors
  as they were when it entered; changing them on a pooled pod has no effect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from apis.core import Node, Pod
from scheduler.framework.events import (
    ASSIGNED_POD_ADD,
    ASSIGNED_POD_DELETE,
    ASSIGNED_POD_UPDATE,
    NODE_ADD,
    NODE_DELETE,
    NODE_UPDATE,
    UNSCHEDULABLE_TIMEOUT,
    UNSCHEDULED_POD_ADD,
    Action,
    ClusterEvent,
    Resource,
)
from scheduler.framework.interfaces import Clock, QueuedPodInfo

ACTIVE = "active"
BACKOFF = "backoff"
UNSCHEDULABLE = "unschedulable"
GATED = "gated"

# Event labels of the incoming-pods metric that are not ClusterEvent names (kube's wording).
POD_ADD = "PodAdd"
POD_UPDATE = "PodUpdate"
SCHEDULE_ATTEMPT_FAILURE = "ScheduleAttemptFailure"
BACKOFF_COMPLETE = "BackoffComplete"

Less = Callable[[QueuedPodInfo, QueuedPodInfo], bool]
SortKey = Callable[[QueuedPodInfo], tuple[Any, ...]]
IncomingHook = Callable[[str, str], None]


def backoff_duration(attempts: int, initial: float, maximum: float) -> float:
    """kube's backoff: ``initial`` doubled per attempt after the first, capped at ``maximum``."""
    exponent = max(attempts - 1, 0)
    if exponent >= 62:
        return maximum
    return min(initial * (1 << exponent), maximum)


@dataclass(slots=True)
class _Entry:
    """A queued pod plus what its sub-queue orders or indexes it by."""

    qpi: QueuedPodInfo
    seq: int
    expiry: float = 0.0
    plugins: frozenset[str] = frozenset()
    key: tuple[Any, ...] = ()
    """The activeQ's sort key, when the QueueSort plugin gives one (``sort_key`` + seq)."""
    name: str = ""
    """The pod's key (``qpi.key``, which never changes for an entry), kept for the heap."""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.qpi.key


class _Heap:
    """A binary heap of entries keyed by pod key, with O(log n) remove and re-sort by key."""

    __slots__ = ("_items", "_less", "_pos")

    def __init__(self, less: Callable[[_Entry, _Entry], bool]) -> None:
        self._items: list[_Entry] = []
        self._pos: dict[str, int] = {}
        self._less = less

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._pos

    def __iter__(self) -> Iterator[_Entry]:
        return iter(self._items)

    def get(self, key: str) -> _Entry | None:
        i = self._pos.get(key)
        return None if i is None else self._items[i]

    def peek(self) -> _Entry | None:
        return self._items[0] if self._items else None

    def push(self, entry: _Entry) -> None:
        assert entry.name not in self._pos, entry.name
        self._items.append(entry)
        self._pos[entry.name] = len(self._items) - 1
        self._up(len(self._items) - 1)

    def pop(self) -> _Entry:
        return self._remove_at(0)

    def remove(self, key: str) -> _Entry | None:
        i = self._pos.get(key)
        return None if i is None else self._remove_at(i)

    def fix(self, key: str) -> None:
        """Restore the order after the entry under ``key`` changed what it sorts by."""
        i = self._pos[key]
        if not self._up(i):
            self._down(i)

    def _remove_at(self, i: int) -> _Entry:
        items = self._items
        entry = items[i]
        last = items.pop()
        del self._pos[entry.name]
        if i < len(items):
            items[i] = last
            self._pos[last.name] = i
            if not self._up(i):
                self._down(i)
        return entry

    def _swap(self, i: int, j: int) -> None:
        items = self._items
        items[i], items[j] = items[j], items[i]
        self._pos[items[i].name] = i
        self._pos[items[j].name] = j

    def _up(self, i: int) -> bool:
        moved = False
        items, less = self._items, self._less
        while i > 0:
            parent = (i - 1) // 2
            if not less(items[i], items[parent]):
                break
            self._swap(i, parent)
            i = parent
            moved = True
        return moved

    def _down(self, i: int) -> None:
        items, less = self._items, self._less
        n = len(items)
        while True:
            best = i
            for child in (2 * i + 1, 2 * i + 2):
                if child < n and less(items[child], items[best]):
                    best = child
            if best == i:
                return
            self._swap(i, best)
            i = best


class _Pool:
    """The unschedulable pool: pods by key in insertion order (= timestamp order, as every
    insert stamps ``now`` on a monotonic clock), indexed by the plugins that rejected them (as
    they were at insertion), so a move touches only the pods the event may help."""

    __slots__ = ("_by_plugin", "_entries", "_seq")

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._by_plugin: dict[str, set[str]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> QueuedPodInfo | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.qpi

    def pods(self) -> Iterator[QueuedPodInfo]:
        return (e.qpi for e in self._entries.values())

    def add(self, qpi: QueuedPodInfo) -> None:
        self._seq += 1
        plugins = _rejectors(qpi)
        self._entries[qpi.key] = _Entry(qpi, self._seq, plugins=plugins)
        for plugin in plugins:
            self._by_plugin.setdefault(plugin, set()).add(qpi.key)

    def remove(self, key: str) -> QueuedPodInfo | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        for plugin in entry.plugins:
            keys = self._by_plugin[plugin]
            keys.discard(key)
            if not keys:
                del self._by_plugin[plugin]
        return entry.qpi

    def rejected_by(self, plugins: frozenset[str] | None) -> list[QueuedPodInfo]:
        """Pods rejected by any of ``plugins`` (None: every pod), in pool order."""
        if plugins is None:
            return list(self.pods())
        keys: set[str] = set()
        for plugin in plugins:
            keys.update(self._by_plugin.get(plugin, ()))
        if len(keys) == len(self._entries):
            return list(self.pods())
        entries = sorted((self._entries[k] for k in keys), key=lambda e: e.seq)
        return [e.qpi for e in entries]


def _rejectors(qpi: QueuedPodInfo) -> frozenset[str]:
    """The plugins whose verdict keeps ``qpi`` waiting (kube: unschedulable | pending)."""
    return frozenset(qpi.unschedulable_plugins | qpi.pending_plugins)


def _record_changed(old: Pod | Node, new: Pod | Node) -> bool:
    """True when the decoded records differ in more than the resource version.

    Status-only updates (conditions, heartbeats) decode to equal records, so they never move
    pods; kube's isPodUpdated / nodeSchedulingPropertiesChange make the same distinction.
    """
    return dataclasses.replace(old, resource_version=new.resource_version) != new


class SchedulingQueue:
    """Pending pods of one scheduler, in kube-scheduler's three sub-queues (see module doc)."""

    def __init__(
        self,
        less: Less,
        clock: Clock,
        *,
        initial_backoff: float = 1.0,
        max_backoff: float = 10.0,
        unschedulable_timeout: float = 300.0,
        registered_events: Mapping[ClusterEvent, frozenset[str]] | None = None,
        on_incoming: IncomingHook | None = None,
        sort_key: SortKey | None = None,
    ) -> None:
        """``sort_key``, when the QueueSort plugin has one, must order exactly as ``less``
        (``less(a, b)`` iff ``sort_key(a) < sort_key(b)``): the activeQ then compares tuples
        instead of calling ``less`` twice per comparison."""
        if initial_backoff < 0 or max_backoff < initial_backoff:
            raise ValueError(
                f"need 0 <= initial_backoff <= max_backoff, got {initial_backoff}, {max_backoff}"
            )
        if unschedulable_timeout <= 0:
            raise ValueError(f"unschedulable_timeout must be positive, got {unschedulable_timeout}")
        self._less = less
        self._clock = clock
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._unschedulable_timeout = unschedulable_timeout
        self._registered = dict(registered_events or {})
        self._interested: dict[ClusterEvent, frozenset[str]] = {}
        self._on_incoming = on_incoming
        self._sort_key = sort_key
        self._active = _Heap(_key_less if sort_key is not None else self._active_less)
        self._backoff = _Heap(_backoff_less)
        self._unschedulable = _Pool()
        self._gated: dict[str, QueuedPodInfo] = {}
        self._seq = 0
        self._scheduling_cycle = 0
        self._move_request_cycle = -1

    # -- reading --------------------------------------------------------------------------------

    @property
    def scheduling_cycle(self) -> int:
        """The number of pods popped so far; the cycle of the pod ``pop()`` returned last."""
        return self._scheduling_cycle

    def __len__(self) -> int:
        return len(self._active) + len(self._backoff) + len(self._unschedulable) + len(self._gated)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return (
            key in self._active
            or key in self._backoff
            or key in self._unschedulable
            or key in self._gated
        )

    def get(self, key: str) -> QueuedPodInfo | None:
        entry = self._active.get(key) or self._backoff.get(key)
        if entry is not None:
            return entry.qpi
        return self._unschedulable.get(key) or self._gated.get(key)

    def sub_queue_of(self, key: str) -> str | None:
        """Where ``key`` waits: "active", "backoff", "unschedulable" or "gated"; None if not
        queued."""
        if key in self._active:
            return ACTIVE
        if key in self._backoff:
            return BACKOFF
        if key in self._unschedulable:
            return UNSCHEDULABLE
        return GATED if key in self._gated else None

    def pending_counts(self) -> dict[str, int]:
        return {
            ACTIVE: len(self._active),
            BACKOFF: len(self._backoff),
            UNSCHEDULABLE: len(self._unschedulable),
            GATED: len(self._gated),
        }

    def pending_pods(self) -> list[QueuedPodInfo]:
        """Every queued pod: activeQ (heap order, not sorted), backoffQ, the pool, then the
        gated pods."""
        pods = [e.qpi for e in self._active]
        pods.extend(e.qpi for e in self._backoff)
        pods.extend(self._unschedulable.pods())
        pods.extend(self._gated.values())
        return pods

    def next_wakeup(self) -> float | None:
        """The earliest clock time at which ``flush()`` has work: a backoff expiry or a pool
        timeout. None when neither queue holds a pod."""
        times: list[float] = []
        head = self._backoff.peek()
        if head is not None:
            times.append(head.expiry)
        oldest = next(self._unschedulable.pods(), None)
        if oldest is not None:
            times.append(oldest.timestamp + self._unschedulable_timeout)
        return min(times) if times else None

    def backoff_expiry(self, qpi: QueuedPodInfo) -> float:
        """When ``qpi``'s backoff ends: its last failure plus the backoff for its attempts."""
        return qpi.timestamp + backoff_duration(
            qpi.attempts, self._initial_backoff, self._max_backoff
        )

    # -- pods from the informer ------------------------------------------------------------------

    def add(self, pod: Pod) -> None:
        """A new pending pod goes to activeQ (gated: to the gated pods); a queued one has its
        record replaced in place."""
        qpi = self.get(pod.key)
        if qpi is not None:
            self._replace_pod(qpi, pod)
            return
        qpi = QueuedPodInfo(pod=pod, timestamp=self._clock.now())
        if pod.scheduling_gates:
            self._gated[pod.key] = qpi
            self._incoming(GATED, POD_ADD)
            return
        self._push_active(qpi, POD_ADD)
        self._unscheduled_pod_added()

    def _unscheduled_pod_added(self) -> None:
        """A new pending pod may help pods a plugin rejected for want of peers (a gang's
        members, kube's UnscheduledPodAdd): moved only when some plugin registered Pod/Add."""
        if self._interested_plugins(UNSCHEDULED_POD_ADD):
            self.move_all_to_active_or_backoff(UNSCHEDULED_POD_ADD)

    def update(self, old: Pod, new: Pod) -> None:
        """Replace a queued pod's record. A pod in the unschedulable pool whose record changed
        (beyond its resource version) moves to backoffQ, or activeQ when its backoff is over;
        an unknown pod is added to activeQ."""
        key = new.key
        gated = self._gated.get(key)
        if gated is not None:
            gated.pod = new
            if not new.scheduling_gates:  # the last gate removed: PreEnqueue passes
                del self._gated[key]
                self._push_active(gated, POD_UPDATE)
            return
        if new.scheduling_gates:
            # Gates cannot be added to an existing pod (API validation); a record seen gated
            # for the first time is one the queue did not hold: gated it waits.
            self.delete(new)
            self.add(new)
            return
        qpi = self._unschedulable.get(key)
        if qpi is not None:
            qpi.pod = new
            if _record_changed(old, new):
                self._unschedulable.remove(key)
                self._push_active_or_backoff(qpi, POD_UPDATE)
            return
        if key in self._active or key in self._backoff:
            self.add(new)
            return
        self._push_active(QueuedPodInfo(pod=new, timestamp=self._clock.now()), POD_UPDATE)

    def refresh(self, pod: Pod) -> None:
        """A newer record of a queued pod whose spec is unchanged (a status write: a condition,
        a nomination): kept where it waits, so that its next attempt and the reports of it
        read what the API server holds now (kube's queue updates a pod's info in place)."""
        qpi = self.get(pod.key)
        if qpi is not None and qpi.pod.uid == pod.uid:
            self._replace_pod(qpi, pod)

    def delete(self, pod: Pod) -> None:
        key = pod.key
        if self._gated.pop(key, None) is not None:
            return
        if self._active.remove(key) is None and self._backoff.remove(key) is None:
            self._unschedulable.remove(key)

    # -- the scheduling loop ---------------------------------------------------------------------

    def pop(self) -> QueuedPodInfo | None:
        """The next pod to schedule, or None when activeQ is empty (call ``flush()`` first)."""
        if not self._active:
            return None
        qpi = self._active.pop().qpi
        self._scheduling_cycle += 1
        qpi.attempts += 1
        if qpi.initial_attempt_timestamp is None:
            qpi.initial_attempt_timestamp = self._clock.now()
        qpi.unschedulable_plugins.clear()
        qpi.pending_plugins.clear()
        return qpi

    def flush(self) -> None:
        """Move backoff-completed pods to activeQ and timed-out pool pods to active/backoff."""
        now = self._clock.now()
        while (head := self._backoff.peek()) is not None and head.expiry <= now:
            self._backoff.pop()
            self._push_active(head.qpi, BACKOFF_COMPLETE)
        expired: list[QueuedPodInfo] = []
        for qpi in self._unschedulable.pods():
            if qpi.timestamp + self._unschedulable_timeout > now:
                break
            expired.append(qpi)
        if expired:
            self._move(expired, UNSCHEDULABLE_TIMEOUT)

    def add_unschedulable_if_not_present(
        self, qpi: QueuedPodInfo, pod_scheduling_cycle: int
    ) -> bool:
        """Hand back a pod whose attempt failed; False (and no change) if it is queued already.

        It goes to backoffQ when its failure was an error (no unschedulable or pending plugins)
        or when a move request happened at or after ``pod_scheduling_cycle``; otherwise to the
        unschedulable pool. Its timestamp becomes now: the backoff counts from here.
        """
        if qpi.key in self:
            return False
        qpi.timestamp = self._clock.now()
        if not _rejectors(qpi) or self._move_request_cycle >= pod_scheduling_cycle:
            self._push_backoff(qpi, SCHEDULE_ATTEMPT_FAILURE)
        else:
            self._unschedulable.add(qpi)
            self._incoming(UNSCHEDULABLE, SCHEDULE_ATTEMPT_FAILURE)
        return True

    def requeue_with_backoff(self, qpi: QueuedPodInfo) -> bool:
        """Hand back a pod whose binding failed: to backoffQ, backoff counted from now.
        False (and no change) if the pod is queued already."""
        if qpi.key in self:
            return False
        qpi.timestamp = self._clock.now()
        self._push_backoff(qpi, SCHEDULE_ATTEMPT_FAILURE)
        return True

    # -- cluster events --------------------------------------------------------------------------

    def move_all_to_active_or_backoff(self, event: ClusterEvent, *, except_key: str = "") -> None:
        """Move the pool's pods that ``event`` may help (see module doc), all but
        ``except_key``; records the move request cycle even when no pod moves."""
        pods = self._unschedulable.rejected_by(self._interested_plugins(event))
        if except_key:
            pods = [qpi for qpi in pods if qpi.key != except_key]
        self._move(pods, event)

    def assigned_pod_added(self, pod: Pod) -> None:
        self.move_all_to_active_or_backoff(ASSIGNED_POD_ADD)

    def assigned_pod_updated(self, old: Pod, new: Pod) -> None:
        if _record_changed(old, new):
            self.move_all_to_active_or_backoff(ASSIGNED_POD_UPDATE)

    def assigned_pod_deleted(self, pod: Pod) -> None:
        self.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)

    def node_added(self, node: Node) -> None:
        self.move_all_to_active_or_backoff(NODE_ADD)

    def node_updated(self, old: Node, new: Node) -> None:
        """Moves pods only when the node record changed beyond its resource version."""
        if _record_changed(old, new):
            self.move_all_to_active_or_backoff(NODE_UPDATE)

    def node_deleted(self, node: Node) -> None:
        self.move_all_to_active_or_backoff(NODE_DELETE)

    def device_changed(self, action: Action) -> None:
        """A Device CR changed: DEVICE_ADD, DEVICE_UPDATE or DEVICE_DELETE (equal records)."""
        self.move_all_to_active_or_backoff(ClusterEvent(Resource.DEVICE, action))

    # -- internals -------------------------------------------------------------------------------

    def _interested_plugins(self, event: ClusterEvent) -> frozenset[str] | None:
        """Plugins that registered an event covering ``event``; None means "every pod" (the
        wildcard event, e.g. UnschedulableTimeout)."""
        if event.resource is Resource.WILDCARD and event.action == Action.ALL:
            return None
        plugins = self._interested.get(event)
        if plugins is None:
            names: set[str] = set()
            for registered, who in self._registered.items():
                if registered.matches(event):
                    names.update(who)
            plugins = self._interested[event] = frozenset(names)
        return plugins

    def _move(self, pods: list[QueuedPodInfo], event: ClusterEvent) -> None:
        for qpi in pods:
            self._unschedulable.remove(qpi.key)
            self._push_active_or_backoff(qpi, event.name)
        self._move_request_cycle = self._scheduling_cycle

    def _replace_pod(self, qpi: QueuedPodInfo, pod: Pod) -> None:
        qpi.pod = pod
        entry = self._active.get(pod.key)
        if entry is not None:
            if self._sort_key is not None:
                entry.key = (*self._sort_key(qpi), entry.seq)
            self._active.fix(pod.key)

    def _push_active_or_backoff(self, qpi: QueuedPodInfo, event: str) -> None:
        if self.backoff_expiry(qpi) > self._clock.now():
            self._push_backoff(qpi, event)
        else:
            self._push_active(qpi, event)

    def _push_active(self, qpi: QueuedPodInfo, event: str) -> None:
        self._seq += 1
        entry = _Entry(qpi, self._seq)
        if self._sort_key is not None:
            entry.key = (*self._sort_key(qpi), self._seq)
        self._active.push(entry)
        self._incoming(ACTIVE, event)

    def _push_backoff(self, qpi: QueuedPodInfo, event: str) -> None:
        self._seq += 1
        self._backoff.push(_Entry(qpi, self._seq, self.backoff_expiry(qpi)))
        self._incoming(BACKOFF, event)

    def _incoming(self, queue: str, event: str) -> None:
        if self._on_incoming is not None:
            self._on_incoming(queue, event)

    def _active_less(self, a: _Entry, b: _Entry) -> bool:
        if self._less(a.qpi, b.qpi):
            return True
        if self._less(b.qpi, a.qpi):
            return False
        return a.seq < b.seq


def _key_less(a: _Entry, b: _Entry) -> bool:
    return a.key < b.key


def _backoff_less(a: _Entry, b: _Entry) -> bool:
    return (a.expiry, a.seq) < (b.expiry, b.seq)
