"""The scheduling cycle (kube-scheduler's schedulingCycle), on the scheduling thread: PreFilter
→ Filter with node sampling → PostFilter when nothing fits → PreScore/Score/Normalize → select
(ties broken by the seedable generator) → assume → Reserve → Permit, then the pod goes to the
binding cycle on a worker. ``place`` runs the same Filter/Reserve/Permit for a node chosen
elsewhere (the extender's bind verb). Who may touch what: the ownership rule in
``scheduler.core.binding_cycle``.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

import numpy as np

from apis.core import Pod
from apis.gang import gang_marker
from scheduler.config import num_feasible_nodes_to_find
from scheduler.core.base import GANG_PLUGIN, log
from scheduler.core.binding_cycle import BindingCycle
from scheduler.core.types import Placement, Preemption
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.interfaces import QueuedPodInfo
from scheduler.framework.runtime import Framework
from scheduler.framework.status import Code, Status
from scheduler.framework.types import Diagnosis, FitError, NodeStatuses, SlotNodes
from scheduler.framework.waiting import WaitingPod

PLUGIN_METRICS_SAMPLE_PERCENT = 10


class SchedulingCycle(BindingCycle):
    """Schedules one pod up to its binding cycle (scheduling thread)."""

    def _schedule(self, fwk: Framework, qpi: QueuedPodInfo) -> None:
        pod = qpi.pod
        start = time.perf_counter()  # attempt duration: algorithm + binding, as kube counts
        state = CycleState()
        state.record_metrics = self.rng.randrange(100) < PLUGIN_METRICS_SAMPLE_PERCENT
        cycle = self.queue.scheduling_cycle
        if fwk.name not in self.gang_profiles and gang_marker(pod):
            # Bound member by member, a gang would be the opposite of what it asks for.
            message = (
                f"pod belongs to gang {gang_marker(pod)}, but profile {fwk.name} does not enable "
                f"the {GANG_PLUGIN} plugin: enable it at queueSort (in place of PrioritySort), "
                "preFilter, reserve and permit, or remove the pod's gang annotation/label"
            )
            self._fail(fwk, qpi, message, set(), cycle)
            self.observer.attempt("unschedulable", fwk.name, time.perf_counter() - start)
            return
        try:
            node_name = self._select_node(fwk, state, pod)
        except FitError as err:
            self._fail(
                fwk,
                qpi,
                err.message,
                err.diagnosis.unschedulable_plugins,
                cycle,
                nominated=err.diagnosis.nominated_node,
            )
            self.observer.attempt("unschedulable", fwk.name, time.perf_counter() - start)
            if self._log_decisions:
                log.info(
                    "unschedulable",
                    pod=pod.key,
                    cycle=cycle,
                    attempts=qpi.attempts,
                    reason=err.message,
                )
            return
        except _CycleError as err:
            self._fail(fwk, qpi, err.status.message, set(), cycle, error=True)
            self.observer.attempt("error", fwk.name, time.perf_counter() - start)
            if self._log_decisions:
                log.warning("scheduling error", pod=pod.key, cycle=cycle, error=err.status.message)
            return

        if self._log_decisions:
            log.info("scheduled", pod=pod.key, node=node_name, cycle=cycle, attempts=qpi.attempts)
        status = self._reserve_and_bind(fwk, state, qpi, node_name, start)
        if status is not None:
            self._fail_status(fwk, qpi, status, cycle)
            self.observer.attempt(_result_of(status), fwk.name, time.perf_counter() - start)

    def _reserve_and_bind(
        self,
        fwk: Framework,
        state: CycleState,
        qpi: QueuedPodInfo,
        node_name: str,
        start: float,
        placed: Future[Placement] | None = None,
    ) -> Status | None:
        """Assume → Reserve → Permit, then hand the pod to the binding cycle; the Reserve or
        Permit status when the pod did not get that far (everything undone)."""
        assumed = qpi.pod.on_node(node_name)
        self.cache.assume_pod(assumed)
        self.nominator.remove(assumed.uid)
        status = fwk.run_reserve(state, assumed, node_name)
        if status is not None:
            fwk.run_unreserve(state, assumed, node_name)
            self.cache.forget_pod(assumed)
            return status
        status, waits = fwk.run_permit(state, assumed, node_name)
        if status is not None and status.code != Code.WAIT:
            fwk.run_unreserve(state, assumed, node_name)
            self.cache.forget_pod(assumed)
            return status
        waiting = None
        if waits:
            waiting = WaitingPod(assumed, waits)
            self.waiting_pods.add(waiting)
        else:
            self._binds_queued += 1  # pods waiting on Permit do not count against the bound
        self._in_flight += 1
        self._binding.add(assumed.uid)
        future = self._binder.submit(
            self._binding_cycle, fwk, state, qpi, assumed, waiting, start, placed
        )
        with self._bind_lock:
            self._bind_futures.add(future)
        future.add_done_callback(self._bind_done)
        return None

    def place(self, profile: str, pod: Pod, node_name: str) -> Future[Placement]:
        """Bind ``pod`` to ``node_name``, a node chosen elsewhere (the extender's bind verb),
        through this scheduler's own cycle: PreFilter and Filter on that node against the
        caches and the reservations of every bind in flight, then assume, Reserve, Permit and
        the binding cycle with its fencing and outcome resolution. Callable from any thread;
        the future has the outcome once the bind's outcome is known. A pod already assumed or
        bound here, or a node that no longer fits, is answered without a write."""
        placed: Future[Placement] = Future()

        def attempt() -> None:
            fwk = self.profiles.get(profile)
            if fwk is None:
                placed.set_result(Placement("failed", f"no profile {profile!r}"))
                return
            if self._closing.is_set():
                placed.set_result(Placement("fenced", "scheduler stopping"))
                return
            if self.cache.get_pod(pod) is not None or pod.uid in self._binding:
                placed.set_result(Placement("failed", f"pod {pod.key} is already being bound"))
                return
            if pod.uid in self._deleted_uids:
                # Read before a delete we have applied: no delete will come again to release
                # what we would reserve, and a v1.20 bind would land on a same-name successor.
                placed.set_result(Placement("gone", f"pod {pod.key} (uid {pod.uid}) was deleted"))
                return
            start = time.perf_counter()
            state = CycleState()
            status = self._fit_on(fwk, state, pod, node_name)
            if status is None:
                qpi = QueuedPodInfo(pod, self.clock.now(), attempts=1)
                status = self._reserve_and_bind(fwk, state, qpi, node_name, start, placed)
            if status is not None:
                resolution = "failed" if status.code == Code.ERROR else "unschedulable"
                placed.set_result(Placement(resolution, status.message))

        self.call_soon(attempt)
        return placed

    def _fit_on(self, fwk: Framework, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        """PreFilter and Filter for one named node (scheduling thread)."""
        info = self.cache.snapshot.get(node_name)
        if info is None:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (f"node {node_name} not found",))
        status = fwk.run_pre_filter(state, pod)
        if status is None:
            status = fwk.run_filter(state, pod, info)
        return None if status is None or status.is_success else status

    def _select_node(self, fwk: Framework, state: CycleState, pod: Pod) -> str:
        snapshot = self.cache.snapshot
        num_nodes = snapshot.num_nodes
        if num_nodes == 0:
            raise FitError(pod, 0, Diagnosis())
        status = fwk.run_pre_filter(state, pod)
        if status is not None:
            if status.code == Code.ERROR:
                raise _CycleError(status)
            slots = snapshot.live_slots()
            every_node = NodeStatuses(
                snapshot, {}, [(slots, np.zeros(len(slots), np.int64), [status])]
            )  # as kube-scheduler: every node has the PreFilter's status
            diagnosis = Diagnosis(
                node_to_status=every_node,
                pre_filter_msg=status.message,
                unschedulable_plugins={status.plugin},
            )
            self._post_filter(fwk, state, pod, diagnosis)
            raise FitError(pod, num_nodes, diagnosis)

        percentage = fwk.profile.percentage_of_nodes_to_score
        if percentage is None:
            percentage = self.config.percentage_of_nodes_to_score
        to_find = num_feasible_nodes_to_find(percentage, num_nodes)
        outcome = fwk.find_feasible(state, pod, snapshot, to_find, self._next_start_index)
        self._next_start_index = (self._next_start_index + outcome.processed) % num_nodes
        feasible = outcome.feasible
        if len(feasible) == 0:
            node_to_status = outcome.diagnose()
            error = node_to_status.first_error()
            if error is not None:
                raise _CycleError(error)
            diagnosis = Diagnosis(
                node_to_status=node_to_status, unschedulable_plugins=node_to_status.plugins()
            )
            self._post_filter(fwk, state, pod, diagnosis)
            raise FitError(pod, num_nodes, diagnosis)
        if len(feasible) == 1:
            return snapshot.info(int(feasible[0])).name

        status = fwk.run_pre_score(state, pod, SlotNodes(snapshot, feasible))
        if status is not None:
            raise _CycleError(status)
        if not fwk.has_score_plugins(state):
            return snapshot.info(int(feasible[0])).name
        totals = fwk.run_score(state, pod, snapshot, feasible)
        if isinstance(totals, Status):
            raise _CycleError(totals)
        best = np.flatnonzero(totals == totals.max())
        pick = int(best[0]) if len(best) == 1 else int(best[self.rng.randrange(len(best))])
        return snapshot.info(int(feasible[pick])).name

    def _post_filter(
        self, fwk: Framework, state: CycleState, pod: Pod, diagnosis: Diagnosis
    ) -> None:
        if not fwk.plugins_at("post_filter"):
            return
        result, status = fwk.run_post_filter(state, pod, diagnosis.node_to_status)
        if status is not None and status.code == Code.ERROR:
            raise _CycleError(status)
        if status is not None and status.message:
            diagnosis.post_filter_msg = status.message
        victims = None
        if result is not None:
            # The status is written when it may say otherwise: the record we hold says so, or
            # the nomination we knew (ours, maybe not yet echoed by the watch) differs. A
            # preemptor that finds no victims any more gives its nomination back (kube >= 1.22).
            known = self.nominator.node_of(pod.uid)
            if result.nominated_node != pod.nominated_node_name or result.nominated_node != known:
                diagnosis.nominated_node = result.nominated_node
            self.nominator.add(pod, result.nominated_node)
            if result.nominated_node:
                victims = len(result.victims)
                self.preemptions.append(Preemption(pod, result.nominated_node, result.victims))
                if self._log_decisions:
                    log.info(
                        "preempted",
                        pod=pod.key,
                        node=result.nominated_node,
                        victims=[v.key for v in result.victims],
                    )
        self.observer.preemption(victims)


class _CycleError(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status


def _result_of(status: Status) -> str:
    return "error" if status.code == Code.ERROR else "unschedulable"
