"""The Coscheduling plugin: gang bookkeeping, queue order, PreFilter, Filter, Score, Reserve
and Permit.

See the package docstring for the contract. State per gang id: the member pods that exist
(for PreFilter's "enough pods created"), the members assumed (reserved and not unreserved),
the members seen bound, whether the gang was ever satisfied (``once-satisfied``) and, for a
gang kept on one node, its node and card plan (``samenode``). Filter and Score act only on
members of such gangs (PreFilter and PreScore Skip them for every other pod).

PodGroups (``scheduling.sigs.k8s.io/v1alpha1``) arrive as ``POD_GROUP_KIND`` changes; a pod
labelled with a pod group takes its spec from the PodGroup when one exists (``apis.gang``).

Timeout (Koordinator's Unreserve): when a member's Permit wait times out (the framework's
``PERMIT_TIMED_OUT_KEY`` in its cycle state), every waiting member of the gang is rejected
(any mode), and every unbound member pod is marked ``gang.scheduling.koordinator.sh/timeout:
"true"`` (one ``annotate_pod`` each, beside the scheduling thread through
``Handle.write_soon``; fenced in the kube adapter) with a ``GangTimeout`` event. PreFilter
rejects marked pods as unresolvable: the gang is retried only when its pods are re-created.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from apis.core import Pod
from apis.gang import (
    ANNOTATION_TIMEOUT,
    LABEL_POD_GROUP_MIN_AVAILABLE,
    MATCH_ONCE_SATISFIED,
    MATCH_ONLY_WAITING,
    MODE_STRICT,
    TIMEOUT_MARK,
    GangSpec,
    GangSpecError,
    PodGroup,
    gang_of,
    spec_of_pod_group,
    timed_out,
)
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    POD_GROUP_ADD,
    POD_GROUP_KIND,
    POD_GROUP_UPDATE,
    UNSCHEDULED_POD_ADD,
    Change,
    ClusterEvent,
)
from scheduler.framework.interfaces import Handle, PreFilterExtensions, QueuedPodInfo
from scheduler.framework.status import SKIP, Code, Status, unresolvable, unschedulable
from scheduler.framework.types import NodeInfo
from scheduler.framework.waiting import PERMIT_TIMED_OUT_KEY, WaitingPod, allow_together
from scheduler.plugins.coscheduling.samenode import PREFERRED_GPUS_KEY, GangPlacement, SameNode

__all__ = ["Coscheduling"]


@dataclass
class _Gang:
    spec: GangSpec
    sort_time: float
    pods: set[str] = field(default_factory=set)  # uids of existing, non-terminal members
    assumed: set[str] = field(default_factory=set)  # reserved, not unreserved
    bound: set[str] = field(default_factory=set)
    satisfied: bool = False
    marked: set[str] = field(default_factory=set)  # uids given the timeout mark
    placement: GangPlacement = field(default_factory=GangPlacement)

    def settle(self) -> None:
        """Forget the node and plan once no member is assumed or bound."""
        if not (self.assumed | self.bound):
            self.placement.node, self.placement.plan = None, ()


_CYCLE_KEY = "Coscheduling/same-node"


@dataclass(frozen=True, slots=True)
class _Cycle:
    """A same-node member's cycle: its gang and the whole GPUs still to place for the gang."""

    gang_id: str
    need: int


class Coscheduling:
    name = "Coscheduling"

    def __init__(self, handle: Handle) -> None:
        self._handle = handle
        self._gangs: dict[str, _Gang] = {}
        self._pod_gang: dict[str, str] = {}  # uid -> gang id
        self._members: dict[str, Pod] = {}  # uid -> the latest record of a gang member
        self._pod_groups: dict[str, PodGroup] = {}  # namespace/name -> PodGroup
        self._same_node = SameNode(handle)
        handle.add_event_handler(self._on_change)

    # -- bookkeeping ------------------------------------------------------------------------------

    def _gang(self, spec: GangSpec) -> _Gang:
        gang = self._gangs.get(spec.id)
        if gang is None:
            gang = _Gang(spec, self._handle.clock.now())
            self._gangs[spec.id] = gang
        else:
            gang.spec = spec  # the newest member's annotations win, as in Koordinator
        return gang

    def _spec(self, pod: Pod) -> GangSpec | None:
        return gang_of(pod, self._pod_groups)

    def _on_pod_group(self, change: Change) -> None:
        if change.new is None:
            group: PodGroup = change.old
            self._pod_groups.pop(group.id, None)
            gang = self._gangs.get(group.id)
            if gang is not None and gang.spec.source == "PodGroup":
                gang.spec = replace(gang.spec, source="labels", needs_pod_group=True)
            return
        group = change.new
        self._pod_groups[group.id] = group
        gang = self._gangs.get(group.id)
        if gang is not None and gang.spec.source != "annotations":
            gang.spec = spec_of_pod_group(group)

    def _on_change(self, change: Change) -> None:
        if change.kind == POD_GROUP_KIND:
            self._on_pod_group(change)
            return
        if change.kind != "Pod":
            return
        if change.new is None:
            self._forget(change.old)
            return
        pod: Pod = change.new
        try:
            spec = self._spec(pod)
        except GangSpecError:
            return  # reported when the pod is scheduled (PreFilter)
        if spec is None:
            return
        if pod.terminating or pod.phase in ("Succeeded", "Failed"):
            self._forget(pod)
            return
        gang = self._gang(spec)
        gang.pods.add(pod.uid)
        self._pod_gang[pod.uid] = spec.id
        self._members[pod.uid] = pod
        if pod.node_name:
            gang.bound.add(pod.uid)
            if spec.same_node and gang.placement.node is None:
                gang.placement.node = pod.node_name

    def _forget(self, pod: Pod) -> None:
        gang_id = self._pod_gang.pop(pod.uid, None)
        self._members.pop(pod.uid, None)
        if gang_id is None:
            return
        gang = self._gangs[gang_id]
        gang.pods.discard(pod.uid)
        gang.marked.discard(pod.uid)
        gang.bound.discard(pod.uid)
        gang.assumed.discard(pod.uid)
        gang.settle()
        waiting = self._handle.waiting_pods.get(pod.uid)
        if waiting is not None:
            waiting.reject(self.name, f"pod {pod.key} was deleted while waiting for its gang")
        if not gang.pods:
            del self._gangs[gang_id]

    def _counted(self, gang: _Gang, rejected: frozenset[str] | set[str] = frozenset()) -> int:
        """Members that count towards min-available; ``rejected``: assumed members whose
        Permit wait was decided rejected (they will never bind)."""
        assumed = gang.assumed - rejected
        if gang.spec.match_policy == MATCH_ONLY_WAITING:
            return len(assumed - gang.bound)
        return len(assumed | gang.bound)

    # -- QueueSort --------------------------------------------------------------------------------

    def _sort_key(self, qpi: QueuedPodInfo) -> tuple[float, str]:
        try:
            spec = self._spec(qpi.pod)
        except GangSpecError:
            spec = None
        if spec is None:
            return qpi.timestamp, qpi.pod.key
        gang = self._gangs.get(spec.id)
        if gang is None:
            gang = self._gang(spec)
        return gang.sort_time, spec.id

    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        """Priority first, then the gang's creation time and id (so a gang's members pop one
        after another), then the member's own queue time."""
        pa, pb = a.pod.priority, b.pod.priority
        if pa != pb:
            return pa > pb
        ka, kb = self._sort_key(a), self._sort_key(b)
        if ka != kb:
            return ka < kb
        return (a.timestamp, a.pod.key) < (b.timestamp, b.pod.key)

    # -- PreFilter --------------------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        try:
            spec = self._spec(pod)
        except GangSpecError as err:
            return unresolvable(f"gang: {err}")
        if spec is None:
            return SKIP  # Filter has nothing to say about a pod outside gangs
        gang = self._gang(spec)
        if pod.uid not in gang.pods:  # not yet seen through an event (e.g. a direct call)
            gang.pods.add(pod.uid)
            self._pod_gang[pod.uid] = spec.id
        if timed_out(pod):
            return unresolvable(
                f"gang {spec.id} timed out ({ANNOTATION_TIMEOUT}={TIMEOUT_MARK}): "
                "re-create its pods to schedule it again"
            )
        for gang_id in spec.groups:
            member = self._gangs.get(gang_id)
            if member is not None and member.spec.needs_pod_group:
                return unschedulable(
                    f"gang {gang_id}: PodGroup {gang_id} not found (create it, or label the "
                    f"pods {LABEL_POD_GROUP_MIN_AVAILABLE})"
                )
            have = len(member.pods) if member is not None else 0
            need = member.spec.min_available if member is not None else 1
            if have < need:
                return unschedulable(
                    f"gang {gang_id} has {have}/{need} pods created (min-available {need})"
                )
        if not spec.same_node:
            return SKIP
        placement = gang.placement
        request = self._same_node.request_of(pod)
        per_member = request.whole_gpus if request is not None else 0
        need = per_member * max(spec.total_number - len(gang.assumed | gang.bound), 1)
        state.write(_CYCLE_KEY, _Cycle(spec.id, need))
        if placement.node is None:
            placement.plans = {}
            placement.planned_on, placement.plan = None, ()
        if need:
            state.write(PREFERRED_GPUS_KEY, self._same_node.preference(placement, pod, need))
        return None

    # -- Filter / Score (gangs kept on one node) ---------------------------------------------------

    def _cycle(self, state: CycleState) -> tuple[_Cycle, _Gang] | None:
        cycle = state.get(_CYCLE_KEY)
        if not isinstance(cycle, _Cycle):
            return None
        gang = self._gangs.get(cycle.gang_id)
        return None if gang is None else (cycle, gang)

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        found = self._cycle(state)
        if found is None:
            return None
        cycle, gang = found
        placement = gang.placement
        if placement.node is not None:
            if node.name == placement.node:
                return None
            return unresolvable(f"gang {cycle.gang_id} stays on node {placement.node}")
        if not cycle.need:
            return None
        cards = placement.plans.get(node.name)
        if cards is None:
            cards = self._same_node.gang_set(pod, node.name, cycle.need)
            placement.plans[node.name] = cards
        if not cards:
            return unschedulable(f"gang {cycle.gang_id} needs {cycle.need} GPUs on one node")
        return None

    def pre_score(self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]) -> Status | None:
        found = self._cycle(state)
        if found is None or found[1].placement.node is not None or not found[0].need:
            return SKIP
        return None

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        found = self._cycle(state)
        if found is None:
            return 0
        cycle, gang = found
        return self._same_node.score(gang.placement, pod, node.name, cycle.need)

    def pre_filter_extensions(self) -> PreFilterExtensions | None:
        return None

    # -- Reserve ----------------------------------------------------------------------------------

    def reserve(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        spec = self._spec(pod)
        if spec is None:
            return None
        gang = self._gang(spec)
        gang.assumed.add(pod.uid)
        placement = gang.placement
        if spec.same_node and placement.node is None:
            placement.node = node_name
            if placement.planned_on != node_name:
                placement.plan = placement.plans.get(node_name, ())
            placement.plans = {}
        return None

    def unreserve(self, state: CycleState, pod: Pod, node_name: str) -> None:
        """A member failed after Reserve: in Strict mode the whole group's waiting members are
        rejected (the framework unreserves each of them in turn)."""
        try:
            spec = self._spec(pod)
        except GangSpecError:
            return
        if spec is None:
            return
        gang = self._gangs.get(spec.id)
        if gang is None:
            return
        if state.get(PERMIT_TIMED_OUT_KEY) == self.name:
            self._timed_out(gang)  # (counting this member among the assumed, as it was)
        gang.assumed.discard(pod.uid)
        gang.settle()
        if spec.mode != MODE_STRICT:
            return
        message = f"gang {spec.id}: member {pod.key} failed, rejecting the gang group (Strict)"
        for waiting in self._handle.waiting_pods:
            try:
                other = self._spec(waiting.pod)
            except GangSpecError:
                continue
            if other is not None and other.id in spec.groups:
                waiting.reject(self.name, message)

    def _timed_out(self, gang: _Gang) -> None:
        """A member's wait timed out: reject the gang's waiting members and mark its unbound
        pods (each once) with Koordinator's timeout annotation, beside the scheduling thread."""
        spec = gang.spec
        have, need = self._counted(gang), spec.min_available
        message = (
            f"gang {spec.id} timed out after waiting {spec.waiting_seconds:g}s with {have}/{need} "
            f"members assumed; its pods are marked {ANNOTATION_TIMEOUT}={TIMEOUT_MARK} and are "
            "not scheduled again until re-created"
        )
        for waiting in self._handle.waiting_pods:
            try:
                other = self._spec(waiting.pod)
            except GangSpecError:
                continue
            if other is not None and other.id == spec.id:
                waiting.reject(self.name, message)
        client = self._handle.client
        mark = {ANNOTATION_TIMEOUT: TIMEOUT_MARK}
        for uid in sorted(gang.pods - gang.bound - gang.marked):
            member = self._members.get(uid)
            if member is None or timed_out(member):
                continue
            gang.marked.add(uid)

            def write(pod: Pod = member) -> None:
                client.record_event(pod, "Warning", "GangTimeout", message)
                client.annotate_pod(pod, mark)

            self._handle.write_soon(write)

    # -- Permit -----------------------------------------------------------------------------------

    def permit(self, state: CycleState, pod: Pod, node_name: str) -> tuple[Status | None, float]:
        spec = self._spec(pod)
        if spec is None:
            return None, 0.0
        gang = self._gang(spec)
        if spec.match_policy == MATCH_ONCE_SATISFIED and gang.satisfied:
            return None, 0.0
        # The group's waiting members. One whose wait was decided rejected (timed out in its
        # bind worker, its Unreserve not yet run) is still assumed but will never bind: it
        # does not count, or this pod would be let through with a partial gang.
        waits: list[WaitingPod] = []
        for waiting in self._handle.waiting_pods:
            try:
                other = self._spec(waiting.pod)
            except GangSpecError:
                continue
            if other is not None and other.id in spec.groups:
                waits.append(waiting)
        rejected = {w.pod.uid for w in waits if w.rejected}
        short: list[str] = []
        for gang_id in spec.groups:
            member = self._gangs.get(gang_id)
            have = self._counted(member, rejected) if member is not None else 0
            need = member.spec.min_available if member is not None else 1
            if have < need:
                short.append(f"gang {gang_id}: {have}/{need} members assumed")
        # All or nothing: a wait decided between the count and now fails the whole group.
        if not short and not allow_together(
            (w for w in waits if w.pod.uid not in rejected), self.name
        ):
            short.append("a member's wait ended while the group was completed")
        if short:
            message = "waiting for its gang group: " + "; ".join(short)
            self._handle.client.record_event(pod, "Normal", "GangWaiting", message)
            return Status(Code.WAIT, (message,)), spec.waiting_seconds
        for gang_id in spec.groups:
            member = self._gangs.get(gang_id)
            if member is not None:
                member.satisfied = True
        return None, 0.0

    def events_to_register(self) -> list[ClusterEvent]:
        return [UNSCHEDULED_POD_ADD, POD_GROUP_ADD, POD_GROUP_UPDATE]
