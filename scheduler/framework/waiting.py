"""Waiting pods: pods a Permit plugin parked, until every such plugin allows them.

kube-scheduler's ``WaitingPod``: Permit returns Wait with a timeout; the pod's binding cycle
blocks in ``wait()`` until each waiting plugin calls ``allow(plugin)``, any plugin calls
``reject(plugin, message)``, or the earliest timeout passes. Plugins reach waiting pods through
``Handle.waiting_pods`` (e.g. a gang plugin allowing its members together).

Invariants: a waiting pod is decided exactly once (``allow_together`` decides a group of
them atomically: all allowed or none); ``wait()`` returns None (allowed) or an
Unschedulable status naming the plugin; ``timed_out`` is true exactly when the decision was the
timeout's (the scheduler then writes ``PERMIT_TIMED_OUT_KEY`` into the pod's cycle state, so a
plugin's Unreserve can tell a timeout from any other rejection); the registry is safe to use
from any thread. A pod stays registered until the scheduling thread has applied its binding
cycle's outcome (Unreserve included), so a plugin's Permit can tell a member whose wait was
decided rejected (``rejected``) from one still waiting or let through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack

from apis.core import Pod
from scheduler.framework.status import Code, Status

PERMIT_TIMED_OUT_KEY = "framework/permit-timed-out"
"""Cycle-state key: the name of the plugin whose Permit wait timed out (set before Unreserve)."""


class WaitingPod:
    def __init__(self, pod: Pod, timeouts: Mapping[str, float]) -> None:
        self.pod = pod
        self._pending = dict(timeouts)  # plugin -> seconds
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._decided = threading.Event()
        self._result: Status | None = None
        self.timed_out_plugin = ""
        """The plugin whose wait timed out ('' unless the timeout decided the pod)."""

    @property
    def pending_plugins(self) -> list[str]:
        with self._lock:
            return sorted(self._pending)

    @property
    def rejected(self) -> bool:
        """Decided, and not allowed (a plugin rejected it or its wait timed out): its bind
        will never be sent, whatever it still holds until its Unreserve runs."""
        with self._lock:
            return self._is_rejected()

    def _is_rejected(self) -> bool:
        return self._decided.is_set() and self._result is not None

    def allow(self, plugin: str) -> None:
        with self._lock:
            self._allow(plugin)

    def _allow(self, plugin: str) -> None:
        self._pending.pop(plugin, None)
        if not self._pending and not self._decided.is_set():
            self._result = None
            self._decided.set()

    def reject(self, plugin: str, message: str) -> bool:
        """Reject the pod unless it was decided already; True when it is (now) rejected, so
        its binding cycle will certainly not bind it."""
        with self._lock:
            if not self._decided.is_set():
                self._result = Status(Code.UNSCHEDULABLE, (message,), plugin=plugin)
                self._decided.set()
            return self._result is not None

    def wait(self) -> Status | None:
        """Block until allowed, rejected, or the earliest plugin timeout (then rejected)."""
        while True:
            with self._lock:
                if self._decided.is_set():
                    return self._result
                plugin, seconds = min(self._pending.items(), key=lambda kv: kv[1])
            remaining = self._start + seconds - time.monotonic()
            if remaining <= 0 or not self._decided.wait(remaining):
                message = f"rejected due to timeout after waiting {seconds:g}s at plugin {plugin}"
                with self._lock:
                    if not self._decided.is_set():
                        self._result = Status(Code.UNSCHEDULABLE, (message,), plugin=plugin)
                        self.timed_out_plugin = plugin
                        self._decided.set()


def allow_together(waiting: Iterable[WaitingPod], plugin: str) -> bool:
    """``plugin`` allows every pod of ``waiting`` at once, or none of them when one was
    already rejected (or timed out): a gang is let through whole or not at all. Each pod's
    decision lock is held across the check and the allows (taken in uid order), so a timeout
    decided in a bind worker cannot fall between them."""
    ordered = sorted(waiting, key=lambda w: w.pod.uid)
    with ExitStack() as locks:
        for w in ordered:
            locks.enter_context(w._lock)  # the module's own lock protocol
        if any(w._is_rejected() for w in ordered):
            return False
        for w in ordered:
            w._allow(plugin)
    return True


class WaitingPods:
    """The scheduler's waiting pods by pod uid."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, WaitingPod] = {}

    def add(self, waiting: WaitingPod) -> None:
        with self._lock:
            self._pods[waiting.pod.uid] = waiting

    def remove(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def get(self, uid: str) -> WaitingPod | None:
        with self._lock:
            return self._pods.get(uid)

    def __iter__(self) -> Iterator[WaitingPod]:
        with self._lock:
            return iter(list(self._pods.values()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)
