"""Node and pod bookkeeping the plugins read: ``NodeInfo``, the column ``Snapshot``, ``FitError``.

The snapshot is a node table indexed by *slot*: every node has a stable integer slot for as
long as it exists, and per-resource numpy columns (allocatable, requested) are indexed by slot.
Whole-cluster plugins compute a boolean mask or a score array over ``[:size]`` in one numpy
pass instead of one Python call per node (see ARCHITECTURE.md, performance design).

Invariants:
- ``requested(r)[slot] == sum(pod.requests[r] for pod on the node)`` for every resource column,
  ``pod_count[slot] == len(infos[slot].pods)``, and the non-zero cpu/memory columns likewise.
- ``live[slot]`` is True exactly when the slot holds a Node object. A slot whose node was
  deleted while pods still reference it stays (not live) until its last pod goes, as
  kube-scheduler keeps an "imaginary" node.
- Only the cache mutates a snapshot, on the scheduling thread, between scheduling cycles; so a
  cycle sees one consistent state and the cost of a cycle does not grow with the pods placed.
- ``node_generation`` changes whenever what plugins read of a node (labels, annotations, taints,
  allocatable, unschedulable) or the set of nodes changes — not on status heartbeats — so
  plugins may cache per-node masks keyed by it.
- ``slot_version[slot]`` changes (to ``tick``, a value it never had) whenever any column of
  the slot (``live``, ``pod_count``, requested, allocatable, the non-zero cpu/memory) does,
  so plugins may keep per-slot derived columns and recompute only the slots that changed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
import numpy.typing as npt

from apis.core import CPU, MEMORY, Node, Pod
from scheduler.framework.status import Code, Status

PodInfo = Pod
"""A pod as the framework sees it: our decoded record, requests precomputed."""

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class NodeInfo:
    """One node and the pods placed on it (bound, binding or assumed)."""

    __slots__ = ("generation", "name", "node", "pods", "requested", "slot")

    def __init__(self, name: str, slot: int) -> None:
        self.node: Node | None = None
        self.name = name
        self.slot = slot
        self.pods: dict[str, Pod] = {}
        self.requested: dict[str, int] = {}
        self.generation = 0

    @property
    def allocatable(self) -> dict[str, int]:
        return dict(self.node.allocatable) if self.node is not None else {}

    # A what-if copy (preemption's dry run, nominated pods): its own pods and requested, the
    # snapshot's columns untouched. Never call these on a NodeInfo the snapshot owns.

    def copy(self) -> NodeInfo:
        other = NodeInfo(self.name, self.slot)
        other.node = self.node
        other.pods = dict(self.pods)
        other.requested = dict(self.requested)
        other.generation = self.generation
        return other

    def add_pod(self, pod: Pod) -> None:
        ident = pod.uid or pod.key
        if ident in self.pods:
            self.remove_pod(self.pods[ident])
        self.pods[ident] = pod
        for r, v in pod.requests.items():
            if v:
                self.requested[r] = self.requested.get(r, 0) + v
        self.generation += 1

    def remove_pod(self, pod: Pod) -> bool:
        ident = pod.uid or pod.key
        if self.pods.pop(ident, None) is None:
            return False
        for r, v in pod.requests.items():
            if v:
                left = self.requested.get(r, 0) - v
                if left:
                    self.requested[r] = left
                else:
                    self.requested.pop(r, None)
        self.generation += 1
        return True

    def __repr__(self) -> str:
        return f"NodeInfo({self.name!r}, pods={len(self.pods)})"


class Snapshot:
    """The node table. Read by plugins; mutated only through the methods below (by the cache)."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = max(1, capacity)
        self.size = 0
        self.infos: list[NodeInfo | None] = []
        self.index: dict[str, int] = {}
        self._free: list[int] = []
        self.live: BoolArray = np.zeros(self.capacity, dtype=bool)
        self.pod_count: IntArray = np.zeros(self.capacity, dtype=np.int64)
        self.non_zero_cpu: IntArray = np.zeros(self.capacity, dtype=np.int64)
        self.non_zero_memory: IntArray = np.zeros(self.capacity, dtype=np.int64)
        self._allocatable: dict[str, IntArray] = {}
        self._requested: dict[str, IntArray] = {}
        self.node_generation = 0
        self.pod_generation = 0
        self._live_slots: IntArray | None = None
        self.slot_version: IntArray = np.zeros(self.capacity, dtype=np.int64)
        self.tick = 0
        """Counts the changes ``slot_version`` records (unchanged: no slot changed)."""
        self._priorities: dict[int, int] = {}
        """Priority -> how many placed pods have it (preemption's "any victim at all?")."""

    # -- reading ------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self.live_slots())

    def live_slots(self) -> IntArray:
        """Slots of existing nodes in ascending order: the node order of a scheduling cycle."""
        if self._live_slots is None:
            self._live_slots = np.flatnonzero(self.live[: self.size]).astype(np.int64)
        return self._live_slots

    def node_infos(self) -> Iterator[NodeInfo]:
        """Every existing node, in slot order."""
        for slot in self.live_slots():
            info = self.infos[slot]
            assert info is not None
            yield info

    def get(self, name: str) -> NodeInfo | None:
        slot = self.index.get(name)
        if slot is None:
            return None
        info = self.infos[slot]
        return info if info is not None and info.node is not None else None

    def info(self, slot: int) -> NodeInfo:
        info = self.infos[slot]
        assert info is not None, f"slot {slot} is empty"
        return info

    def allocatable(self, resource: str) -> IntArray:
        """Allocatable amount of ``resource`` per slot, zeros where a node lacks it."""
        col = self._allocatable.get(resource)
        if col is None:
            col = self._new_column(self._allocatable, resource)
        return col[: self.size]

    def requested(self, resource: str) -> IntArray:
        col = self._requested.get(resource)
        if col is None:
            col = self._new_column(self._requested, resource)
        return col[: self.size]

    def resources(self) -> list[str]:
        return sorted(set(self._allocatable) | set(self._requested))

    def lowest_priority(self) -> int | None:
        """The lowest priority of any placed pod; None when no pod is placed."""
        return min(self._priorities) if self._priorities else None

    # -- mutation (the cache's) ----------------------------------------------------------------

    def set_node(self, node: Node) -> NodeInfo:
        """Add or update a node; returns its NodeInfo."""
        info = self._ensure(node.name)
        old = info.node
        info.node = node
        if old is not None and not _schedulable_fields_differ(old, node):
            return info  # a status heartbeat: nothing a plugin reads has changed
        info.generation += 1
        slot = info.slot
        self._touch(slot)
        if old is not None:
            for r in old.allocatable:
                self._allocatable[r][slot] = 0
        for r, v in node.allocatable.items():
            col = self._allocatable.get(r)
            if col is None:
                col = self._new_column(self._allocatable, r)
            col[slot] = v
        if not self.live[slot]:
            self.live[slot] = True
            self._live_slots = None
        self.node_generation += 1
        return info

    def remove_node(self, name: str) -> None:
        slot = self.index.get(name)
        if slot is None:
            return
        info = self.infos[slot]
        assert info is not None
        if info.node is not None:
            for r in info.node.allocatable:
                self._allocatable[r][slot] = 0
        info.node = None
        info.generation += 1
        self._touch(slot)
        self.live[slot] = False
        self._live_slots = None
        self.node_generation += 1
        if not info.pods:
            self._release(info)

    def add_pod(self, node_name: str, pod: Pod) -> None:
        info = self._ensure(node_name)
        ident = pod.uid or pod.key  # the UID: a re-created pod of the same name is another pod
        old = info.pods.get(ident)
        if old is not None:
            if _same_counts(old, pod):  # an assumed pod confirmed, say: no column changes
                info.pods[ident] = pod
                info.generation += 1
                self.pod_generation += 1
                return
            self._subtract(info, old)
        info.pods[ident] = pod
        self._priorities[pod.priority] = self._priorities.get(pod.priority, 0) + 1
        slot = info.slot
        for r, v in pod.requests.items():
            if v:
                info.requested[r] = info.requested.get(r, 0) + v
                col = self._requested.get(r)
                if col is None:
                    col = self._new_column(self._requested, r)
                col[slot] += v
        self.pod_count[slot] += 1
        self.non_zero_cpu[slot] += pod.non_zero_request(CPU)
        self.non_zero_memory[slot] += pod.non_zero_request(MEMORY)
        self._touch(slot)
        info.generation += 1
        self.pod_generation += 1

    def remove_pod(self, node_name: str, pod_id: str) -> Pod | None:
        """Remove the pod ``pod_id`` (its UID, or its key when it has none) from the node."""
        slot = self.index.get(node_name)
        if slot is None:
            return None
        info = self.infos[slot]
        assert info is not None
        pod = info.pods.pop(pod_id, None)
        if pod is None:
            return None
        self._subtract(info, pod)
        self._touch(slot)
        info.generation += 1
        self.pod_generation += 1
        if info.node is None and not info.pods:
            self._release(info)
        return pod

    # -- internals ------------------------------------------------------------------------------

    def _subtract(self, info: NodeInfo, pod: Pod) -> None:
        slot = info.slot
        left = self._priorities.get(pod.priority, 0) - 1
        if left > 0:
            self._priorities[pod.priority] = left
        else:
            self._priorities.pop(pod.priority, None)
        for r, v in pod.requests.items():
            if v:
                left = info.requested.get(r, 0) - v
                if left:
                    info.requested[r] = left
                else:
                    info.requested.pop(r, None)
                self._requested[r][slot] -= v
        self.pod_count[slot] -= 1
        self.non_zero_cpu[slot] -= pod.non_zero_request(CPU)
        self.non_zero_memory[slot] -= pod.non_zero_request(MEMORY)

    def _ensure(self, name: str) -> NodeInfo:
        slot = self.index.get(name)
        if slot is not None:
            info = self.infos[slot]
            assert info is not None
            return info
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot = self.size
            if slot >= self.capacity:
                self._grow(self.capacity * 2)
            self.size += 1
            self.infos.append(None)
        info = NodeInfo(name, slot)
        self.infos[slot] = info
        self.index[name] = slot
        return info

    def _release(self, info: NodeInfo) -> None:
        slot = info.slot
        del self.index[info.name]
        self.infos[slot] = None
        for cols in (self._allocatable, self._requested):
            for col in cols.values():
                col[slot] = 0
        self.pod_count[slot] = 0
        self.non_zero_cpu[slot] = 0
        self.non_zero_memory[slot] = 0
        self._touch(slot)
        heapq.heappush(self._free, slot)

    def _touch(self, slot: int) -> None:
        self.tick += 1
        self.slot_version[slot] = self.tick

    def _new_column(self, cols: dict[str, IntArray], resource: str) -> IntArray:
        col = np.zeros(self.capacity, dtype=np.int64)
        cols[resource] = col
        return col

    def _grow(self, capacity: int) -> None:
        def grow(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
            b = np.zeros(capacity, dtype=a.dtype)
            b[: a.shape[0]] = a
            return b

        self.live = grow(self.live)  # type: ignore[assignment]
        self.pod_count = grow(self.pod_count)  # type: ignore[assignment]
        self.non_zero_cpu = grow(self.non_zero_cpu)  # type: ignore[assignment]
        self.non_zero_memory = grow(self.non_zero_memory)  # type: ignore[assignment]
        self.slot_version = grow(self.slot_version)  # type: ignore[assignment]
        for cols in (self._allocatable, self._requested):
            for r in list(cols):
                cols[r] = grow(cols[r])  # type: ignore[assignment]
        self.capacity = capacity


def _same_counts(a: Pod, b: Pod) -> bool:
    """Whether ``a`` and ``b`` add the same to every column (and to the priorities)."""
    return (
        a.requests == b.requests
        and a.non_zero_cpu == b.non_zero_cpu
        and a.non_zero_memory == b.non_zero_memory
        and a.priority == b.priority
    )


def _schedulable_fields_differ(a: Node, b: Node) -> bool:
    return (
        a.labels != b.labels
        or a.taints != b.taints
        or a.allocatable != b.allocatable
        or a.unschedulable != b.unschedulable
        or a.annotations != b.annotations
    )


class SlotNodes(Sequence[NodeInfo]):
    """The NodeInfos of some slots, looked up only when read (PreScore gets thousands)."""

    __slots__ = ("_snapshot", "slots")

    def __init__(self, snapshot: Snapshot, slots: IntArray) -> None:
        self._snapshot = snapshot
        self.slots = slots

    def __len__(self) -> int:
        return len(self.slots)

    @overload
    def __getitem__(self, i: int) -> NodeInfo: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[NodeInfo]: ...

    def __getitem__(self, i: int | slice) -> NodeInfo | Sequence[NodeInfo]:
        if isinstance(i, slice):
            return SlotNodes(self._snapshot, self.slots[i])
        return self._snapshot.info(int(self.slots[i]))


# ---------------------------------------------------------------------------------------------
# Diagnosis and the FitError message (SPEC §6)

NO_NODES_AVAILABLE = "no nodes available to schedule pods"


StatusGroup = tuple[IntArray, IntArray, Sequence[Status]]
"""``(slots, codes, statuses)``: the node in ``slots[i]`` failed with ``statuses[codes[i]]``."""


class NodeStatuses(Mapping[str, Status]):
    """The rejected nodes of one attempt and why, grouped as the Filter phase found them.

    ``named`` holds statuses found node by node; each group holds the nodes one whole-cluster
    filter rejected, as arrays of slots and status codes into a small table of statuses. The
    FitError message (``reason_counts``), the rejecting plugins and the first error are read
    from the groups in a numpy pass; the name -> status dict is built only when the mapping is
    read (a PostFilter plugin), which must happen within the scheduling cycle (slots are
    resolved to names against the snapshot, which changes only between cycles).

    Order, as a dict would iterate: ``named`` first, then the groups, each in slot order.
    """

    __slots__ = ("_dict", "_groups", "_named", "_snapshot")

    def __init__(
        self, snapshot: Snapshot, named: dict[str, Status], groups: Sequence[StatusGroup] = ()
    ) -> None:
        self._snapshot = snapshot
        self._named = named
        self._groups = list(groups)
        self._dict: dict[str, Status] | None = None if self._groups else named

    def _materialize(self) -> dict[str, Status]:
        if self._dict is None:
            out = dict(self._named)
            for slots, codes, table in self._groups:
                for slot, code in zip(slots.tolist(), codes.tolist(), strict=True):
                    out[self._snapshot.info(slot).name] = table[code]
            self._dict = out
        return self._dict

    def __getitem__(self, name: str) -> Status:
        return self._materialize()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._materialize())

    def __len__(self) -> int:
        return len(self._named) + sum(len(slots) for slots, _, _ in self._groups)

    def _used(self) -> Iterator[tuple[Status, int]]:
        """Every status with the number of nodes it stands for (statuses may repeat)."""
        for status in self._named.values():
            yield status, 1
        for _, codes, table in self._groups:
            counts = np.bincount(codes, minlength=len(table)).tolist()
            for status, n in zip(table, counts, strict=False):
                if n:
                    yield status, n

    def reason_counts(self) -> dict[str, int]:
        """Reason -> number of nodes that gave it (the FitError message's figures)."""
        counts: dict[str, int] = {}
        for status, n in self._used():
            for reason in status.reasons:
                counts[reason] = counts.get(reason, 0) + n
        return counts

    def count(self, predicate: Callable[[Status], bool]) -> int:
        """How many nodes have a status for which ``predicate`` holds (one call per status)."""
        return sum(n for status, n in self._used() if predicate(status))

    def plugins(self) -> set[str]:
        """The plugins that rejected at least one node."""
        return {status.plugin for status, _ in self._used() if status.plugin}

    def first_error(self) -> Status | None:
        """The first Error status in iteration order, if any node failed with one."""
        for status in self._named.values():
            if status.code == Code.ERROR:
                return status
        for _, codes, table in self._groups:
            bad = [i for i, status in enumerate(table) if status.code == Code.ERROR]
            if bad:
                hits = np.flatnonzero(np.isin(codes, bad))
                if len(hits):
                    return table[int(codes[hits[0]])]
        return None


def reason_counts(node_to_status: Mapping[str, Status]) -> dict[str, int]:
    """Reason -> number of nodes that gave it."""
    if isinstance(node_to_status, NodeStatuses):
        return node_to_status.reason_counts()
    counts: dict[str, int] = {}
    for status in node_to_status.values():
        for reason in status.reasons:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


@dataclass(slots=True)
class Diagnosis:
    """Why a pod fits nowhere: per-node statuses, or the PreFilter message that stands alone."""

    node_to_status: Mapping[str, Status] = field(default_factory=dict)
    unschedulable_plugins: set[str] = field(default_factory=set)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""
    nominated_node: str | None = None
    """Set by a PostFilter (preemption): the node to nominate the pod to ("" clears a
    nomination); None leaves the pod's nomination as it is."""


class FitError(Exception):
    """The pod fits on no node. ``str()`` is kube-scheduler's message, built only here."""

    def __init__(self, pod: Pod, num_all_nodes: int, diagnosis: Diagnosis) -> None:
        super().__init__()
        self.pod = pod
        self.num_all_nodes = num_all_nodes
        self.diagnosis = diagnosis

    @property
    def message(self) -> str:
        return fit_error_message(self.num_all_nodes, self.diagnosis)

    def __str__(self) -> str:
        return self.message


def fit_error_message(num_all_nodes: int, diagnosis: Diagnosis) -> str:
    """``0/5 nodes are available: 2 <reason a>, 3 <reason b>.`` as kube-scheduler words it."""
    if num_all_nodes == 0 and not diagnosis.pre_filter_msg:
        return NO_NODES_AVAILABLE
    if diagnosis.pre_filter_msg:
        msg = f"0/{num_all_nodes} nodes are available: {diagnosis.pre_filter_msg}."
    else:
        msg = counts_message(num_all_nodes, reason_counts(diagnosis.node_to_status))
    if diagnosis.post_filter_msg:
        msg += f" {diagnosis.post_filter_msg}"  # current kube: no period added (it has its own)
    return msg


def counts_message(num_all_nodes: int, counts: Mapping[str, int]) -> str:
    """``0/N nodes are available: <n reason>, ….`` from reason counts (kube's histogram)."""
    msg = f"0/{num_all_nodes} nodes are available:"
    items = sorted(f"{n} {reason}" for reason, n in counts.items() if n)
    if items:
        msg += f" {', '.join(items)}."
    return msg
