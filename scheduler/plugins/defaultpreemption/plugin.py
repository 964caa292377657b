"""DefaultPreemption's PostFilter: kube-scheduler's preemption rules, with card-exact victims.

The rules (kube-scheduler ``defaultpreemption`` / ``framework/preemption``; v1.20 behaviour,
current where it fixed bugs):

1. Eligibility: ``preemptionPolicy: Never`` never preempts; a pod whose nominated node still
   has a lower-priority pod terminating waits for it ("not eligible due to a terminating pod on
   the nominated node."), unless that node now rejects it unresolvably.
2. Candidates: every node whose Filter status is not UnschedulableAndUnresolvable ("Preemption
   is not helpful for scheduling" otherwise). Starting at a random offset, nodes are dry-run
   until ``max(minCandidateNodesPercentage % of them, minCandidateNodesAbsolute)`` candidates
   are found (all of them when that is every node, and then from the first node, so the
   result does not depend on chance).
3. Dry run on one node (``select_victims``): on copies of the cycle state and the node, remove
   every pod of lower priority through each PreFilter plugin's ``RemovePod`` (DeviceShare
   frees exactly the shares those pods hold, on their cards), run the Filter plugins (nominated
   pods of higher priority included); if the pod fits, reprieve victims one at a time — those
   whose eviction would violate a PodDisruptionBudget first, then the rest, each group from the
   most important down — adding each back (``AddPod``) and keeping it when the pod still fits.
   What is left is minimal: adding back any single victim breaks the fit.
4. The node: a node needing no victim wins at once; else fewest PDB violations, then the
   lowest highest-victim priority, the smallest sum of priorities, the fewest victims, the
   latest start among the highest-priority victims, then the first found.
5. Evict: a victim parked at Permit is rejected (it holds a reservation, not a running pod);
   every other victim is deleted with its UID as precondition and gets a ``Preempted`` event
   naming the preemptor. Pods of lower priority nominated to that node lose their nomination.
   The pod is nominated to the node (the scheduler records it and patches the status).

Invariants: runs on the scheduling thread; never changes the ledger, the snapshot or a
NodeInfo the snapshot owns (the dry run works on copies); a failed eviction returns an Error
status (the pod is retried) and nominates nothing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apis.core import PREEMPT_NEVER, Pod
from apis.disruption import PodDisruptionBudget
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import PDB_KIND, Change
from scheduler.framework.interfaces import Handle, PluginsRunner, PostFilterResult
from scheduler.framework.status import Code, Status, error, unresolvable, unschedulable
from scheduler.framework.types import NodeInfo, NodeStatuses, counts_message
from scheduler.plugins.defaultpreemption.args import DefaultPreemptionArgs

__all__ = [
    "NAME",
    "NOT_HELPFUL",
    "NO_VICTIMS",
    "Candidate",
    "DefaultPreemption",
    "pick_one_node",
    "split_by_pdb",
]

NAME = "DefaultPreemption"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
_MAX_INT32 = 2**31 - 1
_NO_START = "9999"
"""A pod without a start time counts as started now (kube's ``GetPodStartTime``): latest."""


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    victims: tuple[Pod, ...]
    """Most important first."""
    pdb_violations: int = 0


def _start(pod: Pod) -> str:
    return pod.start_time or _NO_START


def _importance(pod: Pod) -> tuple[int, str]:
    """Sort key, most important first: higher priority, then earlier start."""
    return (-pod.priority, _start(pod))


def split_by_pdb(
    pods: Sequence[Pod], pdbs: Sequence[PodDisruptionBudget]
) -> tuple[list[Pod], list[Pod]]:
    """kube's ``filterPodsWithPDBViolation``: (violating, non-violating), order kept. Each
    budget's ``disruptionsAllowed`` is spent by the pods it covers, in order; a pod it already
    lists as disrupted spends nothing."""
    allowed = [pdb.disruptions_allowed for pdb in pdbs]
    violating: list[Pod] = []
    fine: list[Pod] = []
    for pod in pods:
        violated = False
        if pod.labels:
            for i, pdb in enumerate(pdbs):
                if not pdb.matches(pod) or pod.name in pdb.disrupted_pods:
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else fine).append(pod)
    return violating, fine


def pick_one_node(candidates: Sequence[Candidate]) -> Candidate | None:
    """kube's ``pickOneNodeForPreemption`` over candidates in the order they were found."""
    if not candidates:
        return None
    for c in candidates:
        if not c.victims:
            return c

    def key(c: Candidate) -> tuple[int, int, int, int, str]:
        top = c.victims[0].priority
        earliest = min(_start(p) for p in c.victims if p.priority == top)
        total = sum(p.priority + _MAX_INT32 + 1 for p in c.victims)
        # max() of the negated start would need a reversible string; sort twice instead.
        return (c.pdb_violations, top, total, len(c.victims), earliest)

    best = min(candidates, key=lambda c: key(c)[:4])
    tied = [c for c in candidates if key(c)[:4] == key(best)[:4]]
    latest = max(key(c)[4] for c in tied)
    return next(c for c in tied if key(c)[4] == latest)


class DefaultPreemption:
    """The PostFilter plugin (see the module docstring)."""

    name = NAME

    def __init__(
        self,
        handle: Handle,
        args: DefaultPreemptionArgs | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.handle = handle
        self.args = args if args is not None else DefaultPreemptionArgs()
        self._rng = rng or random.Random()
        self._pdbs: dict[str, PodDisruptionBudget] = {}
        handle.add_event_handler(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.kind != PDB_KIND:
            return
        if change.old is not None:
            self._pdbs.pop(change.old.key, None)
        if change.new is not None:
            self._pdbs[change.new.key] = change.new

    def pdbs(self) -> list[PodDisruptionBudget]:
        return list(self._pdbs.values())

    @property
    def _runner(self) -> PluginsRunner:
        runner = self.handle.runner
        if runner is None:
            raise RuntimeError("DefaultPreemption needs the profile's runner")
        return runner

    # -- PostFilter -------------------------------------------------------------------------

    def post_filter(
        self, state: CycleState, pod: Pod, node_to_status: Mapping[str, Status]
    ) -> tuple[PostFilterResult | None, Status | None]:
        result, status = self._preempt(state, pod, node_to_status)
        if status is not None and status.message:
            status = Status(status.code, (f"preemption: {status.message}",), status.error)
        return result, status

    def _preempt(
        self, state: CycleState, pod: Pod, node_to_status: Mapping[str, Status]
    ) -> tuple[PostFilterResult | None, Status | None]:
        ineligible = self._ineligible(pod, node_to_status)
        if ineligible:
            return None, unschedulable(ineligible)
        snapshot = self.handle.snapshot
        num_nodes = snapshot.num_nodes
        lowest = snapshot.lowest_priority()
        if lowest is None or lowest >= pod.priority:
            # No pod anywhere has a lower priority: nothing to dry-run (the common case of a
            # full cluster of equal priorities costs no per-node work).
            return self._nothing_to_preempt(pod, node_to_status, num_nodes)
        potential = [
            info
            for info in snapshot.node_infos()
            if (s := node_to_status.get(info.name)) is None
            or s.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        ]
        not_helpful = num_nodes - len(potential)
        if not potential:
            return PostFilterResult(), unschedulable(
                counts_message(num_nodes, {NOT_HELPFUL: not_helpful})
            )
        candidates, statuses = self.dry_run(state, pod, potential)
        best = pick_one_node(candidates)
        if best is None:
            counts: dict[str, int] = {NOT_HELPFUL: not_helpful}
            for status in statuses.values():
                for reason in status.reasons:
                    counts[reason] = counts.get(reason, 0) + 1
            return PostFilterResult(), unschedulable(counts_message(num_nodes, counts))
        failure = self._evict(pod, best)
        if failure is not None:
            return None, failure
        return PostFilterResult(best.node, best.victims), None

    def _ineligible(self, pod: Pod, node_to_status: Mapping[str, Status]) -> str:
        """kube's ``PodEligibleToPreemptOthers``: the reason ``pod`` may not preempt, or ""."""
        if pod.preemption_policy == PREEMPT_NEVER:
            return NEVER
        nominated = self.handle.nominator.node_of(pod.uid) or pod.nominated_node_name
        if not nominated:
            return ""
        status = node_to_status.get(nominated)
        if status is not None and status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            return ""
        info = self.handle.snapshot.get(nominated)
        if info is not None and any(
            p.terminating and p.priority < pod.priority for p in info.pods.values()
        ):
            return TERMINATING
        return ""

    def _nothing_to_preempt(
        self, pod: Pod, node_to_status: Mapping[str, Status], num_nodes: int
    ) -> tuple[PostFilterResult | None, Status | None]:
        def unresolvable_status(s: Status) -> bool:
            return s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE

        if isinstance(node_to_status, NodeStatuses):
            not_helpful = node_to_status.count(unresolvable_status)
        else:
            not_helpful = sum(1 for s in node_to_status.values() if unresolvable_status(s))
        counts = {NOT_HELPFUL: not_helpful, NO_VICTIMS: num_nodes - not_helpful}
        return PostFilterResult(), unschedulable(counts_message(num_nodes, counts))

    # -- the dry run ------------------------------------------------------------------------

    def dry_run(
        self, state: CycleState, pod: Pod, potential: Sequence[NodeInfo]
    ) -> tuple[list[Candidate], dict[str, Status]]:
        """Candidates (those violating no PDB first) until enough are found, and why the other
        nodes tried are none."""
        n = len(potential)
        wanted = self.args.num_candidates(n)
        offset = 0 if wanted >= n else self._rng.randrange(n)
        pdbs = self.pdbs()
        fine: list[Candidate] = []
        violating: list[Candidate] = []
        statuses: dict[str, Status] = {}
        for i in range(n):
            info = potential[(offset + i) % n]
            if not any(p.priority < pod.priority for p in info.pods.values()):
                statuses[info.name] = unresolvable(NO_VICTIMS)  # no copies for nothing
                continue
            found = self.select_victims(state.clone(), pod, info.copy(), pdbs)
            if isinstance(found, Status):
                statuses[info.name] = found
                continue
            (violating if found.pdb_violations else fine).append(found)
            if fine and len(fine) + len(violating) >= wanted:
                break
        return fine + violating, statuses

    def select_victims(
        self,
        state: CycleState,
        pod: Pod,
        node: NodeInfo,
        pdbs: Sequence[PodDisruptionBudget] = (),
    ) -> Candidate | Status:
        """The minimal victims on ``node`` (a copy: it is changed), or why there are none."""
        runner = self._runner
        lower = sorted(
            (p for p in node.pods.values() if p.priority < pod.priority), key=_importance
        )
        if not lower:
            return unresolvable(NO_VICTIMS)

        def remove(victim: Pod) -> Status | None:
            node.remove_pod(victim)
            return runner.run_pre_filter_remove_pod(state, pod, victim, node)

        def add(victim: Pod) -> Status | None:
            node.add_pod(victim)
            return runner.run_pre_filter_add_pod(state, pod, victim, node)

        for victim in lower:
            status = remove(victim)
            if status is not None:
                return status
        status = runner.run_filter_with_nominated_pods(state, pod, node)
        if status is not None:
            return status
        violating, fine = split_by_pdb(lower, pdbs)
        victims: list[Pod] = []
        violations = 0

        def reprieve(victim: Pod) -> Status | bool:
            status = add(victim)
            if status is not None:
                return status
            if runner.run_filter_with_nominated_pods(state, pod, node) is None:
                return True
            status = remove(victim)
            if status is not None:
                return status
            victims.append(victim)
            return False

        for victim in violating:
            kept = reprieve(victim)
            if isinstance(kept, Status):
                return kept
            if not kept:
                violations += 1
        for victim in fine:
            kept = reprieve(victim)
            if isinstance(kept, Status):
                return kept
        victims.sort(key=_importance)
        return Candidate(node.name, tuple(victims), violations)

    # -- eviction ---------------------------------------------------------------------------

    def _evict(self, pod: Pod, best: Candidate) -> Status | None:
        client = self.handle.client
        for victim in best.victims:
            waiting = self.handle.waiting_pods.get(victim.uid)
            if waiting is not None:
                waiting.reject(NAME, f"preempted by {pod.key}")
                continue
            try:
                client.delete_pod(victim, preemptor=pod)
            except Exception as exc:  # the pod is retried; nothing is nominated
                return error(f"preempting {victim.key} for {pod.key}: {exc}")
            client.record_event(
                victim, "Normal", "Preempted", f"Preempted by {pod.key} on node {best.node}"
            )
        nominator = self.handle.nominator
        for other in nominator.nominated_pods(best.node):
            if other.priority < pod.priority and other.uid != pod.uid:
                nominator.remove(other.uid)
                try:
                    client.set_nominated_node(other, "")
                except Exception as exc:  # the nomination is gone here; the field is cosmetic
                    return error(f"clearing the nomination of {other.key}: {exc}")
        return None
