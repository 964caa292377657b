"""GPU fragmentation of a node for a target workload (the FGD paper's measure), exact and fast.

Role: the arithmetic of "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (Weng et al., USENIX ATC '23, §3.2), as its artifact
(hkust-adsl/kubernetes-scheduler-simulator, ``pkg/utils/frag.go``) computes it. A node has
``cpu`` millicores free and cards with ``free`` milli-GPU each (1000 = a whole idle card). A
task shape ``m`` asks for ``cpu_m`` and ``k_m`` cards of ``g_m`` milli each (``k_m = 0``: a
CPU-only task). From ``m``'s point of view the node's fragmented GPU amount ``F_n(m)`` is:

- all the node's free GPU when ``m`` cannot run there at all — it needs no GPU (the paper's
  x-axis cases XL/XR: idle GPUs are of no use to it), the node's model is not one ``m``
  accepts, the node lacks cpu (Q1, Q4), or fewer than ``k_m`` cards have ``g_m`` free (Q2);
- otherwise (Q3) the free GPU on the cards that cannot hold ``g_m``:
  ``Σ_c free_c · [free_c < g_m]``.

For a target workload ``M`` (shapes with popularity ``p_m``, summing to 1) the node's
fragmentation is the expectation ``F_n(M) = Σ_m p_m F_n(m)``, and the fragmentation gradient of
a placement is ``F_n'(M) - F_n(M)``, where ``n'`` is the node after the placement. FGD places a
task where that increase is smallest.

``node_fragmentation`` is the reference, written as the definition reads. ``Workload`` is the
fast form used by the scheduler plugin and the simulator's metrics: with
``T = Σ_c free_c``, ``S_m = Σ_c free_c [free_c ≥ g_m]`` and ``C_m = Σ_c [free_c ≥ g_m]``,
``F_n(M) = T - Σ_m p_m · ok_m · S_m`` where ``ok_m = cpu ≥ cpu_m ∧ C_m ≥ k_m ∧ access_m``.
``S`` and ``C`` depend only on ``(g_m, k_m)``, so shapes are grouped by it (the *groups*, far
fewer than shapes) and the cpu/model part is folded into per-group weights
``W_q = Σ_{m in q} p_m [cpu ≥ cpu_m ∧ access_m]``. Absent cards are cards with 0 free.

Exactness: a ``Workload``'s popularities are rounded to multiples of ``2**-P_BITS``. With
integer amounts below ``2**(53 - P_BITS)`` milli-GPU per node, every product and sum of the
measure is then exact in float64, so ``F_n(M)`` does not depend on the order of the additions:
the vectorized forms (any batch shape, BLAS included) and the reference give bitwise-equal
results, and a plugin's per-node and whole-cluster forms can be compared for equality.

Invariants: pure functions; every vectorized result equals the reference exactly (for the
workload's rounded popularities, ``as_mapping``), so ties between identical nodes stay ties;
amounts are integers in milli-GPU and millicores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "GPU_MILLI",
    "PodShape",
    "Workload",
    "node_fragmentation",
    "typical_shapes",
]

GPU_MILLI: Final = 1000
P_BITS: Final = 36
"""Popularities are multiples of 2**-P_BITS (exact arithmetic up to 2**17 milli per node)."""

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, order=True)
class PodShape:
    """A task shape: cpu millicores, ``gpu_count`` cards of ``gpu_milli`` each (both 0 for a
    CPU-only task), and the GPU models it accepts (empty: any)."""

    cpu_milli: int
    gpu_milli: int = 0
    gpu_count: int = 0
    models: tuple[str, ...] = ()

    @property
    def needs_gpu(self) -> bool:
        return self.gpu_count > 0 and self.gpu_milli > 0

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    def accepts(self, model: str) -> bool:
        return not self.models or model in self.models


def node_fragmentation(
    cpu_free: int, card_free: Sequence[int], model: str, shapes: Mapping[PodShape, float]
) -> float:
    """``F_n(M)`` by the definition, one shape at a time (the reference for tests)."""
    total = sum(card_free)
    frag = 0.0
    for shape, p in shapes.items():
        if not shape.needs_gpu or not shape.accepts(model):
            frag += p * total
            continue
        fitting = sum(1 for v in card_free if v >= shape.gpu_milli)
        if fitting >= shape.gpu_count and cpu_free >= shape.cpu_milli:
            frag += p * sum(v for v in card_free if v < shape.gpu_milli)
        else:
            frag += p * total
    return frag


def typical_shapes(
    counts: Mapping[PodShape, float], popularity: float = 0.95
) -> dict[PodShape, float]:
    """The paper's "typical pods": the most frequent shapes that together make up at least
    ``popularity`` of the count, renormalized to sum to 1 (``GetTypicalPods``; ties go to the
    larger shape, as its reverse sort does). ``popularity >= 1`` keeps every shape."""
    total = float(sum(counts.values()))
    if total <= 0:
        return {}
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    chosen: dict[PodShape, float] = {}
    cum = 0.0
    for shape, n in ordered:
        if cum >= popularity * total:
            break
        chosen[shape] = n
        cum += n
    return {shape: n / cum for shape, n in chosen.items()}


@dataclass(frozen=True, slots=True)
class _Groups:
    g: I64  # (Q,) per-card milli of each (g, k) group
    k: I64  # (Q,) cards needed
    member: I64  # (M,) group index of each GPU shape, -1 for CPU-only shapes


def _groups(shapes: Sequence[PodShape]) -> _Groups:
    keys: dict[tuple[int, int], int] = {}
    member = []
    for s in shapes:
        if not s.needs_gpu:
            member.append(-1)
            continue
        member.append(keys.setdefault((s.gpu_milli, s.gpu_count), len(keys)))
    g = np.array([gk[0] for gk in keys], np.int64)
    k = np.array([gk[1] for gk in keys], np.int64)
    return _Groups(g, k, np.array(member, np.int64))


@dataclass(slots=True)
class Workload:
    """A target workload in array form: ``F_n(M)`` and gradients for many nodes at once."""

    shapes: tuple[PodShape, ...]
    p: F64
    cpu: I64 = field(init=False)
    groups: _Groups = field(init=False)
    onehot: F64 = field(init=False)
    _access: dict[str, B] = field(init=False, default_factory=dict)
    _rate: dict[str, float] = field(init=False, default_factory=dict)
    _kinds: dict[str, int] = field(init=False, default_factory=dict)
    _thresholds: I64 = field(init=False)
    _tables: F64 = field(init=False)

    def __post_init__(self) -> None:
        scale = float(1 << P_BITS)
        p = np.round(np.asarray(self.p, np.float64) * scale) / scale
        residual = 1.0 - float(p.sum())
        if len(p) and abs(residual) < 1e-6:
            p[int(np.argmax(p))] += residual  # exact: both are multiples of 2**-P_BITS
        self.p = p
        self.cpu = np.array([s.cpu_milli for s in self.shapes], np.int64)
        self.groups = _groups(self.shapes)
        q = len(self.groups.g)
        onehot = np.zeros((len(self.shapes), q), np.float64)
        for i, j in enumerate(self.groups.member.tolist()):
            if j >= 0:
                onehot[i, j] = self.p[i]
        self.onehot = onehot
        self._access = {}
        self._rate = {}
        self._kinds = {}
        self._thresholds = np.unique(self.cpu)
        self._tables = np.zeros((0, len(self._thresholds) + 1, q), np.float64)

    @classmethod
    def of(cls, shapes: Mapping[PodShape, float] | Iterable[tuple[PodShape, float]]) -> Workload:
        """From shape -> weight (normalized here; zero weights dropped), in a canonical order."""
        items = shapes.items() if isinstance(shapes, Mapping) else shapes
        merged: dict[PodShape, float] = {}
        for shape, w in items:
            if w > 0:
                merged[shape] = merged.get(shape, 0.0) + float(w)
        total = sum(merged.values())
        ordered = sorted(merged)
        p = np.array([merged[s] / total for s in ordered], np.float64) if total else np.zeros(0)
        return cls(tuple(ordered), p)

    @property
    def n_groups(self) -> int:
        return len(self.groups.g)

    @property
    def cpu_per_gpu_milli(self) -> float:
        """Millicores the GPU tasks of the workload ask for per milli-GPU (0: no GPU task)."""
        return self._cpu_per_gpu(lambda shape: True)

    def cpu_per_gpu_of(self, model: str) -> float:
        """Millicores per milli-GPU that the GPU tasks able to run on a node of ``model`` ask
        for (0: none can): the cpu that node's GPUs need to be of use, for the stranded-GPU
        look-ahead. Without model constraints it is ``cpu_per_gpu_milli`` exactly."""
        rate = self._rate.get(model)
        if rate is None:
            rate = self._cpu_per_gpu(lambda shape: shape.accepts(model))
            self._rate[model] = rate
        return rate

    def reach_of(self, model: str) -> float:
        """The share of the workload's GPU tasks (by popularity) that accept a node of
        ``model``: 1 without model constraints, 0 without GPU tasks."""
        gpu = reach = 0.0
        for shape, p in zip(self.shapes, self.p.tolist(), strict=True):
            if shape.needs_gpu:
                gpu += p
                reach += p if shape.accepts(model) else 0.0
        return reach / gpu if gpu > 0 else 0.0

    def pinned_of(self, model: str) -> float:
        """The share of the workload's GPU demand (popularity x GPUs asked) that is pinned to
        some models (``models`` set) and may use a node of ``model``: 0 without model
        constraints."""
        gpu = pinned = 0.0
        for shape, p in zip(self.shapes, self.p.tolist(), strict=True):
            if shape.needs_gpu:
                amount = p * shape.total_gpu_milli
                gpu += amount
                if shape.models and shape.accepts(model):
                    pinned += amount
        return pinned / gpu if gpu > 0 else 0.0

    def kind_pinned(self) -> F64:
        """``pinned_of`` each registered model kind, in kind order."""
        out: F64 = np.array([self.pinned_of(m) for m in self._kinds], np.float64)
        return out

    def _cpu_per_gpu(self, admits: Callable[[PodShape], bool]) -> float:
        gpu = cpu = 0.0
        for shape, p in zip(self.shapes, self.p.tolist(), strict=True):
            if shape.needs_gpu and admits(shape):
                gpu += p * shape.total_gpu_milli
                cpu += p * shape.cpu_milli
        return float(cpu / gpu) if gpu > 0 else 0.0

    def as_mapping(self) -> dict[PodShape, float]:
        return dict(zip(self.shapes, self.p.tolist(), strict=True))

    # -- per-node pieces ------------------------------------------------------------------------

    def access(self, model: str) -> B:
        """Which shapes accept a node of ``model`` (a node without GPUs has model "")."""
        mask = self._access.get(model)
        if mask is None:
            mask = np.array([s.accepts(model) for s in self.shapes], bool)
            self._access[model] = mask
        return mask

    def kind(self, model: str) -> int:
        """A small integer naming ``model``'s access pattern, for ``weights`` (registered on
        first use; a node without GPUs has model "")."""
        k = self._kinds.get(model)
        if k is None:
            k = len(self._kinds)
            self._kinds[model] = k
            self._tables = np.concatenate([self._tables, self._table(model)[None]])
        return k

    def _table(self, model: str) -> F64:
        """``W`` for a node of ``model`` at each cpu level: row ``u`` holds the popularity of
        the shapes asking for at most ``_thresholds[u - 1]`` millicores that accept ``model``
        (row 0: none), per group. Every entry is a sum of multiples of ``2**-P_BITS`` below 1,
        so it is exact: the same values as ``ok @ onehot`` in any order of addition."""
        table = np.zeros((len(self._thresholds) + 1, self.n_groups), np.float64)
        start = np.searchsorted(self._thresholds, self.cpu, side="left") + 1
        contrib = self.onehot * self.access(model)[:, None]
        np.add.at(table, start, contrib)
        out: F64 = np.cumsum(table, axis=0)
        return out

    def sums(self, free: I64) -> tuple[I64, I64]:
        """``S`` and ``C`` per node and group for card frees ``free`` (nodes x cards)."""
        ge = free[:, :, None] >= self.groups.g
        s: I64 = np.where(ge, free[:, :, None], 0).sum(axis=1)
        c: I64 = ge.sum(axis=1)
        return s, c

    def weights(self, cpu_free: I64, access: B | I64) -> F64:
        """``W`` per node and group: the popularity of the shapes that the node's cpu and
        model admit (nodes x groups). ``access``: which shapes accept each node (nodes x
        shapes), or each node's model ``kind`` (a lookup in a per-kind table by cpu level:
        the same values, without the nodes x shapes pass)."""
        if access.ndim == 1:
            level = np.searchsorted(self._thresholds, cpu_free, side="right")
            looked: F64 = self._tables[access, level]
            return looked
        ok = (cpu_free[:, None] >= self.cpu) & access
        w: F64 = ok.astype(np.float64) @ self.onehot
        return w

    def fragmentation(self, total: I64, s: I64, c: I64, w: F64) -> F64:
        """``F_n(M)`` from the node pieces (any leading shape, groups last)."""
        usable = np.where(c >= self.groups.k, s, 0)
        out: F64 = total - (w * usable).sum(axis=-1)
        return out

    def node_values(self, cpu_free: I64, free: I64, access: B | I64) -> F64:
        """``F_n(M)`` of each node (``access``: nodes x shapes)."""
        s, c = self.sums(free)
        return self.fragmentation(free.sum(axis=1), s, c, self.weights(cpu_free, access))

    # -- what a placement would leave -------------------------------------------------------------

    def after_shared(
        self, cpu_after: I64, free: I64, total: I64, s: I64, c: I64, access: B | I64, g: int
    ) -> F64:
        """``F_n'(M)`` after taking ``g`` milli from each card in turn (nodes x cards); ``inf``
        where the card has less than ``g`` free. ``cpu_after`` is the node's cpu afterwards."""
        return self.after_cards(cpu_after, free, free - g, free >= g, total, s, c, access)

    def after_cards(
        self,
        cpu_after: I64,
        free: I64,
        after: I64,
        fits: B,
        total: I64,
        s: I64,
        c: I64,
        access: B | I64,
    ) -> F64:
        """``F_n'(M)`` if the pod goes on each card in turn (nodes x cards): card ``j`` is left
        with ``after[:, j]`` instead of ``free[:, j]``; ``inf`` where ``fits`` is False. Only
        the fitting cards are evaluated, and the cards of a node that are alike (the same free
        and the same left, e.g. its idle cards) once: the value depends on nothing else."""
        out: F64 = np.full(free.shape, np.inf)
        node, col = np.nonzero(fits)
        if len(node) == 0:
            return out
        before = free[node, col]
        left = after[node, col]
        span = int(max(before.max(), left.max(), 0)) + 1
        key = (node * span + before) * span + left
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        node, before, left = node[first], before[first], left[first]
        gq = self.groups.g
        ge_b = before[:, None] >= gq
        ge_a = left[:, None] >= gq
        s2 = s[node] + np.where(ge_a, left[:, None], 0) - np.where(ge_b, before[:, None], 0)
        c2 = c[node] + ge_a.astype(np.int64) - ge_b
        w = self.weights(cpu_after[node], access[node])
        values = self.fragmentation(total[node] - (before - left), s2, c2, w)
        out[fits] = values[inverse.reshape(-1)]
        return out

    def after_whole(
        self, cpu_after: I64, full: I64, total: I64, s: I64, c: I64, access: B | I64, k: int
    ) -> F64:
        """``F_n'(M)`` after taking ``k`` idle cards (``inf`` where fewer than ``k`` are idle).
        Which idle cards does not matter: each counts in every group."""
        taken = k * GPU_MILLI
        out = self.fragmentation(total - taken, s - taken, c - k, self.weights(cpu_after, access))
        out[full < k] = np.inf
        return out
