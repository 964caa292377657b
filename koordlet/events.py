"""Warning events on pods, posted off the caller's thread.

Role: ``EventRecorder`` takes ``warn(namespace, name, uid, reason, message)`` from any thread
(the runtime hook's RPC threads), and posts core/v1 Events through the ``EventAPI`` port on
its own thread, started and stopped explicitly (an agent ``Service``).

Invariants:

- ``warn`` never blocks and never raises: the queue is bounded; when it is full the event is
  dropped and counted in ``dropped`` (the log line and the metric of the caller remain).
- The same (pod uid, reason) is posted at most once per ``dedup_window_s``: a crash-looping
  container whose every restart is denied does not flood the API server.
- A failed post is logged and not retried.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import structlog

__all__ = ["COMPONENT", "EventAPI", "EventRecorder", "pod_warning_event"]

COMPONENT: Final = "koordlet"

log = structlog.get_logger("koordlet.events")


class EventAPI(Protocol):
    def create_event(self, event: Mapping[str, Any]) -> None:
        """Raises on failure (any exception)."""
        ...


def pod_warning_event(
    *, namespace: str, name: str, uid: str, reason: str, message: str, host: str, now: datetime
) -> dict[str, Any]:
    """A core/v1 Warning Event about a pod, as kubelet-style components post them."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": name,
            "uid": uid,
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def stop_worker(work: queue.Queue[Any], thread: threading.Thread) -> None:
    """End a queue worker: put its stop marker (None), dropping pending items to make room in a
    full queue, and wait for it (bounded)."""
    while True:
        try:
            work.put_nowait(None)
            break
        except queue.Full:
            with contextlib.suppress(queue.Empty):
                work.get_nowait()
    thread.join(10.0)


class EventRecorder:
    """See the module docstring."""

    def __init__(
        self,
        api: EventAPI,
        host: str,
        *,
        capacity: int = 256,
        dedup_window_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self._host = host
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(capacity)
        self._dedup_window_s = dedup_window_s
        self._monotonic = monotonic
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self.posted = 0

    def warn(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        now = self._monotonic()
        key = (uid or f"{namespace}/{name}", reason)
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._dedup_window_s:
                return
            self._last[key] = now
            if len(self._last) > 4096:  # forget the oldest
                for k in sorted(self._last, key=self._last.__getitem__)[:1024]:
                    del self._last[k]
        event = pod_warning_event(
            namespace=namespace,
            name=name,
            uid=uid,
            reason=reason,
            message=message,
            host=self._host,
            now=self._clock(),
        )
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("EventRecorder already started")
        self._thread = threading.Thread(target=self._run, name="koordlet-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            stop_worker(self._queue, thread)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self._api.create_event(event)
                self.posted += 1
            except Exception as exc:
                involved = event["involvedObject"]
                log.warning(
                    "posting a pod event failed",
                    pod=f"{involved['namespace']}/{involved['name']}",
                    reason=event["reason"],
                    error=str(exc),
                )
