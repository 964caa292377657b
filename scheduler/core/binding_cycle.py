"""The binding cycle (kube-scheduler's bindingCycle): WaitOnPermit → PreBind → Bind → PostBind
on a worker, then the outcome resolved in the cluster's terms and handed back.

**Ownership rule** (the one statement of it; the other modules of ``scheduler.core`` refer
here). The *scheduling thread* — whoever calls ``run``, ``run_until_idle``, ``schedule_one``
or ``drain`` — alone touches the cache, the queue, the nominator, the waiting pods' registry,
the plugins' state (the device ledger included, through the event handlers and
Reserve/Unreserve) and the core's bookkeeping (``_binding``, ``_deferred``,
``_deleted_while_binding``, ``_deleted_uids``, ``_in_flight``, ``_binds_queued``,
``failures``, ``preemptions``, ``queue_stats``). A *bind worker* (a thread of ``_binder``)
runs only what this module and the read-backs submit, and may touch only: the profile's
WaitOnPermit/PreBind/Bind/PostBind for its own pod, the cluster port (the bind, reads of the
pod, its Scheduled event), ``_closing`` (read), ``_read_back[uid]`` for its own pod (written
*before* its outcome is queued) and the inbox (``BindOutcome``/``Call`` messages);
``_bind_futures`` and ``_pending_io`` are shared under their locks. Everything else a worker
learns goes back through the inbox and is applied between cycles (``scheduler.core.outcomes``),
so a cycle always sees a consistent snapshot and a reservation is released only on the scheduling
thread, and only when nothing of ours can still hold the card: when in doubt, hold it.

Outcomes: "bound" (a 201, or a read-back showing this UID on our node), "failed" (certainly
not bound: retry), "gone" (deleted, re-created or bound elsewhere), "fenced" (not sent),
"rejected" (a Permit verdict) or "unknown" (uncertain, and the pod could not be read before
the scheduler stopped: keep everything). A lost answer or a 409 is settled by reading the
pod back (``_resolve``), never by a timer.
"""

from __future__ import annotations

from concurrent.futures import Future

from apis.core import Pod
from scheduler.core.base import BindOutcome, SchedulerBase, log
from scheduler.core.types import Placement
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.interfaces import BindError, QueuedPodInfo
from scheduler.framework.runtime import Framework
from scheduler.framework.status import Code, Status
from scheduler.framework.waiting import PERMIT_TIMED_OUT_KEY, WaitingPod

RESOLVE_BACKOFF = (0.2, 5.0)
"""First and largest pause between reads of a pod whose bind outcome is uncertain."""


class BindingCycle(SchedulerBase):
    """The worker-thread half of binding (see the ownership rule above)."""

    def _binding_cycle(
        self,
        fwk: Framework,
        state: CycleState,
        qpi: QueuedPodInfo,
        assumed: Pod,
        waiting: WaitingPod | None,
        started: float,
        placed: Future[Placement] | None = None,
    ) -> None:
        node = assumed.node_name
        status: Status | None = None
        nominated = False
        try:
            if waiting is not None:
                nominated = self._nominate_while_waiting(fwk, assumed)
                status = waiting.wait()  # it stays registered until its outcome is applied
                if waiting.timed_out_plugin:
                    state.write(PERMIT_TIMED_OUT_KEY, waiting.timed_out_plugin)
            if status is None and self._closing.is_set():
                fenced = BindError("scheduler stopping: bind not sent", fenced=True)
                status = Status(Code.ERROR, (str(fenced),), fenced)
            if status is None:
                status = fwk.run_pre_bind(state, assumed, node)
            if status is None:
                status = fwk.run_bind(state, assumed, node)
            if status is None:
                fwk.run_post_bind(state, assumed, node)
        except Exception as exc:  # never lose a pod to a bug in the binding cycle
            status = Status(Code.ERROR, (str(exc),), exc)
        resolution = self._resolve(assumed, status)
        landed = resolution == "bound" and status is not None  # read back: bound, this UID
        if resolution == "bound" and placed is None:
            self._record_scheduled(fwk, assumed)
        self._inbox.put(
            BindOutcome(
                fwk, state, qpi, assumed, status, started, resolution, waiting is None, placed,
                landed, nominated,
            )
        )

    def _nominate_while_waiting(self, fwk: Framework, assumed: Pod) -> bool:
        """Before a Permit wait, tell the cluster where the pod is going: kube-scheduler
        v1.37 writes ``status.nominatedNodeName`` for a pod that waits at Permit
        (NominatedNodeNameForExpectation), which the cluster autoscaler reads so as not to
        take the node away while a gang gathers. A failed write is logged, never fatal (as
        there); a fenced one sends nothing. True when the write was sent and answered."""
        if assumed.nominated_node_name == assumed.node_name:
            return False  # a preemption nominated it there already
        try:
            fwk.handle.client.set_nominated_node(assumed, assumed.node_name)
        except Exception as exc:
            log.info("nomination before the Permit wait not written", pod=assumed.key,
                     error=str(exc))  # fmt: skip
            return False
        return True

    def _record_scheduled(self, fwk: Framework, assumed: Pod) -> None:
        """The Scheduled event, written by the bind worker as kube-scheduler's binding cycle
        writes it (not one more task on the pool per pod); a failure is logged, never raised."""
        try:
            fwk.handle.client.record_event(
                assumed,
                "Normal",
                "Scheduled",
                f"Successfully assigned {assumed.key} to {assumed.node_name}",
            )
        except Exception as exc:  # reporting must never break binding
            log.warning("cluster write failed", action="record_event", error=str(exc))

    def _resolve(self, assumed: Pod, status: Status | None) -> str:
        """What the binding cycle did, in the cluster's terms (worker thread).

        "bound" (the pod is bound to our node), "failed" (certainly not bound: retry),
        "gone" (deleted, re-created or bound elsewhere: nothing to retry), "fenced" (not sent:
        leadership lost or stopping), "rejected" (a Permit verdict), or "unknown" (uncertain
        and the pod could not be read before the scheduler stopped: keep everything)."""
        if status is None:
            return "bound"  # 201; on whom (v1.20 binds by name) only matters if it is deleted
        err = status.error
        if not isinstance(err, BindError):
            return "rejected" if status.is_rejected else "failed"
        if err.gone:
            return "gone"
        if err.fenced:
            return "fenced"
        if not err.uncertain:
            return "failed"
        pause = RESOLVE_BACKOFF[0]
        while True:
            try:
                current = self.cluster.lookup_pod(assumed)
            except Exception as exc:  # the API is unreachable: the answer is still unknown
                log.info(
                    "bind outcome unknown, reading the pod again", pod=assumed.key, error=str(exc)
                )
                if self._closing.wait(pause):
                    return "unknown"
                pause = min(RESOLVE_BACKOFF[1], pause * 2)
                continue
            if current is not None and current.node_name:
                # Bound: by our bind, by a stale bind of ours that landed on a same-name
                # successor (v1.20 binds by name), or by someone else's. Whichever, the cards
                # its annotation names are taken now: the ledger learns them before our
                # reservation goes, as the watch may bring the pod much later.
                self._read_back[assumed.uid] = current
                same = current.uid == assumed.uid and current.node_name == assumed.node_name
                return "bound" if same else "gone"
            if current is None or current.uid != assumed.uid:
                return "gone"
            return "failed"

    def _where_it_landed(self, assumed: Pod) -> str:
        """A 201 for a pod since deleted (worker thread): "successor" when the pod of that name
        now is another incarnation, bound (maybe by that very bind: its allocation is then
        ours; the ledger learns it before the old reservation goes), else "bound"; "unknown"
        when the API could not be read before the scheduler stopped."""
        pause = RESOLVE_BACKOFF[0]
        while True:
            try:
                current = self.cluster.lookup_pod(assumed)
            except Exception as exc:
                log.info("reading a re-created pod's bind target", pod=assumed.key, error=str(exc))
                if self._closing.wait(pause):
                    return "unknown"
                pause = min(RESOLVE_BACKOFF[1], pause * 2)
                continue
            if current is not None and current.uid != assumed.uid and current.node_name:
                self._read_back[assumed.uid] = current
                return "successor"
            return "bound"

    def _bind_done(self, future: Future[None]) -> None:
        with self._bind_lock:
            self._bind_futures.discard(future)

