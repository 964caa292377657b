"""NodeUnschedulable: rejects cordoned nodes (``spec.unschedulable: true``).

Role: kube-scheduler's NodeUnschedulable Filter plugin. A pod may still land on a cordoned node
when it tolerates the taint ``node.kubernetes.io/unschedulable:NoSchedule`` (the taint the
node lifecycle controller mirrors from ``spec.unschedulable``). The rejection is
UnschedulableAndUnresolvable with kube's reason ``node(s) were unschedulable``.

Invariants: the per-node ``filter`` is the reference; ``filter_nodes`` gives the same verdict
for every live slot. The column of cordoned slots is derived from node objects only, so it is
rebuilt only when the snapshot or its ``node_generation`` or size changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from apis.core import Pod, Taint, Toleration
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE, ClusterEvent
from scheduler.framework.status import Status, unresolvable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot

__all__ = ["ERR_REASON_UNSCHEDULABLE", "TAINT_NODE_UNSCHEDULABLE", "NodeUnschedulable"]

ERR_REASON_UNSCHEDULABLE = "node(s) were unschedulable"
TAINT_NODE_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"

_UNSCHEDULABLE_TAINT = Taint(key=TAINT_NODE_UNSCHEDULABLE, effect="NoSchedule")


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    """component-helpers ``Toleration.ToleratesTaint``."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def tolerates_unschedulable(pod: Pod) -> bool:
    """True when one of the pod's tolerations tolerates the unschedulable NoSchedule taint."""
    return any(_tolerates(t, _UNSCHEDULABLE_TAINT) for t in pod.tolerations)


class NodeUnschedulable:
    """Filter (per node and whole cluster) plus the events that can lift its verdict."""

    name = "NodeUnschedulable"

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._key: tuple[int, int] = (-1, -1)
        self._cordoned: BoolArray = np.zeros(0, dtype=bool)

    def events_to_register(self) -> Sequence[ClusterEvent]:
        # kube: Node Add | UpdateNodeTaint (a cordon is a node update).
        return (NODE_ADD, NODE_UPDATE)

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        n = node.node
        if n is None or not n.unschedulable:
            return None
        if tolerates_unschedulable(pod):
            return None
        return unresolvable(ERR_REASON_UNSCHEDULABLE)

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        if tolerates_unschedulable(pod):
            return np.ones(snapshot.size, dtype=bool)
        return ~self._cordoned_column(snapshot)

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """Every node the mask rejected is cordoned: one reason for all."""
        return np.zeros(len(slots), np.int64), [unresolvable(ERR_REASON_UNSCHEDULABLE)]

    def _cordoned_column(self, snapshot: Snapshot) -> BoolArray:
        key = (snapshot.node_generation, snapshot.size)
        if snapshot is not self._snapshot or key != self._key:
            col = np.zeros(snapshot.size, dtype=bool)
            for info in snapshot.node_infos():
                if info.node is not None and info.node.unschedulable:
                    col[info.slot] = True
            self._snapshot, self._key, self._cordoned = snapshot, key, col
        return self._cordoned
