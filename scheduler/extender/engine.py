"""The extender's answers, computed by the scheduler's own core on its scheduling thread.

Role: kube-scheduler picks the node; this module answers its questions about our devices with
the same caches, device ledger and plugins ``koord-scheduler run`` uses (a second front end of
one core, not a copy): ``filter`` and ``prioritize`` run the profile's PreFilter / Filter /
PreScore / Score against the snapshot that already holds the reservations of every bind in
flight; ``bind`` is ``Scheduler.place`` — Filter on kube-scheduler's node, assume, Reserve (the
cards are chosen here), one ``pods/binding`` write with the annotations, and the outcome
resolved exactly as the scheduler's own binds are (fencing, lost answers, re-created pods).

Invariants:

- Every question runs on the scheduling thread (``Scheduler.call_soon``), one at a time, so
  two binds to the same card are serialized through the ledger: a burst never over-commits.
- Only the leader answers: on a standby every verb answers an error (kube-scheduler retries
  the pod), and the kube adapter's fence refuses a bind write anyway.
- A bind that cannot be completed (the node no longer fits, the pod is gone or re-created, a
  write failed) answers an error after releasing what it reserved; an outcome not known in time
  answers an error while the reservation stays until the outcome is known (never released on a
  timer).
- A bind binds only the UID it names, read from the API server (``lookup_pod``) just before:
  a pod deleted (and re-created under its name) since kube-scheduler filtered it answers an
  error with no write and no reservation, even while our informer has not seen the delete.
- kube-scheduler's nominations (its pods are not ours by schedulerName) are tracked by the
  core's nominator, so Filter and Reserve keep the room of its preemptors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Final, TypeVar

import numpy as np

from apis.core import Pod
from scheduler.core import Placement, Scheduler
from scheduler.extender.protocol import (
    MAX_EXTENDER_PRIORITY,
    BindingArgs,
    FilterResult,
    PreemptionArgs,
)
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import Change
from scheduler.framework.status import Code
from scheduler.framework.types import SlotNodes

__all__ = ["ExtenderEngine", "NotLeader"]

T = TypeVar("T")

DEVICE_FILTERS: Final = ("DeviceShare",)
"""The Filter plugins the preempt verb re-runs with the victims removed (kube-scheduler has
already judged everything else it knows about)."""


class NotLeader(RuntimeError):
    """This replica is a standby; kube-scheduler will retry (the Service routes to the leader)."""


class ExtenderEngine:
    def __init__(
        self,
        sched: Scheduler,
        profile: str,
        *,
        leading: Callable[[], bool],
        lookup_pod: Callable[[Pod], Pod | None],
        timeout: float = 30.0,
    ) -> None:
        if profile not in sched.profiles:
            raise ValueError(f"no profile named {profile!r}")
        self._sched = sched
        self._profile = profile
        self._leading = leading
        self._lookup = lookup_pod
        self._timeout = timeout
        sched.profiles[profile].handle.add_event_handler(self._track_nomination)

    # -- verbs ------------------------------------------------------------------------------------

    def filter(self, pod: Pod, node_names: Sequence[str]) -> FilterResult:
        self._check_leader()
        return self._on_scheduler(lambda: self._filter_now(pod, node_names))

    def prioritize(self, pod: Pod, node_names: Sequence[str]) -> list[tuple[str, int]]:
        self._check_leader()
        return self._on_scheduler(lambda: self._prioritize_now(pod, node_names))

    def bind(self, args: BindingArgs) -> str:
        """ "" when bound, else the error kube-scheduler gets (it then retries the pod)."""
        self._check_leader()
        pod = self._pod_for(args)
        if isinstance(pod, str):
            return pod
        placed: Future[Placement] = self._sched.place(self._profile, pod, args.node)
        try:
            outcome = placed.result(timeout=self._timeout)
        except FutureTimeout:
            return f"binding {pod.key} to {args.node}: no outcome within {self._timeout:g}s"
        if outcome.bound:
            return ""
        return f"binding {pod.key} to {args.node} failed ({outcome.resolution}): {outcome.message}"

    def preempt(self, args: PreemptionArgs) -> dict[str, tuple[tuple[str, ...], int]]:
        """The candidate nodes on which removing kube-scheduler's victims frees the devices
        the pod needs, with those victims (nodes where it does not are dropped)."""
        self._check_leader()
        return self._on_scheduler(lambda: self._preempt_now(args))

    # -- on the scheduling thread -----------------------------------------------------------------

    def _filter_now(self, pod: Pod, node_names: Sequence[str]) -> FilterResult:
        fwk = self._sched.profiles[self._profile]
        snapshot = self._sched.cache.snapshot
        result = FilterResult()
        state = CycleState()
        status = fwk.run_pre_filter(state, pod)
        if status is not None and not status.is_success:
            if status.code == Code.ERROR:
                result.error = status.message
                return result
            target = (
                result.unresolvable
                if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
                else result.failed
            )
            for name in node_names:
                target[name] = status.message
            return result
        outcome = fwk.find_feasible(state, pod, snapshot, max(1, snapshot.num_nodes), 0)
        feasible = {snapshot.info(int(s)).name for s in outcome.feasible}
        statuses = None
        for name in node_names:
            if name in feasible:
                result.node_names.append(name)
                continue
            if snapshot.get(name) is None:
                result.unresolvable[name] = f"node {name} is not known to koord-scheduler"
                continue
            if statuses is None:
                statuses = outcome.diagnose()
            try:
                node_status = statuses[name]
            except KeyError:
                result.failed[name] = "node(s) did not fit"
                continue
            if node_status.code == Code.ERROR:
                result.error = node_status.message
            elif node_status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                result.unresolvable[name] = node_status.message
            else:
                result.failed[name] = node_status.message
        return result

    def _prioritize_now(self, pod: Pod, node_names: Sequence[str]) -> list[tuple[str, int]]:
        fwk = self._sched.profiles[self._profile]
        snapshot = self._sched.cache.snapshot
        slots = [info.slot for n in node_names if (info := snapshot.get(n)) is not None]
        zero = [(n, 0) for n in node_names]
        state = CycleState()
        if not slots or fwk.run_pre_filter(state, pod) is not None:
            return zero
        arr = np.asarray(slots, dtype=np.int64)
        if fwk.run_pre_score(state, pod, SlotNodes(snapshot, arr)) is not None:
            return zero
        if not fwk.has_score_plugins(state):
            return zero
        totals = fwk.run_score(state, pod, snapshot, arr)
        if not isinstance(totals, np.ndarray):
            return zero
        top = int(totals.max()) if len(totals) else 0
        by_name = {
            snapshot.info(int(s)).name: (int(t) * MAX_EXTENDER_PRIORITY // top if top > 0 else 0)
            for s, t in zip(arr, totals, strict=True)
        }
        return [(n, by_name.get(n, 0)) for n in node_names]

    def _preempt_now(self, args: PreemptionArgs) -> dict[str, tuple[tuple[str, ...], int]]:
        fwk = self._sched.profiles[self._profile]
        snapshot = self._sched.cache.snapshot
        filters = [p for p in DEVICE_FILTERS if p in fwk.plugins_at("filter")]
        kept: dict[str, tuple[tuple[str, ...], int]] = {}
        for node, (uids, violations) in args.victims.items():
            info = snapshot.get(node)
            if info is None:
                continue
            state = CycleState()
            if fwk.run_pre_filter(state, args.pod) is not None:
                continue
            wanted = set(uids)
            for victim in list(info.pods.values()):
                if victim.uid in wanted:
                    fwk.run_pre_filter_remove_pod(state, args.pod, victim, info)
            fits = all(
                (s := fwk.plugin(name).filter(state, args.pod, info)) is None or s.is_success
                for name in filters
            )
            if fits:
                kept[node] = (uids, violations)
        return kept

    def _track_nomination(self, change: Change) -> None:
        """kube-scheduler's nominations count here as the scheduler's own (scheduling thread):
        the pods it preempts for are not ours by schedulerName, so the core would not track
        them, yet Filter and Reserve must keep their room (kube's rule)."""
        new = change.new
        if change.kind != "Pod" or new is None or new.assigned or new.terminal:
            return  # gone or bound: the core has dropped any nomination already
        if new.scheduler_name in self._sched.profiles:
            return  # the core tracks its own
        old = change.old if change.old is not None and change.old.uid == new.uid else None
        self._sched.nominator.update(old, new)

    # -- helpers ----------------------------------------------------------------------------------

    def _check_leader(self) -> None:
        if not self._leading():
            raise NotLeader("this koord-scheduler extender is not the leader")

    def _on_scheduler(self, fn: Callable[[], T]) -> T:
        try:
            return self._sched.call_soon(fn).result(timeout=self._timeout)
        except FutureTimeout:
            raise TimeoutError(
                f"the scheduling thread did not answer within {self._timeout:g}s"
            ) from None

    def _pod_for(self, args: BindingArgs) -> Pod | str:
        """The pod the bind names, as the API server has it now; else the error to answer.

        Read from the API server, not from the filter request or our informer: the pod may have
        been deleted (and re-created under its name) since kube-scheduler filtered it, and the
        informer may not have seen that yet. Binding then would hand a v1.20 API server (it
        binds by name) the successor, and the old UID's reservation would never be released."""
        key = f"{args.namespace}/{args.name}"
        try:
            pod = self._lookup(Pod(namespace=args.namespace, name=args.name, uid=args.uid))
        except Exception as exc:  # the API is unreachable: kube-scheduler retries
            return f"reading pod {key}: {exc}"
        if pod is None:
            who = f"pod {key} (uid {args.uid})" if args.uid else f"pod {key}"
            return f"{who} no longer exists: not bound"
        if args.uid and pod.uid != args.uid:
            return f"pod {key} was re-created (uid {pod.uid}, not {args.uid}): not bound"
        if pod.node_name:
            return f"pod {key} is already bound to {pod.node_name}"
        return pod
