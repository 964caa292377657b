"""The fair-share server as a service of the agent: started, fed the node's pods, stopped.

Role: own the ``FairShareServer``'s lifecycle and keep its clients in step with the node's
pods: one sync at start (a restarted agent rebuilds its clients before the loop runs), then
every ``interval_s``. The pod list comes from an injected callable (the kube adapter's
``list_node_pod_records``), so tests feed records directly.

Invariants: a failed pod listing is logged and retried at the next interval, the clients
already served are kept (never emptied on an API error); problems of single pods (a bad
limit annotation, a negative ``gpu-core``, a share the scheduler refuses) affect only that
pod: logged once per distinct message and reported to ``on_problem`` (the agent posts a
Warning event on the pod); no error of a pass stops the sync thread; ``stop()`` is idempotent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import structlog

from apis.fairshare import DefaultLimit
from koordlet.fairshare.server import FairShareServer
from koordlet.pods.fairshare import classify_pods
from koordlet.pods.record import PodRecord

__all__ = ["EVENT_REASON", "FairShareService", "OnProblem"]

EVENT_REASON = "FairShareNotServed"
"""The reason of the Warning event on a pod the fair-share server cannot serve."""

OnProblem = Callable[[PodRecord, str], None]
"""(the pod, why it is not served); must not block."""

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
        on_problem: OnProblem | None = None,
    ) -> None:
        self.server = server
        self.list_pods = list_pods
        self.default_limit = default_limit
        self.interval_s = interval_s
        self.on_problem = on_problem
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
        pods, problems = classify_pods(records, self.default_limit)
        by_uid = {r.uid: r for r in records}
        refused = self.server.sync_pods(pods)
        problems += [(by_uid[p.uid], msg) for p, msg in refused if p.uid in by_uid]
        reported: set[str] = set()
        for record, message in problems:
            line = f"pod {record.namespace}/{record.name}: {message}"
            reported.add(line)
            if line in self._reported:
                continue
            log.warning("fair-share: pod not served", problem=line, uid=record.uid)
            if self.on_problem is not None:
                try:
                    self.on_problem(record, message)
                except Exception as exc:
                    log.error("reporting a fair-share problem failed", error=repr(exc))
        self._reported = reported
        return True

    def start(self) -> None:
        self.server.start()
        self.sync_once()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fairshare-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync_once()
            except Exception as exc:  # a bug: lose this pass, never the thread
                log.error("fair-share pod sync failed", error=repr(exc), exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(10.0)
            self.server.stop()
