"""GPU health: the XID rules, the per-card health state and the event-watcher thread.

Role: keep one ``Health`` per card, fed by the library's health events (a background thread,
started and stopped explicitly) and by periodic probes (cards that can no longer be read),
and tell the agent at once when a card's health changes.

Invariants:

- Application XIDs (13, 31, 43, 45, 68, 109: the application's fault, the card is fine; the
  list of NVIDIA's k8s-device-plugin and Koordinator) never change health; any other critical
  XID makes the card unhealthy with reason ``Xid<N>`` (Koordinator's wording).
- XID unhealthiness is sticky (as in Koordinator and the device plugin: there is no event that
  says a card recovered); only an explicit healthy event (the fake library's health file) or a
  successful probe after a *probe* failure makes a card healthy again.
- ``on_change`` runs outside the tracker's lock, once per effective change, on the thread that
  made the change; it must be quick (the agent only wakes its sync loop).
- The watcher thread is a daemon, so a stuck library call never blocks interpreter exit;
  ``stop()`` joins it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import structlog

from koordlet.devices.library import (
    GPU,
    HEALTHY,
    REASON_QUERY_FAILED,
    DeviceLibrary,
    Health,
    HealthEvent,
)

__all__ = ["APPLICATION_XIDS", "HealthTracker", "HealthWatcher", "probe_all", "xid_health"]

APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
"""Graphics engine exception, GPU memory page fault, GPU stopped processing, preemptive
cleanup, video processor exception, context switch timeout: the application's errors."""

log = structlog.get_logger("koordlet.health")


def xid_health(xid: int) -> Health | None:
    """The health a critical XID implies, or None for an application XID (ignored)."""
    if xid in APPLICATION_XIDS:
        return None
    return Health(False, f"Xid{xid}", f"Xid error detected on device, error code: {xid}")


class HealthTracker:
    """Thread-safe health of every known card (unknown uuids are ignored)."""

    def __init__(
        self,
        uuids: Iterable[str],
        initial: Mapping[str, Health] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._health: dict[str, Health] = {u: HEALTHY for u in uuids}
        for uuid, health in (initial or {}).items():
            if uuid in self._health:
                self._health[uuid] = health
        self._on_change = on_change

    def set_on_change(self, on_change: Callable[[], None] | None) -> None:
        """Replace the change callback (the agent wires it after building the sync loop)."""
        self._on_change = on_change

    def snapshot(self) -> dict[str, Health]:
        """A copy of the current health of every card."""
        with self._lock:
            return dict(self._health)

    def get(self, uuid: str) -> Health | None:
        with self._lock:
            return self._health.get(uuid)

    def apply(self, event: HealthEvent) -> bool:
        """Apply a library event; True when some card's health changed."""
        with self._lock:
            targets = list(self._health) if event.uuid == "" else [event.uuid]
            changed = [u for u in targets if self._set_locked(u, event.health)]
        self._changed(changed, event.health)
        return bool(changed)

    def apply_probe(self, uuid: str, health: Health) -> bool:
        """Apply a probe result: a failure marks a healthy card unhealthy; a success clears
        only a probe failure (never an XID). True when the card's health changed."""
        with self._lock:
            current = self._health.get(uuid)
            if current is None:
                return False
            if health.healthy and current.reason != REASON_QUERY_FAILED:
                return False
            if not health.healthy and not current.healthy:
                return False
            changed = [uuid] if self._set_locked(uuid, health) else []
        self._changed(changed, health)
        return bool(changed)

    def _set_locked(self, uuid: str, health: Health) -> bool:
        if uuid not in self._health:
            log.warning("health event for an unknown card ignored", uuid=uuid)
            return False
        if self._health[uuid] == health:
            return False
        self._health[uuid] = health
        return True

    def _changed(self, uuids: list[str], health: Health) -> None:
        if not uuids:
            return
        for uuid in uuids:
            log.info(
                "gpu health changed",
                uuid=uuid,
                healthy=health.healthy,
                reason=health.reason,
                message=health.message,
            )
        if self._on_change is not None:
            self._on_change()


def probe_all(library: DeviceLibrary, gpus: Iterable[GPU], tracker: HealthTracker) -> bool:
    """Probe every card once and record lost ones; True when some health changed."""
    changed = False
    for gpu in gpus:
        changed = tracker.apply_probe(gpu.uuid, library.probe(gpu)) or changed
    return changed


class HealthWatcher:
    """A background thread that feeds the library's health events into a tracker."""

    def __init__(
        self,
        library: DeviceLibrary,
        tracker: HealthTracker,
        gpus: tuple[GPU, ...],
        *,
        wait_timeout_s: float = 1.0,
        error_backoff_s: float = 5.0,
    ) -> None:
        self._library = library
        self._tracker = tracker
        self._gpus = gpus
        self._wait_timeout_s = wait_timeout_s
        self._error_backoff_s = error_backoff_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Subscribe and start the thread; False (no thread) when events are unsupported."""
        if self._thread is not None:
            raise RuntimeError("HealthWatcher already started")
        if not self._gpus or not self._library.open_health_events(self._gpus):
            return False
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="koordlet-health-watcher", daemon=True
        )
        self._thread.start()
        log.info("gpu health watcher started", gpus=len(self._gpus))
        return True

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the thread, wait for it, and drop the subscription; idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout_s if timeout_s is not None else self._wait_timeout_s + 5.0)
        self._thread = None
        self._library.close_health_events()
        log.info("gpu health watcher stopped")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._library.wait_health_event(self._wait_timeout_s)
            except Exception as exc:  # a library bug must not kill the watcher
                log.error("waiting for gpu health events failed", error=str(exc))
                self._stop.wait(self._error_backoff_s)
                continue
            if event is None:
                continue
            self._tracker.apply(event)
            if event.uuid == "":  # a whole-library failure: do not spin on it
                self._stop.wait(self._error_backoff_s)
