"""A bind's outcome applied on the scheduling thread (kube-scheduler's handleBindingCycleError
and the finishing half of bindingCycle): this is where a bind's fate is decided for the caches.

"bound" finishes the assumed pod (its bind worker wrote the Scheduled event); "unknown"
keeps the pod assumed and its reservation held (the informer settles it); anything else runs
Unreserve, forgets the pod, moves the pods it turned away, and then retries (failed, fenced),
waits for an event (rejected) or drops it (gone, deleted meanwhile). A 201 for a pod deleted
meanwhile first reads back what holds the name (``_read_back_before_release``). ``place``'s
outcomes go to its future instead: the caller owns the pod. Who may touch what: the ownership
rule in ``scheduler.core.binding_cycle``.
"""

from __future__ import annotations

import time

from scheduler.core.base import BindOutcome, log
from scheduler.core.events import EventHandlers
from scheduler.core.types import Placement
from scheduler.framework.events import ASSIGNED_POD_DELETE


class BindingOutcomes(EventHandlers):
    """Finishes binding cycles from the inbox (scheduling thread)."""

    def _finish_binding(self, outcome: BindOutcome) -> None:
        uid = outcome.assumed.uid
        self._binding.discard(uid)
        self.waiting_pods.remove(uid)
        self._hand_read_back_to_ledger(uid)
        self._finish_binding_outcome(outcome)
        self._deleted_while_binding.discard(uid)
        if uid in self._deferred and outcome.resolution == "bound" and not outcome.landed:
            # A 201 for a pod deleted meanwhile (before or after the worker saw the answer):
            # it may have bound a same-name successor. Read the name before releasing.
            del self._deferred[uid]
            self._read_back_before_release(outcome.assumed)
            return
        # A failed bind moved the waiting pods already, when it released its reservation.
        self._release_deferred(uid, outcome.resolution, move=outcome.resolution == "bound")

    def _finish_binding_outcome(self, outcome: BindOutcome) -> None:
        self._in_flight -= 1
        fwk, assumed, status = outcome.framework, outcome.assumed, outcome.status
        qpi = outcome.qpi
        resolution = outcome.resolution or ("bound" if status is None else "failed")
        seconds = time.perf_counter() - outcome.started if outcome.started else 0.0
        if outcome.counted:
            self._binds_queued -= 1
        if outcome.placed is not None:
            self._finish_placement(outcome, resolution)
            return
        if resolution == "bound":
            self.cache.finish_binding(assumed)
            self.failures.pop(assumed.key, None)
            if assumed.nominated_node_name and assumed.nominated_node_name != assumed.node_name:
                # Bound elsewhere than a preemption made room: the nomination is void.
                self._io(fwk.handle.client.set_nominated_node, assumed, "")
            self.observer.attempt("scheduled", fwk.name, seconds)
            first = qpi.initial_attempt_timestamp or qpi.timestamp
            self.observer.scheduled(qpi.attempts, self.clock.now() - first)
            return  # the bind worker wrote the Scheduled event (``_record_scheduled``)
        assert status is not None
        if resolution == "unknown":
            # The bind may have landed and the cluster cannot say: keep the pod assumed and
            # its reservation held (never over-commit); the informer settles it.
            log.warning("bind outcome unknown at stop", pod=assumed.key, node=assumed.node_name)
            return
        uid_deleted = assumed.uid in self._deleted_while_binding
        fwk.run_unreserve(outcome.state, assumed, assumed.node_name)
        self.cache.forget_pod(assumed)
        if resolution != "rejected" or uid_deleted:
            # Forgetting an assumed pod frees what it held, like an assigned pod's delete: the
            # pods it turned away are retried now, not at the unschedulable pool's flush (the
            # pod itself is requeued below, after the move, so it does not move with them).
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)
        self.observer.attempt(
            "unschedulable" if resolution == "rejected" else "error", fwk.name, seconds
        )
        if self._log_decisions:
            log.warning(
                "binding failed",
                pod=assumed.key,
                node=assumed.node_name,
                outcome=resolution,
                error=status.message,
            )
        if resolution == "gone" or uid_deleted:
            return  # deleted, re-created or bound elsewhere: nothing to retry for this UID
        if resolution == "fenced":
            self.queue.requeue_with_backoff(qpi)  # whoever leads next schedules it
            return
        # The nomination written before a Permit wait named where the pod was going; it is
        # not going there now (kube-scheduler clears it on any binding-cycle failure).
        cleared = "" if outcome.nominated else None
        if resolution == "rejected":
            # A Permit plugin rejected the waiting pod (or its wait timed out): a verdict, so
            # the pod waits for an event that plugin registered, like any unschedulable pod.
            self._fail_status(fwk, qpi, status, self.queue.scheduling_cycle, nominated=cleared)
            # After the verdict, as kube-scheduler defers it: the others it turned away move,
            # the rejected pod stays in the pool for its own plugin's event.
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE, except_key=qpi.key)
            return
        message = f"Binding rejected: {status.message}"
        self.failures[assumed.key] = message
        self.queue.requeue_with_backoff(qpi)
        self._report_failure(fwk, qpi.pod, message, error=True, nominated=cleared)

    def _finish_placement(self, outcome: BindOutcome, resolution: str) -> None:
        """The end of a ``place``: the caller (kube-scheduler, through the extender) owns the
        pod's retries and its events, so nothing is requeued or reported here."""
        assert outcome.placed is not None
        assumed = outcome.assumed
        if resolution == "bound":
            self.cache.finish_binding(assumed)
        elif resolution != "unknown":  # unknown: keep the reservation, the informer settles it
            outcome.framework.run_unreserve(outcome.state, assumed, assumed.node_name)
            self.cache.forget_pod(assumed)
            self.queue.move_all_to_active_or_backoff(ASSIGNED_POD_DELETE)
        message = "" if outcome.status is None else outcome.status.message
        outcome.placed.set_result(Placement(resolution, message))
