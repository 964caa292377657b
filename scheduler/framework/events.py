"""Cluster events: what changed in the cluster, as the queue and the plugins see it.

Two things live here. ``ClusterEvent`` (resource + action) is what a plugin registers
interest in, so that pods it rejected move back to the active queue only on a change that can
help them. ``Change`` is one observed change with its old and new object, delivered by the
Cluster port to the scheduler and, through it, to the cache and to stateful plugins.

Invariants: ``Change.old`` is None for an add, ``Change.new`` is None for a delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, Flag, auto
from typing import Any


class Resource(Enum):
    NODE = "Node"
    POD = "Pod"
    ASSIGNED_POD = "AssignedPod"
    DEVICE = "Device"
    POD_GROUP = "PodGroup"
    WILDCARD = "*"


class Action(Flag):
    ADD = auto()
    UPDATE = auto()
    DELETE = auto()
    ALL = ADD | UPDATE | DELETE


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    resource: Resource
    action: Action
    label: str = ""

    def matches(self, other: ClusterEvent) -> bool:
        """True when this registered event covers the observed ``other``."""
        if self.resource is not Resource.WILDCARD and self.resource is not other.resource:
            return False
        return bool(self.action & other.action)

    @property
    def name(self) -> str:
        return self.label or f"{self.resource.value}{_action_name(self.action)}"


def _action_name(action: Action) -> str:
    return {Action.ADD: "Add", Action.UPDATE: "Update", Action.DELETE: "Delete"}.get(
        action, "Change"
    )


PDB_KIND = "PodDisruptionBudget"
"""``Change.kind`` of a PodDisruptionBudget (``apis.disruption``); preemption reads them."""
POD_GROUP_KIND = "PodGroup"
"""``Change.kind`` of a ``scheduling.sigs.k8s.io`` PodGroup (``apis.gang``); Coscheduling reads
them (a cluster without the CRD sends none)."""
UNHEALTHY_GPUS_KIND = "UnhealthyGPUs"
"""``Change.kind`` of a ``kube-system/unhealthy-gpu-<node>`` ConfigMap (gpushare's list of cards
the operator took away; ``apis.gpushare.UnhealthyGPUs``); the device ledger reads them."""

# Events the queue reacts to without any plugin registering them.
UNSCHEDULABLE_TIMEOUT = ClusterEvent(Resource.WILDCARD, Action.ALL, "UnschedulableTimeout")
NODE_ADD = ClusterEvent(Resource.NODE, Action.ADD)
NODE_UPDATE = ClusterEvent(Resource.NODE, Action.UPDATE)
NODE_DELETE = ClusterEvent(Resource.NODE, Action.DELETE)
ASSIGNED_POD_ADD = ClusterEvent(Resource.ASSIGNED_POD, Action.ADD)
ASSIGNED_POD_UPDATE = ClusterEvent(Resource.ASSIGNED_POD, Action.UPDATE)
ASSIGNED_POD_DELETE = ClusterEvent(Resource.ASSIGNED_POD, Action.DELETE)
DEVICE_ADD = ClusterEvent(Resource.DEVICE, Action.ADD)
UNSCHEDULED_POD_ADD = ClusterEvent(Resource.POD, Action.ADD)  # a new pending pod (gang peers)
DEVICE_UPDATE = ClusterEvent(Resource.DEVICE, Action.UPDATE)
DEVICE_DELETE = ClusterEvent(Resource.DEVICE, Action.DELETE)
POD_GROUP_ADD = ClusterEvent(Resource.POD_GROUP, Action.ADD)
POD_GROUP_UPDATE = ClusterEvent(Resource.POD_GROUP, Action.UPDATE)


@dataclass(frozen=True, slots=True)
class Change:
    """One observed change. ``kind`` is "Node", "Pod" or "Device"; objects are decoded records."""

    kind: str
    old: Any = None
    new: Any = None

    @property
    def action(self) -> Action:
        if self.old is None:
            return Action.ADD
        if self.new is None:
            return Action.DELETE
        return Action.UPDATE
