"""GPUFragmentation: place each pod where it fragments the cluster's GPUs the least.

Role: a Score plugin (whole-cluster ``score_nodes`` form, with the per-node ``score`` as its
reference) implementing the FGD paper's policy (``measure``), plus the paper's baselines as
scoring strategies of the same plugin:

- ``FragmentationGradient`` (default): the node's gradient ``F_n'(M) - F_n(M)``, the increase
  of its expected fragmentation for the target workload ``M`` if the pod goes there (for a GPU
  share, on the card that increases it least; ties: the fullest card, then the lowest minor),
  plus ``strandedWeight`` x the change of the GPUs the node's cpu can no longer feed
  (``max(0, free GPU - free cpu / c)``, ``c`` the workload's cpu per GPU: a look-ahead past the
  next pod that the paper's one-step measure lacks). It is compared in steps of ``resolution``
  milli-GPU (``Linear``), or as the paper's artifact does, ``int(100 * sigmoid(-gradient /
  1000))`` (``Sigmoid``).
- ``BestFit``: the node left with the least free cpu and GPU (each normalized to the largest
  node, 128 cores / 8 GPUs, weighted half and half); the fullest card that fits.
- ``Random``: every node scores the same (the scheduler draws among ties); a random card.

Equal primary scores are then ordered by the ``tieBreak`` criteria, packed into the same int64
key: ``SmallestNode`` (fewest GPU cards), ``Packing`` (least GPU left), ``FirstFit`` (lowest
snapshot slot, the node known longest). Scores are normalized by rank (``normalize_score``):
the best distinct key gets 100, the next 99, and so on.

PreFilter computes the pod's shape, feeds the learned workload's window, and — ``failFast``,
a necessary condition of NodeResourcesFit and DeviceShare — turns the pod away at once when no
node has its cpu, memory and GPU cards free, sparing the per-node diagnosis of a pod that fits
nowhere (it registers the events that may make room).

The card choice reaches DeviceShare through cycle state (DeviceShare's documented hook):
PreFilter stores a preference object under ``PREFERRED_GPUS_KEY`` whose ``get(node)`` answers
from what Score computed, or computes it for that node alone (Score is skipped when a single
node is feasible). Reserve must run after DeviceShare's: it reads the allocation DeviceShare
published under ``ALLOCATION_KEY`` into the shared ``CardTable``.

Invariants: per-node sums are cached per plugin and recomputed only for rows whose version
changed or when the target workload is rebuilt; both score forms agree; PreFilter rejects only
pods that no node could take; the plugin never imports another plugin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

import numpy as np
import numpy.typing as npt

from apis.core import CPU, MEMORY, Pod
from apis.quantity import BINARY_SI, Quantity
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
    FRAGMENTATION_GRADIENT,
    RANDOM,
    SIGMOID,
    TIE_FIRST,
    TIE_PACKING,
    TIE_SMALLEST,
    GPUFragmentationArgs,
)
from scheduler.plugins.gpufragmentation.cards import CardTable
from scheduler.plugins.gpufragmentation.measure import GPU_MILLI, PodShape, Workload
from scheduler.plugins.gpufragmentation.workload import WorkloadEstimator, shape_of

__all__ = [
    "ALLOCATION_KEY",
    "CARDS_KEY",
    "NAME",
    "PREFERRED_GPUS_KEY",
    "STATE_KEY",
    "GPUFragmentation",
]

NAME: Final = "GPUFragmentation"
STATE_KEY: Final = NAME
CARDS_KEY: Final = "gpufragmentation/cards"
PREFERRED_GPUS_KEY: Final = "DeviceShare/preferred-gpus"
"""DeviceShare's hook for an external card choice (the same text as its constant)."""
ALLOCATION_KEY: Final = "DeviceShare/allocation"
"""Where DeviceShare's Reserve publishes its ``device-allocated`` text."""

MAX_SCORE: Final = 100
PRIMARY_LIMIT: Final = 1 << 20
"""Primary keys are clipped to [-2^20, 2^20); with the tie-break fields the key fits 62 bits."""
TIE_BITS: Final = {TIE_SMALLEST: 6, TIE_PACKING: 16, TIE_FIRST: 19}
MAX_SPEC_CPU: Final = 128_000
MAX_SPEC_GPU: Final = 8 * GPU_MILLI

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


class _Preference:
    """What DeviceShare's Reserve asks: the GPU minors to use on a node (``get``)."""

    def __init__(self, plugin: GPUFragmentation, shape: PodShape) -> None:
        self._plugin = plugin
        self._shape = shape
        self.best: IntArray | None = None
        """Best card column per snapshot slot (-1: not computed), set by Score."""

    def get(self, node: str) -> tuple[int, ...] | None:
        return self._plugin.preferred_minors(self, self._shape, node)


@dataclass(slots=True)
class _Entry:
    shape: PodShape | None
    preference: _Preference | None

    def clone(self) -> _Entry:
        return self


@dataclass(slots=True)
class _NodeCache:
    """Per-row sums for one workload (rows of the card table, plus a zero sentinel row)."""

    workload: Workload | None = None
    generation: int = -1
    capacity: int = 0
    version: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    total: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    full: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    s: IntArray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    c: IntArray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    access: B = field(default_factory=lambda: np.zeros((0, 0), bool))


class GPUFragmentation:
    """PreFilter, Score (+ normalize), Reserve; see the module docstring."""

    name = NAME

    def __init__(
        self,
        cards: CardTable,
        args: GPUFragmentationArgs | None = None,
        handle: Handle | None = None,
    ) -> None:
        self.cards = cards
        self.args = args if args is not None else GPUFragmentationArgs()
        self.estimator = WorkloadEstimator(self.args.workload)
        self._snapshot = handle.snapshot if handle is not None else None
        self._np_rng = np.random.default_rng(self.args.random_seed)
        self._cache = _NodeCache()
        self._rows_key: tuple[int, ...] | None = None
        self._rows: IntArray = np.zeros(0, np.int64)

    @classmethod
    def with_handle(
        cls, handle: Handle, args: GPUFragmentationArgs | None = None
    ) -> GPUFragmentation:
        """The plugin over the scheduler's one shared card table (its event handler registered
        once, by the first profile that creates it)."""

        def make() -> CardTable:
            table = CardTable()
            handle.add_event_handler(table.apply_change)
            return table

        return cls(handle.shared_state(CARDS_KEY, make), args, handle)

    # -- PreFilter ------------------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        shape = shape_of(pod)
        self.estimator.observe(pod.uid, shape)
        preference = _Preference(self, shape) if shape is not None and _shared(shape) else None
        state.write(STATE_KEY, _Entry(shape, preference))
        if preference is not None:
            state.write(PREFERRED_GPUS_KEY, preference)
        if shape is not None and self.args.fail_fast and self._snapshot is not None:
            return self._nowhere(pod, shape, self._snapshot)
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

    def _nowhere(self, pod: Pod, shape: PodShape, snapshot: Snapshot) -> Status | None:
        """Unschedulable when no node has the pod's cpu, memory and GPU cards free (a
        necessary condition of NodeResourcesFit and DeviceShare), so that a pod that fits
        nowhere costs one cheap pass instead of a per-node diagnosis; None otherwise. Node
        affinity (a GPU model) is left to its own plugin, whose message says more."""
        slots = snapshot.live_slots()
        if len(slots) == 0:
            return None
        ok = snapshot.allocatable(CPU)[slots] - snapshot.requested(CPU)[slots] >= shape.cpu_milli
        memory = pod.requests.get(MEMORY, 0)
        if memory:
            ok &= snapshot.allocatable(MEMORY)[slots] - snapshot.requested(MEMORY)[slots] >= memory
        if shape.needs_gpu and ok.any():
            rows = self._slot_rows(snapshot)[slots]
            free = self.cards.free
            known = rows < free.shape[0]
            cards = free[np.where(known, rows, 0)]
            fits = (cards >= shape.gpu_milli).sum(axis=1) >= shape.gpu_count
            ok &= known & fits
        if ok.any():
            return None
        cpu = Quantity.of(Fraction(shape.cpu_milli, 1000)).canonical()
        needs = [f"{cpu} cpu", f"{Quantity.of(memory, BINARY_SI).canonical()} memory"]
        if shape.needs_gpu:
            needs.append(
                f"{shape.gpu_count} GPU card(s) with {shape.gpu_milli} of 1000 milli-GPU"
            )
        return unschedulable(f"no node has {', '.join(needs[:-1])} and {needs[-1]} free")

    def _entry(self, state: CycleState, pod: Pod) -> _Entry:
        entry = state.get(STATE_KEY)
        if isinstance(entry, _Entry):
            return entry
        return _Entry(shape_of(pod), None)

    # -- per-node sums ----------------------------------------------------------------------------

    def workload(self) -> Workload:
        """The current target workload, with the per-row cache brought up to date."""
        workload = self.estimator.current()
        cache, cards = self._cache, self.cards
        capacity = cards.free.shape[0]
        n = cards.n_rows
        if (
            cache.workload is not workload
            or cache.generation != self.estimator.generation
            or cache.capacity != capacity
        ):
            q, m = workload.n_groups, len(workload.shapes)
            cache.workload, cache.generation, cache.capacity = (
                workload,
                self.estimator.generation,
                capacity,
            )
            cache.version = np.full(capacity, -1, np.int64)
            cache.total = np.zeros(capacity + 1, np.int64)
            cache.full = np.zeros(capacity + 1, np.int64)
            cache.s = np.zeros((capacity + 1, q), np.int64)
            cache.c = np.zeros((capacity + 1, q), np.int64)
            cache.access = np.zeros((capacity + 1, m), bool)
        dirty = np.flatnonzero(cache.version[:n] != cards.version[:n])
        if len(dirty):
            free = cards.free[dirty]
            cache.s[dirty], cache.c[dirty] = workload.sums(free)
            cache.total[dirty] = free.sum(axis=1)
            cache.full[dirty] = (free >= GPU_MILLI).sum(axis=1)
            for row in dirty.tolist():
                cache.access[row] = workload.access(cards.model(row))
            cache.version[dirty] = cards.version[dirty]
        return workload

    def _slot_rows(self, snapshot: Snapshot) -> IntArray:
        """Card-table row of every snapshot slot (the zero sentinel row where none)."""
        sentinel = self.cards.free.shape[0]
        key = (
            id(snapshot),
            snapshot.node_generation,
            snapshot.size,
            self.cards.node_set_generation,
            sentinel,
        )
        if key != self._rows_key:
            rows = np.full(snapshot.size, sentinel, np.int64)
            for slot in range(snapshot.size):
                info = snapshot.infos[slot]
                if info is not None:
                    row = self.cards.row_of(info.name)
                    if row is not None:
                        rows[slot] = row
            self._rows, self._rows_key = rows, key
        return self._rows

    # -- Score ------------------------------------------------------------------------------------

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        snapshot = self._snapshot
        if snapshot is None:
            raise RuntimeError("GPUFragmentation.score needs the plugin built with a handle")
        raw = self.score_nodes(state, pod, snapshot, np.array([node.slot], np.int64))
        return int(raw[0])

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        """Raw scores (higher is better; ``normalize_score`` maps them to 0..100)."""
        entry = self._entry(state, pod)
        shape = entry.shape
        if shape is None or len(slots) == 0:
            return np.zeros(len(slots), np.int64)
        rows = self._slot_rows(snapshot)[slots]
        cpu = snapshot.allocatable(CPU)[slots] - snapshot.requested(CPU)[slots]
        raw, cols = self._evaluate(shape, rows, cpu, slots)
        if cols is not None and entry.preference is not None:
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
        self, shape: PodShape, rows: IntArray, cpu: IntArray, slots: IntArray
    ) -> tuple[IntArray, IntArray | None]:
        strategy = self.args.strategy
        free = self.cards.free
        free_rows = free[np.minimum(rows, free.shape[0] - 1)] * (rows < free.shape[0])[:, None]
        if strategy == RANDOM:
            cols = self._random_cards(free_rows, shape) if _shared(shape) else None
            return np.zeros(len(rows), np.int64), cols
        if strategy == BEST_FIT:
            primary, cols = self._best_fit(shape, cpu, free_rows)
        else:
            assert strategy == FRAGMENTATION_GRADIENT
            primary, cols = self._gradient(shape, rows, cpu, free_rows)
        left = free_rows.sum(axis=1) - shape.total_gpu_milli
        return self._with_ties(primary, rows, left, slots), cols

    def _gradient(
        self, shape: PodShape, rows: IntArray, cpu: IntArray, free_rows: IntArray
    ) -> tuple[IntArray, IntArray | None]:
        wl = self.workload()
        cache = self._cache
        total, s, c, access = cache.total[rows], cache.s[rows], cache.c[rows], cache.access[rows]
        before = wl.fragmentation(total, s, c, wl.weights(cpu, access))
        cpu_after = cpu - shape.cpu_milli
        cols: IntArray | None = None
        if not shape.needs_gpu:
            after = wl.fragmentation(total, s, c, wl.weights(cpu_after, access))
        elif _shared(shape):
            per_card = wl.after_shared(cpu_after, free_rows, total, s, c, access, shape.gpu_milli)
            cols = _best_cards(per_card, free_rows)
            after = per_card[np.arange(len(rows)), cols]
        else:
            after = wl.after_whole(
                cpu_after, cache.full[rows], total, s, c, access, shape.gpu_count
            )
        delta = after - before
        weight = self.args.stranded_weight
        rate = wl.cpu_per_gpu_milli
        if weight > 0 and rate > 0:
            left = total - shape.total_gpu_milli
            stranded_before = np.maximum(total - cpu / rate, 0.0)
            stranded_after = np.maximum(left - cpu_after / rate, 0.0)
            delta = delta + weight * (stranded_after - stranded_before)
        finite = np.isfinite(delta)
        gain = -np.where(finite, delta, 0.0)
        if self.args.quantization == SIGMOID:
            primary = (100.0 / (1.0 + np.exp(-gain / GPU_MILLI))).astype(np.int64)
        else:
            primary = np.floor(gain / self.args.resolution).astype(np.int64)
        primary[~finite] = -PRIMARY_LIMIT
        return primary, cols

    def _with_ties(
        self, primary: IntArray, rows: IntArray, left: IntArray, slots: IntArray
    ) -> IntArray:
        """``primary``, then each configured tie-break criterion, packed into one int64 key
        (higher is better): SmallestNode (fewest GPU cards), Packing (least GPU left),
        FirstFit (lowest snapshot slot, i.e. the node known longest)."""
        raw: IntArray = np.clip(primary, -PRIMARY_LIMIT, PRIMARY_LIMIT - 1) + PRIMARY_LIMIT
        for criterion in self.args.tie_break:
            width = TIE_BITS[criterion]
            top = (1 << width) - 1
            if criterion == TIE_SMALLEST:
                value = self.cards.n_cards[np.minimum(rows, len(self.cards.n_cards) - 1)]
                value = np.where(rows < self.cards.n_rows, value, 0)
            elif criterion == TIE_PACKING:
                value = np.maximum(left, 0)
            else:
                value = slots
            raw = (raw << width) | (top - np.clip(value, 0, top))
        return raw

    def _best_fit(
        self, shape: PodShape, cpu: IntArray, free_rows: IntArray
    ) -> tuple[IntArray, IntArray | None]:
        gpu_left = free_rows.sum(axis=1) - shape.total_gpu_milli
        cpu_left = cpu - shape.cpu_milli
        waste = 0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU
        raw: IntArray = np.round(-waste * 1e6).astype(np.int64)
        cols = None
        if _shared(shape):
            key = np.where(free_rows >= shape.gpu_milli, free_rows, np.iinfo(np.int64).max)
            cols = np.argmin(key, axis=1).astype(np.int64)
        return raw, cols

    def _random_cards(self, free_rows: IntArray, shape: PodShape) -> IntArray:
        keys = self._np_rng.random(free_rows.shape)
        keys[free_rows < shape.gpu_milli] = np.inf
        out: IntArray = np.argmin(keys, axis=1).astype(np.int64)
        return out

    # -- the card choice DeviceShare asks for --------------------------------------------------

    def preferred_minors(
        self, preference: _Preference, shape: PodShape, node: str
    ) -> tuple[int, ...] | None:
        snapshot = self._snapshot
        if snapshot is None:
            return None
        slot = snapshot.index.get(node)
        if slot is None or slot >= snapshot.size:
            return None
        row = int(self._slot_rows(snapshot)[slot])
        if row >= self.cards.n_rows:
            return None
        best = preference.best
        col = int(best[slot]) if best is not None and slot < len(best) else -1
        if col < 0:
            slots = np.array([slot], np.int64)
            cpu = snapshot.allocatable(CPU)[slots] - snapshot.requested(CPU)[slots]
            _, cols = self._evaluate(shape, np.array([row], np.int64), cpu, slots)
            if cols is None:
                return None
            col = int(cols[0])
        if self.cards.free[row, col] < shape.gpu_milli:
            return None
        return (self.cards.minor(row, col),)

    # -- Reserve ----------------------------------------------------------------------------------

    def reserve(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        annotation = state.get(ALLOCATION_KEY)
        if isinstance(annotation, str) and annotation:
            self.cards.hold(pod.uid, node_name, annotation, reserved=True)
        return None

    def unreserve(self, state: CycleState, pod: Pod, node_name: str) -> None:
        self.cards.release_reservation(pod.uid)


def _shared(shape: PodShape) -> bool:
    return shape.gpu_count == 1 and 0 < shape.gpu_milli < GPU_MILLI


def _best_cards(per_card: F64, free_rows: IntArray) -> IntArray:
    """Per node, the card with the lowest value; ties to the fullest card, then the lowest
    column."""
    low = per_card.min(axis=1, keepdims=True)
    tied = per_card == low
    key = np.where(tied, free_rows, np.iinfo(np.int64).max)
    out: IntArray = np.argmin(key, axis=1).astype(np.int64)
    return out
