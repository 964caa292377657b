"""GPUFragmentation: place each pod where it fragments the cluster's GPUs the least.

Role: a Score plugin (whole-cluster ``score_nodes`` form and an independent per-node ``score``
form, ``pernode``) implementing the FGD paper's policy (``measure``), plus the paper's
baselines as scoring strategies of the same plugin:

- ``FragmentationGradient`` (default): the node's gradient ``F_n'(M) - F_n(M)``, the increase
  of its expected fragmentation for the target workload ``M`` if the pod goes there (for a pod
  on one card, on the card that increases it least; ties: the fullest card, then the lowest
  minor; for ``k`` cards, the ``k`` fitting cards of lowest minor), plus ``strandedWeight`` x
  the change of the GPUs the node's cpu can no longer feed (``max(0, free GPU - free cpu /
  c)``, ``c`` the workload's cpu per GPU: a look-ahead past the next pod that the paper's
  one-step measure lacks; ``strandedReach`` scales it by the share of GPU tasks accepting the
  node's model), plus ``pinnedWeight`` x the milli-GPU the pod takes x its model's pressure
  (the share of GPU demand pinned to models that accept it over the model's share of the
  cluster's free GPU now, ``columns``; 0 without GPU-model constraints). It is compared in
  steps of ``resolution`` milli-GPU (``Linear``),
  or as the paper's artifact does, ``int(100 * sigmoid(-gradient / 1000))`` (``Sigmoid``).
- ``BestFit``: the node left with the least free cpu and GPU (each normalized to the largest
  node, 128 cores / 8 GPUs, weighted half and half); the fullest card that fits.
- ``Random``: every node scores the same (the scheduler draws among ties); a random card.
- ``DotProduct``, ``GPUClustering``, ``GPUPacking``: the paper's other baselines, scored as its
  artifact does (``baselines``); the fullest card that fits. GPUClustering reads each node's
  tags (which kinds of GPU pod hold its cards) from the ledger's holdings, cached per row by
  ``row_version``.

Equal primary scores are then ordered by the ``tieBreak`` criteria, packed into the same int64
key: ``SmallestNode`` (fewest healthy GPU cards), ``Packing`` (least GPU left), ``FirstFit``
(lowest snapshot slot, the node known longest). Scores are normalized by rank
(``normalize_score``): the best distinct key gets 100, the next 99, and so on.

Card state: the plugin keeps none. It reads the scheduler's one device ledger
(``scheduler.devices.ledger_of``, fed by events and DeviceShare's Reserve/Unreserve): a card's
free milli-GPU is the ledger's ``share`` (the free part of the card in thousandths, the least
of gpu-core, gpu-memory-ratio and gpu-memory; unhealthy cards and the cards kubelet-allocated
pods hold through ``devices-checkpoints`` have none), and which cards can take the pod and
what each is left with come from the devices allocator (``card_fits``, ``card_left``):
DeviceShare's own per-card fit, for every request shape it accepts (a shared card, memory
only, a ratio, N whole cards, ``nvidia.com/gpu``, ...).

PreFilter parses the pod's device request as DeviceShare does, feeds the pod's shape to the
learned workload's window, and — ``failFast`` — turns the pod away at once when no node has
its cpu and memory free (NodeResourcesFit's check) and passes DeviceShare's whole-cluster
feasibility (``feasible_rows``: exact for requests without hints or joint rules, a necessary
condition otherwise), sparing the per-node diagnosis of a pod that fits nowhere. A pod whose
device request is invalid is left to DeviceShare (it scores 0 here).

The card choice reaches DeviceShare through cycle state (DeviceShare's documented hook): for a
pod sharing one card, PreFilter stores a preference object under ``PREFERRED_GPUS_KEY`` whose
``get(node)`` answers from what Score computed, or computes it for that node alone (Score is
skipped when a single node is feasible); DeviceShare's Reserve allocates on that card when it
can, and records the allocation in the ledger — the only writer.

Invariants: per-row sums are cached per plugin (``columns``) and recomputed only for ledger
rows whose ``row_version`` changed or when the target workload is rebuilt; ``score`` and
``score_nodes`` agree exactly on every node (the measure is exact; tests compare them on
random clusters); PreFilter rejects only pods that no node could take; the plugin never
imports another plugin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import numpy as np
import numpy.typing as npt

from apis.core import CPU, MEMORY, Pod
from apis.gpushare import MemoryUnit
from apis.quantity import BINARY_SI, Quantity
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from scheduler.devices import (
    SHARE,
    DeviceRequest,
    NodeDeviceLedger,
    RequestError,
    card_fits,
    card_left,
    ledger_of,
    parse_request,
    rows_feasible,
)
from scheduler.devices.request import GPU_RATIO_INDEX
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    ASSIGNED_POD_UPDATE,
    DEVICE_ADD,
    DEVICE_UPDATE,
    NODE_ADD,
    NODE_UPDATE,
    ClusterEvent,
)
from scheduler.framework.interfaces import Handle, PreFilterExtensions
from scheduler.framework.status import Status, unschedulable
from scheduler.framework.types import IntArray, NodeInfo, Snapshot
from scheduler.plugins.gpufragmentation.args import (
    BEST_FIT,
    CLUSTERING,
    DOT_PRODUCT,
    FRAGMENTATION_GRADIENT,
    PACKING,
    RANDOM,
    GPUFragmentationArgs,
)
from scheduler.plugins.gpufragmentation.baselines import (
    clustering_scores,
    dot_product_scores,
    node_tags,
    packing_scores,
)
from scheduler.plugins.gpufragmentation.columns import ClusterColumns
from scheduler.plugins.gpufragmentation.pernode import (
    PodRequest,
    node_score,
    pod_tag,
    primary_best_fit,
    primary_gradient,
    with_ties,
)
from scheduler.plugins.gpufragmentation.workload import WorkloadEstimator, shape_of

__all__ = [
    "NAME",
    "PREFERRED_GPUS_KEY",
    "STATE_KEY",
    "GPUFragmentation",
]

NAME: Final = "GPUFragmentation"
STATE_KEY: Final = NAME
PREFERRED_GPUS_KEY: Final = "DeviceShare/preferred-gpus"
"""DeviceShare's hook for an external card choice (the same text as its constant)."""

MAX_SCORE: Final = 100

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


class _Preference:
    """What DeviceShare's Reserve asks: the GPU minors to use on a node (``get``)."""

    def __init__(self, plugin: GPUFragmentation, pod: PodRequest) -> None:
        self._plugin = plugin
        self.pod = pod
        self.best: IntArray | None = None
        """Best card column per snapshot slot (-1: not computed), set by Score."""

    def get(self, node: str) -> tuple[int, ...] | None:
        return self._plugin.preferred_minors(self, node)


@dataclass(slots=True)
class _Entry:
    pod: PodRequest
    preference: _Preference | None

    def clone(self) -> _Entry:
        return self


def pod_request(pod: Pod, gpushare_unit: MemoryUnit = MemoryUnit.GiB) -> PodRequest:
    """The pod's cpu and device request, parsed as DeviceShare parses it."""
    cpu = pod.requests.get(CPU, 0)
    try:
        return PodRequest(cpu, parse_request(pod, gpushare_unit))
    except RequestError:
        return PodRequest(cpu, None, valid=False)


class GPUFragmentation:
    """PreFilter, Score (+ normalize); see the module docstring."""

    name = NAME

    def __init__(
        self,
        ledger: NodeDeviceLedger,
        args: GPUFragmentationArgs | None = None,
        handle: Handle | None = None,
    ) -> None:
        self.ledger = ledger
        self.args = args if args is not None else GPUFragmentationArgs()
        self.estimator = WorkloadEstimator(self.args.workload)
        self._snapshot = handle.snapshot if handle is not None else None
        self._np_rng = np.random.default_rng(self.args.random_seed)
        self.columns = ClusterColumns(ledger, self.estimator)

    @classmethod
    def with_handle(
        cls, handle: Handle, args: GPUFragmentationArgs | None = None
    ) -> GPUFragmentation:
        """The plugin over the scheduler's one device ledger."""
        return cls(ledger_of(handle), args, handle)

    # -- PreFilter ------------------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        self.estimator.observe(pod.uid, shape_of(pod))
        request = pod_request(pod, self.ledger.gpushare_unit)
        preference = _Preference(self, request) if request.shared else None
        state.write(STATE_KEY, _Entry(request, preference))
        if preference is not None:
            state.write(PREFERRED_GPUS_KEY, preference)
        if request.valid and self.args.fail_fast and self._snapshot is not None:
            return self._nowhere(pod, request, self._snapshot)
        return None

    def pre_filter_extensions(self) -> PreFilterExtensions | None:
        return None

    def events_to_register(self) -> Sequence[ClusterEvent]:
        """What may make room for a pod the fail-fast check turned away."""
        return (
            NODE_ADD,
            NODE_UPDATE,
            ASSIGNED_POD_DELETE,
            ASSIGNED_POD_UPDATE,
            DEVICE_ADD,
            DEVICE_UPDATE,
        )

    def _nowhere(self, pod: Pod, request: PodRequest, snapshot: Snapshot) -> Status | None:
        """Unschedulable when no node has the pod's cpu and memory free and passes
        DeviceShare's whole-cluster feasibility (a necessary condition of NodeResourcesFit and
        DeviceShare), so that a pod that fits nowhere costs one cheap pass instead of a
        per-node diagnosis; None otherwise. Node affinity (a GPU model) is left to its own
        plugin, whose message says more."""
        slots = snapshot.live_slots()
        if len(slots) == 0:
            return None
        ok = snapshot.allocatable(CPU)[slots] - snapshot.requested(CPU)[slots] >= request.cpu
        memory = pod.requests.get(MEMORY, 0)
        if memory:
            ok &= snapshot.allocatable(MEMORY)[slots] - snapshot.requested(MEMORY)[slots] >= memory
        if request.request is not None and ok.any():
            rows = self.columns.slot_rows(snapshot)[slots[ok]]
            rows = rows[rows < self.ledger.n_rows]
            if len(rows) and rows_feasible(self.ledger, request.request, rows).any():
                return None
        elif ok.any():
            return None
        cpu = Quantity.of(Fraction(request.cpu, 1000)).canonical()
        needs = [f"{cpu} cpu", f"{Quantity.of(memory, BINARY_SI).canonical()} memory"]
        if request.request is not None:
            needs.extend(_device_needs(request.request))
        return unschedulable(f"no node has {', '.join(needs[:-1])} and {needs[-1]} free")

    def _entry(self, state: CycleState, pod: Pod) -> _Entry:
        entry = state.get(STATE_KEY)
        if isinstance(entry, _Entry):
            return entry
        return _Entry(pod_request(pod, self.ledger.gpushare_unit), None)

    # -- Score ------------------------------------------------------------------------------------

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        """The per-node form (``pernode``): the node's cards from the ledger's node view."""
        entry = self._entry(state, pod)
        cards = self.ledger.node_view(node.name, (DEVICE_GPU,)).cards[DEVICE_GPU]
        cpu_free = node.allocatable.get(CPU, 0) - node.requested.get(CPU, 0)
        tags = 0
        if self.args.strategy == CLUSTERING:
            tags = node_tags(self.ledger.holdings_on(node.name))
        pressure = 0.0
        if self.args.pinned_weight > 0 and self._snapshot is not None:
            wl = self.columns.workload()
            kinds = self.columns.slot_access(self._snapshot, wl)
            if 0 <= node.slot < len(kinds):
                pressure = float(self.columns.pressure(self._snapshot, wl)[kinds[node.slot]])
        return node_score(
            self.args,
            self.estimator.current(),
            entry.pod,
            cards,
            self.columns.model_of(node),
            cpu_free,
            node.slot,
            tags,
            pressure,
        )

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        """Raw scores (higher is better; ``normalize_score`` maps them to 0..100)."""
        entry = self._entry(state, pod)
        if not entry.pod.valid or len(slots) == 0:
            return np.zeros(len(slots), np.int64)
        rows = self.columns.slot_rows(snapshot)[slots]
        cpu = snapshot.allocatable(CPU)[slots] - snapshot.requested(CPU)[slots]
        raw, cols = self._evaluate(entry.pod, snapshot, rows, cpu, slots)
        if entry.preference is not None:
            best = entry.preference.best
            if best is None or len(best) != snapshot.size:
                best = np.full(snapshot.size, -1, np.int64)
                entry.preference.best = best
            best[slots] = cols
        return raw

    def normalize_score(self, state: CycleState, pod: Pod, scores: IntArray) -> Status | None:
        """Rank normalization: the best distinct raw score is 100, the next 99, ... (>= 0)."""
        if len(scores):
            distinct = np.unique(scores)
            rank = len(distinct) - 1 - np.searchsorted(distinct, scores)
            scores[:] = np.maximum(MAX_SCORE - rank, 0)
        return None

    def _evaluate(
        self, pod: PodRequest, snapshot: Snapshot, rows: IntArray, cpu: IntArray,
        slots: IntArray,
    ) -> tuple[IntArray, IntArray]:
        """Raw scores of the nodes at ``slots`` (ledger ``rows``) and, for a pod on one card,
        the card column each would get (-1: none fits)."""
        wl = self.columns.workload()
        ledger, cache = self.ledger, self.columns.sums
        n = len(rows)
        known = rows < ledger.n_rows
        safe = np.where(known, rows, 0)
        crow = np.where(known, rows, cache.capacity)
        share = np.take(ledger.table(DEVICE_GPU).share, safe, axis=0) * known[:, None]
        total = np.take(cache.total, crow)
        s, c = np.take(cache.s, crow, axis=0), np.take(cache.c, crow, axis=0)
        cpu_after = cpu - pod.cpu
        gpu = pod.gpu
        strategy = self.args.strategy
        cols = np.full(n, -1, np.int64)
        after: F64 = np.full(n, np.inf)
        taken = np.zeros(n, np.int64)
        fits: B = np.zeros((n, share.shape[1]), bool)
        access = (
            np.take(self.columns.slot_access(snapshot, wl), slots)
            if strategy == FRAGMENTATION_GRADIENT
            else np.zeros(n, np.int64)
        )
        if gpu is None:
            if strategy == FRAGMENTATION_GRADIENT:
                after = wl.fragmentation(total, s, c, wl.weights(cpu_after, access))
        else:
            view_all = 2 * n >= ledger.n_rows  # most rows: views of the tables, then pick
            span: IntArray | slice = slice(0, max(ledger.n_rows, 1)) if view_all else safe
            fits = card_fits(ledger, gpu, span)
            if view_all:
                fits = np.take(fits, safe, axis=0)
            fits &= known[:, None]
            any_fit = fits.any(axis=1)
            fitting = fits.sum(axis=1)
            # Whole idle cards left empty (every fitting card idle, and the request takes its
            # whole memory ratio): which ones does not matter to the measure, so the
            # O(nodes x groups) form replaces the per-card one (the same values, exactly).
            ratio_total = np.take(ledger.table(DEVICE_GPU).total[GPU_RATIO_INDEX], safe, axis=0)
            whole = (
                not pod.shared
                and gpu.requested[GPU_RATIO_INDEX]
                and bool(np.all(share[fits] == SHARE))
                and bool(np.all(
                    (ratio_total[fits] > 0) & (ratio_total[fits] <= gpu.per_device[GPU_RATIO_INDEX])
                ))
            )
            left_on = share
            if not whole:
                _, left_all = card_left(ledger, gpu, span)
                left_on = np.take(left_all, safe, axis=0) if view_all else left_all
            if gpu.count == 1 and not whole:
                if strategy == RANDOM:
                    keys = self._np_rng.random(fits.shape)
                    keys[~fits] = np.inf
                    cols = np.argmin(keys, axis=1).astype(np.int64)
                fullest = np.argmin(np.where(fits, share, np.iinfo(np.int64).max), axis=1)
                if strategy == FRAGMENTATION_GRADIENT:
                    per_card = wl.after_cards(cpu_after, share, left_on, fits, total, s, c, access)
                    pick = _best_cards(per_card, share)
                    after = per_card[np.arange(n), pick]
                else:
                    pick = fullest
                idx = np.arange(n)
                taken = np.where(any_fit, share[idx, pick] - left_on[idx, pick], 0)
                if strategy != RANDOM:
                    cols = np.where(any_fit, pick, -1).astype(np.int64)
            elif gpu.count >= 1 and whole:
                enough = fitting >= gpu.count
                taken = np.where(enough, gpu.count * SHARE, 0)
                if strategy == FRAGMENTATION_GRADIENT:
                    after = wl.after_whole(cpu_after, fitting, total, s, c, access, gpu.count)
            elif gpu.count > 1:
                enough = fitting >= gpu.count
                chosen = fits & (np.cumsum(fits, axis=1) <= gpu.count) & enough[:, None]
                trial = np.where(chosen, left_on, share)
                taken = (share - trial).sum(axis=1)
                if strategy == FRAGMENTATION_GRADIENT:
                    s2, c2 = wl.sums(trial)
                    after = wl.fragmentation(
                        trial.sum(axis=1), s2, c2, wl.weights(cpu_after, access)
                    )
                    after[~enough] = np.inf
        left = total - taken
        n_cards = np.take(cache.n_cards, crow) if len(cache.n_cards) else np.zeros(n, np.int64)
        if strategy == RANDOM:
            primary = np.zeros(n, np.int64)
        elif strategy == BEST_FIT:
            primary = primary_best_fit(cpu_after, left)
        elif strategy == DOT_PRODUCT:
            primary = dot_product_scores(cpu, total, pod.cpu, taken)
        elif strategy == CLUSTERING:
            tags = np.take(self.columns.row_tags(), crow)
            primary = clustering_scores(pod_tag(pod), tags, total)
        elif strategy == PACKING:
            count = gpu.count if gpu is not None else 0
            primary = packing_scores(share, fits, n_cards, count)
        else:
            assert strategy == FRAGMENTATION_GRADIENT
            before = wl.fragmentation(total, s, c, wl.weights(cpu, access))
            rate = np.take(self.columns.slot_rate, slots)
            reach = np.take(self.columns.slot_reach, slots)
            pinned = None
            if self.args.pinned_weight > 0:
                pressure = np.take(self.columns.pressure(snapshot, wl), access)
                pinned = self.args.pinned_weight * taken * pressure
            primary = primary_gradient(
                self.args, rate, before, after, total, left, cpu, cpu_after, reach, pinned
            )
        return with_ties(self.args.tie_break, primary, n_cards, left, slots), cols

    # -- the card choice DeviceShare asks for --------------------------------------------------

    def preferred_minors(self, preference: _Preference, node: str) -> tuple[int, ...] | None:
        snapshot = self._snapshot
        if snapshot is None:
            return None
        slot = snapshot.index.get(node)
        if slot is None or slot >= snapshot.size:
            return None
        row = int(self.columns.slot_rows(snapshot)[slot])
        if row >= self.ledger.n_rows:
            return None
        best = preference.best
        col = int(best[slot]) if best is not None and slot < len(best) else -1
        if col < 0:
            slots = np.array([slot], np.int64)
            cpu = snapshot.allocatable(CPU)[slots] - snapshot.requested(CPU)[slots]
            _, cols = self._evaluate(
                preference.pod, snapshot, np.array([row], np.int64), cpu, slots
            )
            col = int(cols[0])
        minors = self.ledger.minors(node, DEVICE_GPU)
        gpu = preference.pod.gpu
        if col < 0 or col >= len(minors) or gpu is None:
            return None
        fits = card_fits(self.ledger, gpu, np.array([row], np.int64))
        return (minors[col],) if fits[0, col] else None


def _best_cards(per_card: F64, free_rows: IntArray) -> IntArray:
    """Per node, the card with the lowest value; ties to the fullest card, then the lowest
    column."""
    low = per_card.min(axis=1, keepdims=True)
    tied = per_card == low
    key = np.where(tied, free_rows, np.iinfo(np.int64).max)
    out: IntArray = np.argmin(key, axis=1).astype(np.int64)
    return out


def _device_needs(request: DeviceRequest) -> list[str]:
    """What the pod needs of each device type, for the fail-fast message."""
    out = []
    for treq in request.types:
        if treq.device_type == DEVICE_GPU:
            parts = []
            names = (GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY)
            for name, amount, asked in zip(names, treq.per_device, treq.requested, strict=True):
                if not asked:
                    continue
                value = Quantity.of(amount, BINARY_SI).canonical() if name == GPU_MEMORY \
                    else str(amount)
                parts.append(f"{name.rsplit('/', 1)[-1]} {value}")
            out.append(f"{treq.count} GPU card(s) with {', '.join(parts)}")
        else:
            count = treq.count if treq.count else "every"
            out.append(f"{count} {treq.device_type} device(s) with {treq.per_device[0]}%")
    return out
