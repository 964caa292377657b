"""The fair-share server as a service of the agent: started, fed the node's pods, stopped.

Role: own the ``FairShareServer``'s lifecycle and keep its clients in step with the node's
pods: one sync at start (a restarted agent rebuilds its clients before the loop runs), then
every ``interval_s``. The pod list comes from an injected callable (the kube adapter's
``list_node_pod_records``), so tests feed records directly.

Invariants: a failed pod listing is logged and retried at the next interval, the clients
already served are kept (never emptied on an API error); problems of single pods (a bad
limit annotation) are logged once per distinct message; ``stop()`` is idempotent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import structlog

from apis.fairshare import DefaultLimit
from koordlet.fairshare.pods import PodRecord, fairshare_pods
from koordlet.fairshare.server import FairShareServer

__all__ = ["FairShareService"]

log = structlog.get_logger("koordlet.fairshare")


class FairShareService:
    """See the module docstring."""

    def __init__(
        self,
        server: FairShareServer,
        list_pods: Callable[[], Sequence[PodRecord]],
        *,
        default_limit: DefaultLimit = DefaultLimit.FULL,
        interval_s: float = 10.0,
    ) -> None:
        self.server = server
        self.list_pods = list_pods
        self.default_limit = default_limit
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: set[str] = set()

    def sync_once(self) -> bool:
        """One pass; False when the pod list could not be read."""
        try:
            records = self.list_pods()
        except Exception as exc:  # the adapter's ApiError, or anything a fake raises
            log.warning("fair-share: pod list unavailable, clients kept", error=str(exc))
            return False
        pods, problems = fairshare_pods(records, self.default_limit)
        for line in problems:
            if line not in self._reported:
                log.warning("fair-share: pod not served", problem=line)
        self._reported = set(problems)
        self.server.sync_pods(pods)
        return True

    def start(self) -> None:
        self.server.start()
        self.sync_once()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fairshare-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync_once()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(10.0)
            self.server.stop()
