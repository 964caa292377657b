"""Waiting pods: pods a Permit plugin parked, until every such plugin allows them.

kube-scheduler's ``WaitingPod``: Permit returns Wait with a timeout; the pod's binding cycle
blocks in ``wait()`` until each waiting plugin calls ``allow(plugin)``, any plugin calls
``reject(plugin, message)``, or the earliest timeout passes. Plugins reach waiting pods through
``Handle.waiting_pods`` (e.g. a gang plugin allowing its members together).

Invariants: a waiting pod is decided exactly once; ``wait()`` returns None (allowed) or an
Unschedulable status naming the plugin; ``timed_out`` is true exactly when the decision was the
timeout's (the scheduler then writes ``PERMIT_TIMED_OUT_KEY`` into the pod's cycle state, so a
plugin's Unreserve can tell a timeout from any other rejection); the registry is safe to use
from any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping

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

    def allow(self, plugin: str) -> None:
        with self._lock:
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
