"""An adversarial fake of our Cluster port: a true state, and a watch that lies by omission.

Role: the scheduler-core fault model in one small object, for the unit and model tests of
``scheduler.core``. The *true* state is an ``InMemoryCluster`` (the "API server": binds
and condition writes apply there atomically, with the API's preconditions: UID, not yet
bound). The scheduler does not see it directly: every true change goes into ``pending`` and
reaches the scheduler only when the test says so — late (``deliver``), out of order across
objects (``deliver(i)`` with any ``i`` whose object has no earlier pending change), twice
(``duplicate``: an informer resync), or not at all until a ``relist`` (the informer's
list after a 410: the difference between what was seen and the truth, as add/update/delete).

Binds answer as the test scripts them (``bind_plan``): ``ok``; ``409`` (the API refused: an
uncertain answer the scheduler must read back); ``500`` (refused, not applied); ``lost``
(applied, but the answer never came back: a timeout). ``lookup_pod`` reads the truth.

Invariants: per object, changes reach the scheduler in the order they happened (a real
informer never reorders one object's events), and each delivered change's ``old`` is what the
scheduler was last told about that object, so its view is always some past truth.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, decode_allocations
from apis.core import Pod
from apis.resources import GPU_CORE, GPU_MEMORY_RATIO
from scheduler.cluster import ChangeHandler
from scheduler.framework.events import POD_GROUP_KIND, Change
from scheduler.framework.interfaces import BindError
from scheduler.simulator.cluster import InMemoryCluster

BIND_ANSWERS = ("ok", "409", "500", "lost")


def _ident(change: Change) -> tuple[str, str]:
    obj = change.new if change.new is not None else change.old
    key = getattr(obj, "key", None) or getattr(obj, "name", "")
    return change.kind, str(key)


class AdversarialCluster:
    """The Cluster port over ``truth`` with a controllable watch (see the module doc)."""

    def __init__(self, truth: InMemoryCluster | None = None) -> None:
        self.truth = truth if truth is not None else InMemoryCluster()
        self.pending: list[Change] = []
        self.seen: dict[tuple[str, str], Any] = {}
        self._handlers: list[ChangeHandler] = []
        self._lock = threading.RLock()
        self.bind_plan: deque[str] = deque()
        """Answers for the next binds, in order; ``ok`` when empty."""
        self.bind_calls = 0
        self.lookups = 0
        self.unreadable = False
        """When True, ``lookup_pod`` fails: the API server cannot be read."""
        self.gate: threading.Event | None = None
        """When set, binds wait for it (worker threads only) before they reach the truth."""
        self.ignore_binding_uid = False
        """Bind whatever pod has the name now, as a v1.20 API server does (it does not check a
        Binding's ``metadata.uid``): a stale bind lands on a same-name successor."""
        self.fence: Callable[[], bool] | None = None
        """When set, a leader-only write (bind, victim delete, nomination, gang mark) is sent
        only while it answers True, as the kube adapter's lease fence: else nothing is sent
        (binds and deletes raise ``BindError(fenced=True)``)."""
        self.fenced_writes = 0
        self.truth.subscribe(self._record)
        self.pending.clear()  # the truth starts empty or is "seen" below
        for kind, objects in (
            ("Node", self.truth.nodes.values()),
            ("Device", self.truth.devices.values()),
            ("Pod", self.truth.pods.values()),
            (POD_GROUP_KIND, self.truth.pod_groups.values()),
        ):
            for obj in objects:
                self.seen[_ident(Change(kind, None, obj))] = obj

    # -- the Cluster port -------------------------------------------------------------------------

    def subscribe(self, handler: ChangeHandler) -> None:
        with self._lock:
            self._handlers.append(handler)
            for (kind, _), obj in list(self.seen.items()):
                handler(Change(kind, None, obj))

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return True

    def bind(self, pod: Pod, node_name: str, annotations: Mapping[str, str]) -> None:
        with self._lock:
            self.bind_calls += 1
            answer = self.bind_plan.popleft() if self.bind_plan else "ok"
        if self.gate is not None:  # the bind is "on the wire" until the test opens the gate
            assert self.gate.wait(60), "bind gate never opened"
        self._check_fence(pod, "bind")
        with self._lock:
            if answer == "500":
                raise BindError(f"binding {pod.key}: 500 etcdserver: request timed out")
            if answer == "409":
                raise BindError(f"binding {pod.key}: 409 Conflict", uncertain=True)
            if self.ignore_binding_uid:
                current = self.truth.pods.get(pod.key)
                if current is not None:
                    pod = current
            self.truth.bind(pod, node_name, annotations)
            if answer == "lost":
                raise BindError(f"binding {pod.key}: read timed out", uncertain=True)

    def lookup_pod(self, pod: Pod) -> Pod | None:
        self.lookups += 1
        if self.unreadable:
            raise ConnectionError("connection refused")
        return self.truth.lookup_pod(pod)

    def record_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        self.truth.record_event(pod, event_type, reason, message)

    def set_pod_scheduled_condition(self, pod: Pod, status: str, reason: str, message: str) -> None:
        self.truth.set_pod_scheduled_condition(pod, status, reason, message)

    def set_nominated_node(self, pod: Pod, node_name: str) -> None:
        if self._fence_open():
            self.truth.set_nominated_node(pod, node_name)

    def delete_pod(self, pod: Pod, *, preemptor: Pod | None = None) -> None:
        self._check_fence(pod, "delete")
        self.truth.delete_pod(pod)

    def annotate_pod(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        self._check_fence(pod, "annotate")
        self.truth.annotate_pod(pod, annotations)

    def _fence_open(self) -> bool:
        if self.fence is None or self.fence():
            return True
        self.fenced_writes += 1
        return False

    def _check_fence(self, pod: Pod, what: str) -> None:
        if not self._fence_open():
            raise BindError(f"{what} {pod.key} not sent: leader lease lost", fenced=True)

    # -- the watch, as the test drives it ------------------------------------------------------

    def _record(self, change: Change) -> None:
        self.pending.append(change)

    def deliverable(self) -> list[int]:
        """Indexes of pending changes that may go next (no earlier change of the same object)."""
        with self._lock:
            first: dict[tuple[str, str], int] = {}
            for i, change in enumerate(self.pending):
                first.setdefault(_ident(change), i)
            return sorted(first.values())

    def deliver(self, i: int = 0) -> None:
        """Deliver the ``i``-th deliverable change (0: the oldest)."""
        with self._lock:
            choices = self.deliverable()
            if not choices:
                return
            change = self.pending.pop(choices[i % len(choices)])
            self._tell(change.kind, _ident(change), change.new)

    def deliver_all(self) -> None:
        while self.pending:
            self.deliver(0)

    def drop_pending(self) -> None:
        """The watch breaks: everything in flight is lost (a ``relist`` must follow)."""
        with self._lock:
            self.pending.clear()

    def duplicate(self, i: int = 0) -> None:
        """Re-deliver what the scheduler last saw of one object (an informer resync)."""
        with self._lock:
            seen = sorted(self.seen)
            if seen:
                ident = seen[i % len(seen)]
                obj = self.seen[ident]
                for handler in self._handlers:
                    handler(Change(ident[0], obj, obj))

    def relist(self) -> None:
        """The informer lists again: it tells the difference between what it saw and now."""
        with self._lock:
            self.pending.clear()
            truth: dict[tuple[str, str], Any] = {}
            for kind, objects in (
                ("Node", self.truth.nodes.values()),
                ("Device", self.truth.devices.values()),
                ("Pod", self.truth.pods.values()),
                (POD_GROUP_KIND, self.truth.pod_groups.values()),
            ):
                for obj in objects:
                    truth[_ident(Change(kind, None, obj))] = obj
            for ident in sorted(set(self.seen) - set(truth)):
                self._tell(ident[0], ident, None)
            for ident, obj in sorted(truth.items()):
                if self.seen.get(ident) is not obj:
                    self._tell(ident[0], ident, obj)

    def _tell(self, kind: str, ident: tuple[str, str], new: Any) -> None:
        old = self.seen.get(ident)
        if old is None and new is None:
            return
        if new is None:
            del self.seen[ident]
        else:
            self.seen[ident] = new
        for handler in self._handlers:
            handler(Change(kind, old, new))


def card_usage(cluster: InMemoryCluster) -> dict[tuple[str, int], tuple[int, int]]:
    """(node, GPU minor) -> (gpu-core, gpu-memory-ratio) summed over the true state's live
    assigned pods, from their device-allocated annotations: what the cards really carry."""
    usage: dict[tuple[str, int], tuple[int, int]] = {}
    for pod in cluster.pods.values():
        text = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if not pod.node_name or not text or pod.terminal:
            continue
        for alloc in decode_allocations(text).get("gpu", []):
            key = (pod.node_name, alloc.minor)
            core, ratio = usage.get(key, (0, 0))
            usage[key] = (
                core + alloc.resource_value(GPU_CORE),
                ratio + alloc.resource_value(GPU_MEMORY_RATIO),
            )
    return usage
