"""DeviceShare: the extension points of fine-grained GPU, RDMA and FPGA allocation.

Role: Koordinator's DeviceShare plugin (``pkg/scheduler/plugins/deviceshare/plugin.go``,
``scoring.go``) as thin extension points over ``request`` (parse), ``allocator`` (fit and
allocate), ``scoring`` and the scheduler's one ``NodeDeviceLedger`` (all in
``scheduler.devices``; the ledger reached through ``ledger_of(handle)``):

- PreFilter parses the pod's device request into the cycle-state entry; no device request is
  Skip (Filter does not run; PreScore Skips too, so Score does not run; Reserve and PreBind
  do nothing), an invalid one UnschedulableAndUnresolvable with Koordinator's message.
- AddPod/RemovePod (preemption dry runs, nominated pods) release or restore a victim's devices
  in the entry's per-node ``NodeOverlay`` (``state.DeviceShareState``); a nominated pod (which
  holds nothing yet) is added as the allocation the allocator would give it on that node, so
  its shares stay taken. The ledger is untouched.
- Filter / ``filter_nodes``: the allocator on one node / its whole-cluster feasibility (numpy
  over the ledger, kept per request shape and recomputed only for the rows that changed:
  ``rowcache.RequestRows``; for hinted or joint requests only the nodes that pass that numpy
  pass are then tried one by one, and overlay nodes always are).
- Filter on nodes that honor GPU partition tables (``gpu-partition-policy: Honor``): the
  numpy pass counts cards only, so for whole-GPU requests those nodes are always tried one by
  one (and ``filter_reasons`` leaves them to ``filter``).
- Score / ``score_nodes``: the node score of ``scoring.Scorer`` (kept like Filter's
  feasibility, per request shape and changed row); for several whole GPUs on a
  node that publishes its interconnect (``gpu-topology``), blended half and half with the
  connectivity score of the cards ``allocate`` would give (``interconnect.set_score``), so a
  node whose free cards are well connected wins. Only those nodes pay for the per-node
  ``allocate``; its outcome is cached in the cycle-state entry and, for plain requests,
  across pods by the node's ledger row version and the request's shape.
- Reserve allocates on the chosen node (plain GPU requests without an external preference
  through ``allocate_plain``, which reads the ledger's row instead of building a
  ``NodeView``: the same cards), records it in the ledger under the pod's uid and keeps the
  allocation and its annotation in the entry; Unreserve releases it. Where pods the pod must
  respect are nominated to the node, the cards are chosen with them added exactly as Filter
  added them (the runner's ``with_nominated_pods``), so the cards kept for them stay free.
- PreBind puts the ``device-allocated`` annotation (with each card's id) into
  ``state.bind_annotations``, so allocation and binding are one API write.
- A bound pod whose ``device-allocated`` annotation the ledger finds invalid (it then holds
  the cards it names whole) gets a Warning event ``InvalidDeviceAllocation``, once per
  annotation text, written off the scheduling thread (``InvalidAllocationReporter``, one per
  scheduler: the ledger below never calls the cluster).

Card choice by an external scorer (the one hook other plugins may use, through cycle state
only, since plugins never import each other): an object stored under ``PREFERRED_GPUS_KEY``
with a method ``get(node_name) -> Sequence[int] | None`` names the GPU minors to allocate on
that node; Reserve allocates on exactly those cards when they satisfy the request (hints and
all) and falls back to its own choice otherwise. Reserve publishes the allocation it made
(the ``device-allocated`` text) under ``ALLOCATION_KEY`` for the reserve plugins after it, and
Unreserve removes it. GPUFragmentation uses the first.

Invariants: the entry's request is frozen and only read after PreFilter; the ledger changes
only through events and Reserve/Unreserve; both Filter forms and both Score forms agree on
every node; the binding cycle (another thread) only reads the entry's precomputed annotation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from apis.core import Node, Pod
from apis.device import GPU_ISOLATION_PROVIDER_HAMI_CORE, LABEL_GPU_ISOLATION_PROVIDER
from apis.resources import DEVICE_GPU
from scheduler.devices import ledger_of
from scheduler.devices.allocator import allocate, allocate_plain, feasible_rows, insufficient
from scheduler.devices.interconnect import set_score
from scheduler.devices.ledger import InvalidAllocation, NodeDeviceLedger
from scheduler.devices.request import (
    CardUse,
    DeviceRequest,
    RequestError,
    parse_request,
)
from scheduler.devices.rowcache import RequestRows
from scheduler.devices.scoring import Scorer
from scheduler.devices.topology import NodeView
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    ASSIGNED_POD_UPDATE,
    DEVICE_ADD,
    DEVICE_DELETE,
    DEVICE_UPDATE,
    NODE_ADD,
    ClusterEvent,
)
from scheduler.framework.interfaces import Handle, PreFilterExtensions
from scheduler.framework.status import SKIP, Status, error, unresolvable, unschedulable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot
from scheduler.plugins.deviceshare.annotations import allocation_annotation, gpushare_annotations
from scheduler.plugins.deviceshare.args import DeviceShareArgs
from scheduler.plugins.deviceshare.state import DeviceShareState

__all__ = [
    "ALLOCATION_KEY",
    "ERR_HAMI_CORE",
    "NAME",
    "PREFERRED_GPUS_KEY",
    "REASON_INVALID_ALLOCATION",
    "STATE_KEY",
    "DeviceShare",
    "InvalidAllocationReporter",
]

NAME = "DeviceShare"
STATE_KEY = NAME
PREFERRED_GPUS_KEY = "DeviceShare/preferred-gpus"
"""Cycle-state key of an external card choice: ``get(node_name) -> Sequence[int] | None``."""
ALLOCATION_KEY = "DeviceShare/allocation"
"""Cycle-state key where Reserve publishes the ``device-allocated`` text it reserved."""


_SHAPE_CACHE_MAX = 65536

REASON_INVALID_ALLOCATION = "InvalidDeviceAllocation"
"""Reason of the Warning event on a bound pod whose device-allocated annotation is invalid."""


ERR_HAMI_CORE = "GPUIsolationProviderHAMICore not found on the node"


def _isolation_ok(request: DeviceRequest, node: Node | None) -> bool:
    """Koordinator's Filter check: a shared-GPU pod labelled ``gpu-isolation-provider:
    HAMi-core`` needs a node labelled the same (else an Error, not Unschedulable). Only the
    HAMi-core value is checked: ``Gemini`` is this project's own provider (docs/fairshare.md),
    served on any node."""
    if request.isolation_provider != GPU_ISOLATION_PROVIDER_HAMI_CORE:
        return True
    gpu = request.type_request(DEVICE_GPU)
    if gpu is None or not gpu.shared:
        return True
    labels = node.labels if node is not None else {}
    return labels.get(LABEL_GPU_ISOLATION_PROVIDER) == GPU_ISOLATION_PROVIDER_HAMI_CORE


class InvalidAllocationReporter:
    """The scheduler's one reporter of invalid annotations: the ledger's ``on_invalid``."""

    def __init__(self, handle: Handle, ledger: NodeDeviceLedger) -> None:
        self._handle = handle
        ledger.on_invalid = self.report

    def report(self, finding: InvalidAllocation) -> None:
        client, pod, message = self._handle.client, finding.pod, finding.describe()
        # On the worker pool: the ledger calls this on the scheduling thread.
        self._handle.write_soon(
            lambda: client.record_event(pod, "Warning", REASON_INVALID_ALLOCATION, message)
        )


def _shape(request: DeviceRequest) -> tuple[object, ...] | None:
    """What ``allocate``'s outcome depends on in a plain request (no hint, no joint rule);
    None for the others (they are not cached across pods)."""
    if request.hints or request.joint_types:
        return None
    return (request.types, request.partition, request.gpushare_units)


class _Extensions:
    """AddPod/RemovePod: a victim's devices are free for this cycle only."""

    def __init__(self, plugin: DeviceShare) -> None:
        self._plugin = plugin

    def add_pod(
        self, state: CycleState, pod: Pod, pod_to_add: Pod, node: NodeInfo
    ) -> Status | None:
        entry = self._plugin.entry(state)
        if entry is None or entry.request is None:
            return None
        entry.connectivity.pop(node.name, None)
        if entry.restore(node.name, pod_to_add.uid):
            return None  # a reprieved victim keeps its cards
        if self._plugin.ledger.holding(pod_to_add.uid) is not None:
            return None  # already counted by the ledger (wherever it is)
        return self._plugin.add_nominated(entry, pod_to_add, node.name)

    def remove_pod(
        self, state: CycleState, pod: Pod, pod_to_remove: Pod, node: NodeInfo
    ) -> Status | None:
        entry = self._plugin.entry(state)
        if entry is None or entry.request is None:
            return None
        entry.connectivity.pop(node.name, None)
        entry.remove(self._plugin.ledger, node.name, pod_to_remove.uid)
        return None


class DeviceShare:
    """PreFilter (+extensions), Filter, PreScore, Score, Reserve and PreBind."""

    name = NAME

    def __init__(
        self,
        ledger: NodeDeviceLedger,
        args: DeviceShareArgs | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        handle: Handle | None = None,
    ) -> None:
        self.ledger = ledger
        self._handle = handle
        """For Reserve: the nominated pods and the runner that adds them (None: no nominees)."""
        self._clock_ns = clock_ns
        self.args = args if args is not None else DeviceShareArgs()
        # One unit per scheduler: the ledger accounts gpushare-placed pods with it too.
        ledger.gpushare_unit = self.args.gpushare_unit
        self.scorer = Scorer(self.args)
        self._request_rows = RequestRows(ledger, self.scorer)
        self._extensions = _Extensions(self)
        self._rows_key: tuple[int, int, int, int] | None = None
        self._rows: IntArray = np.zeros(0, np.int64)
        self._shape_cache: dict[tuple[object, ...], int] = {}

    @classmethod
    def with_handle(cls, handle: Handle, args: DeviceShareArgs | None = None) -> DeviceShare:
        """The plugin over the scheduler's one shared ledger (its event handler and its
        reporter of invalid annotations set up once, when the first profile creates it)."""

        ledger = ledger_of(handle)
        handle.component(
            InvalidAllocationReporter, lambda: InvalidAllocationReporter(handle, ledger)
        )
        return cls(ledger, args, handle=handle)

    def events_to_register(self) -> Sequence[ClusterEvent]:
        return (DEVICE_ADD, DEVICE_UPDATE, DEVICE_DELETE, ASSIGNED_POD_DELETE,
                ASSIGNED_POD_UPDATE, NODE_ADD)

    # -- state ------------------------------------------------------------------------------

    @staticmethod
    def entry(state: CycleState) -> DeviceShareState | None:
        value = state.get(STATE_KEY)
        return value if isinstance(value, DeviceShareState) else None

    def _entry(self, state: CycleState) -> DeviceShareState:
        value = self.entry(state)
        if value is None:
            raise KeyError(f"{STATE_KEY!r} not found in cycle state")
        return value

    # -- PreFilter ----------------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        try:
            request = parse_request(pod, self.args.gpushare_unit)
        except RequestError as err:
            return unresolvable(err.message)
        state.write(STATE_KEY, DeviceShareState(request))
        return SKIP if request is None else None

    def pre_filter_extensions(self) -> PreFilterExtensions | None:
        return self._extensions

    # -- Filter -------------------------------------------------------------------------------

    def _view(self, entry: DeviceShareState, types: Sequence[str], node: str) -> NodeView:
        return entry.view(self.ledger, node, types)

    def _evaluate(self, entry: DeviceShareState, request: DeviceRequest, node: str
                  ) -> list[CardUse] | Status:
        if node in entry.saturated:
            return unschedulable(insufficient(request.device_types[0]))
        return allocate(self._view(entry, request.device_types, node), request, self.scorer)

    def add_nominated(self, entry: DeviceShareState, pod: Pod, node: str) -> Status | None:
        """Count a nominated pod's devices on ``node`` in this cycle: the allocation it would
        get there now (the allocator's own choice), or the whole node when it does not fit."""
        try:
            request = parse_request(pod, self.args.gpushare_unit)
        except RequestError:
            return None  # it cannot be placed anywhere: it keeps nothing
        if request is None:
            return None
        result = allocate(self._view(entry, request.device_types, node), request, self.scorer)
        if isinstance(result, Status):
            entry.saturated.add(node)
            return None
        entry.add(self.ledger, node, pod.uid, result)
        return None

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        try:
            entry = self._entry(state)
        except KeyError as exc:
            return error(exc)
        if entry.request is None:
            return None
        if not _isolation_ok(entry.request, node.node):
            return error(ERR_HAMI_CORE)
        result = self._evaluate(entry, entry.request, node.name)
        return result if isinstance(result, Status) else None

    def _slot_rows(self, snapshot: Snapshot) -> IntArray:
        """Ledger row of every snapshot slot (``n_rows`` where a node has none), cached."""
        key = (id(snapshot), snapshot.node_generation, snapshot.size,
               self.ledger.node_set_generation)
        if key != self._rows_key:
            n = self.ledger.n_rows
            rows = np.full(snapshot.size, n, np.int64)
            for slot in range(snapshot.size):
                info = snapshot.infos[slot]
                if info is not None:
                    row = self.ledger.row_of(info.name)
                    if row is not None:
                        rows[slot] = row
            self._rows, self._rows_key = rows, key
        return self._rows

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        entry = self._entry(state)
        request = entry.request
        size = snapshot.size
        if request is None:
            return np.ones(size, bool)
        # Exact for plain requests; for hinted or joint ones a necessary condition (a selector
        # or a scope only removes choices), refined node by node below.
        mask: BoolArray = self._request_rows.feasible(request)[self._slot_rows(snapshot)]
        if request.vectorizable and request.whole_gpus and self.ledger.honor_rows:
            # Nodes that honor partition tables: the card count alone does not decide.
            honor = np.isin(self._slot_rows(snapshot), list(self.ledger.honor_rows))
            for candidate in np.flatnonzero(mask & honor).tolist():
                info = snapshot.infos[candidate]
                mask[candidate] = info is not None and self._outcome(entry, request, info.name) >= 0
        if not request.vectorizable:
            for candidate in np.flatnonzero(mask).tolist():
                info = snapshot.infos[candidate]
                ok = info is not None and not isinstance(
                    self._evaluate(entry, request, info.name), Status
                )
                mask[candidate] = ok
        for name in entry.overlaid():
            slot = snapshot.index.get(name)
            if slot is not None and slot < size:
                mask[slot] = not isinstance(self._evaluate(entry, request, name), Status)
        if request.isolation_provider == GPU_ISOLATION_PROVIDER_HAMI_CORE:
            for live in np.flatnonzero(mask).tolist():
                node = snapshot.infos[live]
                mask[live] = node is not None and _isolation_ok(request, node.node)
        return mask

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """Why ``allocate`` fails on each of ``slots``, in one pass for plain requests: the first
        type the node has no card of (Unresolvable), else the first type without enough
        fitting cards (Unschedulable), as ``allocate`` checks them. -1 for hinted or joint
        requests and for nodes with pods removed in this cycle (``filter`` answers those)."""
        codes = np.full(len(slots), -1, np.int64)
        entry = self._entry(state)
        request = entry.request
        if request is None or not request.vectorizable \
                or request.isolation_provider == GPU_ISOLATION_PROVIDER_HAMI_CORE:
            return codes, []
        rows = self._slot_rows(snapshot)[slots]
        n = self.ledger.n_rows
        statuses: list[Status] = []
        undecided = np.ones(len(slots), bool)

        def assign(hit: BoolArray, status: Status) -> None:
            if hit.any():
                codes[hit] = len(statuses)
                statuses.append(status)

        for treq in request.types:
            has = np.zeros(n + 1, bool)
            has[:n] = self.ledger.table(treq.device_type).exists[:n].any(axis=1)
            hit = undecided & ~has[rows]
            assign(hit, unresolvable(insufficient(treq.device_type)))
            undecided &= ~hit
        for treq in request.types:
            fits = feasible_rows(self.ledger, replace(request, types=(treq,)))
            hit = undecided & ~fits[rows]
            assign(hit, unschedulable(insufficient(treq.device_type)))
            undecided &= ~hit
        for name in entry.overlaid():
            slot = snapshot.index.get(name)
            if slot is not None:
                codes[slots == slot] = -1
        if request.whole_gpus and self.ledger.honor_rows:
            codes[np.isin(rows, list(self.ledger.honor_rows))] = -1
        return codes, statuses

    # -- Score --------------------------------------------------------------------------------

    def pre_score(self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]) -> Status | None:
        try:
            entry = self._entry(state)
        except KeyError as exc:
            return error(exc)
        return SKIP if entry.request is None else None

    def _node_score(self, entry: DeviceShareState, request: DeviceRequest, node: str) -> int:
        view = self._view(entry, request.device_types, node)
        return self._with_connectivity(
            self.scorer.node_score(view.cards, request), entry, request, view
        )

    def _with_connectivity(
        self, base: int, entry: DeviceShareState, request: DeviceRequest, view: NodeView
    ) -> int:
        """``base`` blended with the connectivity of the cards the pod would get, for several
        whole GPUs on a node that publishes its interconnect: ``(base + set score) // 2``."""
        if request.whole_gpus < 2 or not view.meta.gpu_topology:
            return base
        conn = self._outcome(entry, request, view.name, view)
        return base if conn < 0 else (base + conn) // 2

    def _outcome(
        self,
        entry: DeviceShareState,
        request: DeviceRequest,
        node: str,
        view: NodeView | None = None,
    ) -> int:
        """-1 when ``allocate`` fails on ``node``, else the connectivity score (0-100) of the
        GPUs it gives (100 without an interconnect). Cached per cycle in the entry and, for
        plain requests on nodes without removed pods, across pods by the node's row version
        and the request's shape (``_shape_cache``)."""
        conn = entry.connectivity.get(node)
        if conn is not None:
            return conn
        key: tuple[object, ...] | None = None
        shape = _shape(request)
        row = self.ledger.row_of(node)
        if shape is not None and row is not None and node not in entry.overlaid():
            key = (node, int(self.ledger.row_version[row]), shape)
            conn = self._shape_cache.get(key)
        if conn is None:
            if view is None:
                view = self._view(entry, request.device_types, node)
            uses = allocate(view, request, self.scorer)
            if isinstance(uses, Status):
                conn = -1
            else:
                cards = {c.minor: c for c in view.cards.get(DEVICE_GPU, ())}
                chosen = [cards[u.minor] for u in uses if u.device_type == DEVICE_GPU]
                conn = set_score(view.meta.gpu_topology, chosen)
            if key is not None:
                if len(self._shape_cache) >= _SHAPE_CACHE_MAX:
                    self._shape_cache.clear()
                self._shape_cache[key] = conn
        entry.connectivity[node] = conn
        return conn

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        entry = self._entry(state)
        if entry.request is None:
            return 0
        return self._node_score(entry, entry.request, node.name)

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        entry = self._entry(state)
        request = entry.request
        if request is None:
            return np.zeros(len(slots), np.int64)
        rows = self._slot_rows(snapshot)[slots]
        scores: IntArray = self._request_rows.scores(request)[rows]
        overlaid = entry.overlaid()
        connected = (
            np.isin(rows, list(self.ledger.topology_rows))
            if request.whole_gpus > 1 and self.ledger.topology_rows
            else None
        )
        if overlaid or connected is not None:
            for i, slot in enumerate(slots.tolist()):
                info = snapshot.infos[slot]
                if info is None:
                    continue
                if info.name in overlaid:
                    scores[i] = self._node_score(entry, request, info.name)
                elif connected is not None and connected[i]:
                    conn = self._outcome(entry, request, info.name)
                    if conn >= 0:
                        scores[i] = (int(scores[i]) + conn) // 2
        return scores

    # -- Reserve / PreBind ------------------------------------------------------------------------

    def reserve(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        try:
            entry = self._entry(state)
        except KeyError as exc:
            return error(exc)
        if entry.request is None:
            return None
        held = self.ledger.held_from_the_cluster(pod.uid)
        if held is not None:
            # Bound already (a stale bind of ours landed on it, seen in a read-back before
            # its bound event): its cards are those, and its bound event will end its queueing.
            return unschedulable(f"pod {pod.key} is already bound to {held.node} with devices")
        nominated = self._with_nominated(state, pod, node_name)
        if isinstance(nominated, Status):
            return nominated
        result = self._allocate(state, node_name, entry.request, nominated)
        if isinstance(result, Status):
            return result
        entry.annotation = allocation_annotation(self.ledger, node_name, result)
        entry.holding = self.ledger.reserve(pod.uid, node_name, result, entry.annotation)
        if entry.request.gpushare_units:
            unit, now = self.args.gpushare_unit, self._clock_ns()
            entry.gpushare = gpushare_annotations(
                self.ledger, unit, entry.request, node_name, result, now
            )
        state.write(ALLOCATION_KEY, entry.annotation)
        return None

    def _with_nominated(
        self, state: CycleState, pod: Pod, node: str
    ) -> DeviceShareState | Status | None:
        """The entry as Filter saw ``node`` with the pods nominated there that ``pod`` must
        respect added (the runner's ``with_nominated_pods``, the same AddPod that Filter ran);
        None when there are none, so Reserve keeps its fast path."""
        handle = self._handle
        if handle is None or not handle.nominator or handle.runner is None:
            return None
        if not handle.nominator.nominated_pods(node):
            return None
        info = handle.snapshot.get(node)
        if info is None:
            return None
        added = handle.runner.with_nominated_pods(state, pod, info)
        if added is None or isinstance(added, Status):
            return added
        return self.entry(added[0])

    def _allocate(
        self,
        state: CycleState,
        node: str,
        request: DeviceRequest,
        nominated: DeviceShareState | None = None,
    ) -> list[CardUse] | Status:
        """``allocate`` on ``node``, on the externally preferred GPUs when they can serve the
        request; without a preference, plain requests read the ledger's row directly
        (``allocate_plain``, the same result). With ``nominated`` (pods nominated to ``node``
        that this pod must respect), on the node as Filter saw it with them added: the cards
        kept for them are not chosen."""
        preference = state.get(PREFERRED_GPUS_KEY)
        if nominated is not None:
            if node in nominated.saturated:
                return unschedulable(insufficient(request.device_types[0]))
            view = self._view(nominated, request.device_types, node)
        else:
            if preference is None:
                plain = allocate_plain(self.ledger, node, request, self.scorer)
                if plain is not None:
                    return plain
            view = self.ledger.node_view(node, request.device_types)
        gpus = view.cards.get(DEVICE_GPU)
        if preference is not None and gpus:
            wanted = preference.get(view.name)
            if wanted:
                keep = set(wanted)
                only = tuple(c for c in gpus if c.minor in keep)
                narrowed = replace(view, cards={**view.cards, DEVICE_GPU: only})
                result = allocate(narrowed, request, self.scorer)
                if not isinstance(result, Status):
                    return result
        return allocate(view, request, self.scorer)

    def unreserve(self, state: CycleState, pod: Pod, node_name: str) -> None:
        state.delete(ALLOCATION_KEY)
        entry = self.entry(state)
        if entry is None:
            # No cycle state (an assumed pod expired): drop what we reserved for it, if any.
            self.ledger.release_reservation(pod.uid)
            return
        if entry.holding is not None:
            self.ledger.unreserve(entry.holding)
        entry.holding = None
        entry.annotation = ""
        entry.gpushare = {}

    def pre_bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        entry = self.entry(state)
        if entry is None or entry.request is None:
            return None
        if not entry.annotation:
            return error(f"no device allocation reserved for pod {pod.key} on {node_name}")
        state.bind_annotations[ANNOTATION_DEVICE_ALLOCATED] = entry.annotation
        state.bind_annotations.update(entry.gpushare)
        return None
