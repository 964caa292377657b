"""A lower bound on the unallocated GPU % that any placement could reach (B3's "best possible").

Role: for one replay (trace, seed) take the pods that have arrived when the arrived GPU request
reaches 100 % of the cluster's GPU capacity, and bound from above the GPU (milli) that ANY
placement of them — online or offline, with any knowledge of the future — could allocate on
the trace's nodes. ``100 - bound / capacity`` is then a lower bound on the unallocated GPU % at
100 % arrival: no policy can go below it, so the distance between a policy's figure and the
bound is the most an online policy could still win.

The relaxation: nodes are grouped into classes (cpu, memory, GPUs, model) with a count ``N_g``,
pods into shapes (cpu, memory, GPUs, milli per GPU, allowed models) with a count ``c_s``, and
``x[g, s]`` counts pods of shape ``s`` on class ``g``. Any real placement gives counts that
satisfy every row below, so the optimum of the relaxation is an upper bound on the allocation:

- ``Σ_g x[g, s] ≤ c_s`` (a pod is placed at most once; pods may stay unplaced);
- ``x[g, s] = 0`` where the pod cannot run on one node of the class alone (model not allowed,
  more GPUs, cpu or memory than the node has);
- per class, the summed cpu, memory and GPU milli of its pods fit ``N_g`` nodes' totals;
- per class, card counting: a card holds one whole-GPU share or at most ``k - 1`` fractional
  shares larger than ``1/k`` of a card, so ``(k-1)·(whole GPUs) + #(shares > 1000/k) ≤
  (k-1)·cards`` for k = 2, 3, 4;
- per class, at most one pod per node that takes more than half of the node's cpu, memory or
  (whole) GPUs.

What it relaxes: the per-node split inside a class (nodes of a class pool their cpu, memory and
cards), the exact per-card packing beyond the counting rows above, and the arrival order (the
bound is offline). CPU-only pods are left out: dropping them never lowers the GPU that can be
allocated. The counts are solved as integers by HiGHS (MILP) within a time limit; the solver's
dual bound is an upper bound on the optimum whether or not the search finished, so the result
is always valid, and ``exact`` says whether the relaxation was solved to optimality.

HiGHS comes from ``highspy`` (the optional ``bound`` extra); without it ``gpu_bound`` raises
``BoundUnavailable`` with one line saying how to install it.

Invariants: the bound never exceeds the arrived GPU request nor the capacity; it is a pure
function of the node rows and the arrived pods.
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from scheduler.simulator.trace import GPU_MILLI, TraceNode, TracePod

__all__ = [
    "Bound",
    "BoundUnavailable",
    "arrived_at",
    "gpu_bound",
]

CARD_SPLITS: Final = (2, 3, 4)
"""``k`` of the card-counting rows: a card holds at most ``k - 1`` shares above ``1/k``."""

DEFAULT_TIME_LIMIT: Final = 20.0


class BoundUnavailable(RuntimeError):
    """The solver is not installed; ``str()`` says how to get it."""


@dataclass(frozen=True, slots=True)
class Bound:
    capacity_milli: int
    arrived_milli: int
    allocatable_milli: float
    """Upper bound on the GPU (milli) any placement of the arrived pods allocates."""
    exact: bool
    """True when the relaxation was solved to optimality (else the solver's dual bound)."""

    @property
    def unallocated_pct(self) -> float:
        """Lower bound on the unallocated GPU % of capacity."""
        if not self.capacity_milli:
            return 0.0
        return 100.0 - 100.0 * self.allocatable_milli / self.capacity_milli


def arrived_at(
    pods: Sequence[TracePod], capacity_milli: int, percent: int = 100
) -> list[TracePod] | None:
    """The pods (a prefix of ``pods``, in arrival order) that have arrived by the last point
    the report averages into arrival ``percent`` (``replay_report.discretize``: every pod
    whose arrived GPU request rounds to ``percent`` of the capacity, or to within one percent
    of it when none does). The allocatable GPU only grows as pods arrive, so the bound for the
    last of those points is a lower bound for each of them, hence for their mean. ``None``
    when the report has no point there either (one pod jumps over it)."""
    if not capacity_milli:
        return None
    totals = np.cumsum([p.total_gpu_milli for p in pods], dtype=np.int64)
    pct = np.round(totals / float(capacity_milli) * 100.0)
    exact = np.flatnonzero(pct == percent)
    near = exact if exact.size else np.flatnonzero(np.abs(pct - percent) <= 1)
    if not near.size:
        return None
    return list(pods[: int(near[-1]) + 1])


@dataclass(frozen=True, slots=True)
class _Class:
    cpu: int
    memory: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class _Shape:
    cpu: int
    memory: int
    gpus: int
    milli: int
    spec: tuple[str, ...]

    @property
    def total_milli(self) -> int:
        return self.gpus * self.milli

    @property
    def whole(self) -> bool:
        return self.milli >= GPU_MILLI


def _fits(c: _Class, s: _Shape) -> bool:
    return (
        (not s.spec or c.model in s.spec)
        and s.gpus <= c.gpus
        and s.cpu <= c.cpu
        and s.memory <= c.memory
    )


def gpu_bound(
    nodes: Sequence[TraceNode],
    arrived: Sequence[TracePod],
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> Bound:
    """The bound for ``arrived`` (the pods that have arrived) on ``nodes``; see the module."""
    highspy = _highspy()
    capacity = sum(n.gpu_milli for n in nodes)
    arrived_milli = sum(p.total_gpu_milli for p in arrived)
    classes = Counter(_Class(n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes if n.gpus)
    shapes = Counter(
        _Shape(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec)
        for p in arrived
        if p.num_gpu
    )
    pairs = [(c, s) for c in classes for s in shapes if _fits(c, s)]
    if not pairs:
        return Bound(capacity, arrived_milli, 0.0, True)

    h = _quiet_highs(highspy)
    h.setOptionValue("time_limit", float(time_limit))
    x = {
        pair: h.addVariable(lb=0, ub=shapes[pair[1]], type=highspy.HighsVarType.kInteger)
        for pair in pairs
    }
    for s, count in shapes.items():
        _row(h, [(1, x[c, s]) for c in classes if (c, s) in x], count)
    for c, n in classes.items():
        on = [(s, x[c, s]) for s in shapes if (c, s) in x]
        _row(h, [(s.cpu, v) for s, v in on], n * c.cpu)
        _row(h, [(s.memory, v) for s, v in on], n * c.memory)
        _row(h, [(s.total_milli, v) for s, v in on], n * c.gpus * GPU_MILLI)
        for k in CARD_SPLITS:
            terms = [((k - 1) * s.gpus, v) for s, v in on if s.whole]
            terms += [(1, v) for s, v in on if not s.whole and s.milli * k > GPU_MILLI]
            _row(h, terms, (k - 1) * n * c.gpus)
        _row(h, [(1, v) for s, v in on if 2 * s.cpu > c.cpu], n)
        _row(h, [(1, v) for s, v in on if 2 * s.memory > c.memory], n)
        _row(h, [(1, v) for s, v in on if s.whole and 2 * s.gpus > c.gpus], n)
    h.maximize(sum(s.total_milli * v for (_, s), v in x.items()))
    status = h.getModelStatus()
    info = h.getInfo()
    optimal = status == highspy.HighsModelStatus.kOptimal
    value = float(h.getInfo().objective_function_value) if optimal else float(info.mip_dual_bound)
    if not math.isfinite(value):
        # No useful dual bound (the search stopped before any): fall back to the trivial one.
        value = float(min(capacity, arrived_milli))
        optimal = False
    value = min(value, float(capacity), float(arrived_milli))
    return Bound(capacity, arrived_milli, value, optimal)


def _row(h: Any, terms: list[tuple[int, Any]], upper: float) -> None:
    terms = [(a, v) for a, v in terms if a]
    if terms:
        h.addConstr(sum(a * v for a, v in terms) <= upper)


def _quiet_highs(highspy: Any) -> Any:
    """A solver with its output off. HiGHS prints a banner on the C-level stdout when it is
    constructed, before any option can be set; that one moment goes to /dev/null so that the
    report on stdout stays clean (the CLI computes bounds on one thread)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.silent()
    return h


def _highspy() -> Any:
    try:
        import highspy  # optional extra, imported on use
    except ImportError:
        raise BoundUnavailable(
            "the bound needs the HiGHS solver: pip install 'koord-py[bound]' (highspy)"
        ) from None
    return highspy
