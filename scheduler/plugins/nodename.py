"""NodeName: a pod that names a node in ``spec.nodeName`` fits only that node.

Role: kube-scheduler's NodeName Filter plugin. Pods being scheduled normally have an empty
``node_name`` and fit everywhere; one that names a node fits only the node of that name, and
every other node rejects it as UnschedulableAndUnresolvable with kube's reason
``node(s) didn't match the requested node name``.

Invariants: stateless; ``filter_nodes`` equals ``filter`` on every live slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from apis.core import Pod
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE, ClusterEvent
from scheduler.framework.status import Status, unresolvable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot

__all__ = ["ERR_REASON", "NodeName"]

ERR_REASON = "node(s) didn't match the requested node name"


class NodeName:
    """Filter (per node and whole cluster) on ``pod.node_name``."""

    name = "NodeName"

    def events_to_register(self) -> Sequence[ClusterEvent]:
        # kube: Node Add (| UpdateNodeLabel | UpdateNodeTaint without queueing hints).
        return (NODE_ADD, NODE_UPDATE)

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        if not pod.node_name or pod.node_name == node.name:
            return None
        return unresolvable(ERR_REASON)

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        if not pod.node_name:
            return np.ones(snapshot.size, dtype=bool)
        mask = np.zeros(snapshot.size, dtype=bool)
        slot = snapshot.index.get(pod.node_name)
        if slot is not None:
            mask[slot] = True
        return mask

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """Every node the mask rejected is another node than the pod's: one reason for all."""
        return np.zeros(len(slots), np.int64), [unresolvable(ERR_REASON)]
