"""Device scoring: which card first (allocation order) and how good a node is (Score).

Role: Koordinator's ``resourceAllocationScorer`` (``scoring.go``) with SPEC §6's integer
formulas. Per weighted resource r: ``requested = used + pod request``; LeastAllocated
``(total - requested) * 100 // total`` (0 when requested exceeds total), MostAllocated
``min(requested, total) * 100 // total``; a resource whose total is 0 is skipped; the score is
``Σ score_r * w_r // Σ w_r`` (0 when nothing is scored).

- Card score (allocation order, ``card_score``): the card's total, ``used = total - free`` and
  the amounts this pod would take from that card (memory and ratio completed).
- Node score (``node_score`` per node, ``score_rows`` for every ledger row at once): the sums
  over all cards of the requested device types, and the pod's converted request
  (``TypeRequest.total``: e.g. ``nvidia.com/gpu: 2`` is gpu-core 200 and ratio 200; memory is
  0 there because it is only known once cards are chosen, as in Koordinator).

Invariants: integer arithmetic only; ``node_score`` and ``score_rows`` agree on every row
(the row sums in the ledger equal the per-card sums); results are in [0, 100].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np

from apis.resources import DEVICE_TYPES, FPGA, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import RESOURCES_BY_TYPE, DeviceRequest
from scheduler.devices.topology import CardView
from scheduler.framework.plugin_args import LEAST_ALLOCATED, MOST_ALLOCATED
from scheduler.framework.types import IntArray

__all__ = ["DEFAULT_RESOURCES", "MAX_SCORE", "Scorer", "ScoringPolicy", "ScoringStrategy"]

MAX_SCORE: Final = 100
FEW_ROWS: Final = 4
"""Up to this many rows, ``rows_score`` computes in Python ints (cheaper than numpy calls)."""

DEFAULT_RESOURCES: Final[tuple[tuple[str, int], ...]] = (
    (GPU_MEMORY_RATIO, 1),
    (GPU_MEMORY, 1),
    (RDMA, 1),
    (FPGA, 1),
)
"""Koordinator's v1beta3 default weights (DeviceShare's args default to them)."""


class ScoringStrategy(Protocol):
    """What a scorer is configured with (DeviceShare's args are one)."""

    @property
    def strategy(self) -> str: ...

    @property
    def resources(self) -> tuple[tuple[str, int], ...]: ...


@dataclass(frozen=True, slots=True)
class ScoringPolicy:
    """A plain ``ScoringStrategy`` for front ends without plugin args (extender, gangs)."""

    strategy: str = LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES


class Scorer:
    """The configured strategy and weights, applied to cards and nodes."""

    def __init__(self, args: ScoringStrategy | None = None) -> None:
        args = args if args is not None else ScoringPolicy()
        self.most_allocated = args.strategy == MOST_ALLOCATED
        weights = dict(args.resources)
        self.weights: Mapping[str, tuple[tuple[int, int], ...]] = {
            t: tuple((i, weights[r]) for i, r in enumerate(RESOURCES_BY_TYPE[t]) if r in weights)
            for t in DEVICE_TYPES
        }

    def resource_score(self, requested: int, total: int) -> int:
        if total <= 0:
            return 0
        if self.most_allocated:
            return min(requested, total) * MAX_SCORE // total
        if requested > total:
            return 0
        return (total - requested) * MAX_SCORE // total

    def card_score(self, device_type: str, card: CardView, amounts: Sequence[int]) -> int:
        """How good it is to take ``amounts`` from ``card`` (higher first)."""
        return self.amounts_score(device_type, card.total, card.free, amounts)

    def amounts_score(
        self,
        device_type: str,
        total: Sequence[int],
        free: Sequence[int],
        amounts: Sequence[int],
    ) -> int:
        """``card_score`` of a card given as its ``total`` and ``free`` amounts (aligned with
        the type's resources), for callers that read cards from the ledger's rows."""
        score = weight_sum = 0
        for i, w in self.weights[device_type]:
            card_total = total[i]
            if card_total == 0:
                continue
            requested = card_total - free[i] + amounts[i]
            score += self.resource_score(requested, card_total) * w
            weight_sum += w
        return score // weight_sum if weight_sum else 0

    def node_score(self, cards: Mapping[str, Sequence[CardView]], request: DeviceRequest) -> int:
        """The node's score for ``request``; ``cards`` per requested device type."""
        score = weight_sum = 0
        for treq in request.types:
            views = cards.get(treq.device_type, ())
            for i, w in self.weights[treq.device_type]:
                total = sum(c.total[i] for c in views)
                if total == 0:
                    continue
                allocated = sum(c.total[i] - c.free[i] for c in views)
                score += self.resource_score(allocated + treq.total[i], total) * w
                weight_sum += w
        return score // weight_sum if weight_sum else 0

    def score_rows(self, ledger: NodeDeviceLedger, request: DeviceRequest) -> IntArray:
        """``node_score`` of every ledger row, plus a trailing 0 (for nodes without a row)."""
        n = ledger.n_rows
        out: IntArray = np.zeros(n + 1, np.int64)
        out[:n] = self.rows_score(ledger, request, slice(0, n))
        return out

    def rows_score(
        self, ledger: NodeDeviceLedger, request: DeviceRequest, rows: IntArray | slice
    ) -> IntArray:
        """``score_rows`` for the given ledger ``rows`` only (each must be < ``n_rows``)."""
        if not isinstance(rows, slice) and len(rows) <= FEW_ROWS:
            return self._few_rows_score(ledger, request, rows.tolist())
        score: IntArray | None = None
        weight_sum: IntArray | None = None
        for treq in request.types:
            tbl = ledger.table(treq.device_type)
            for i, w in self.weights[treq.device_type]:
                total = tbl.sum_total[i][rows]
                present = total > 0
                capacity = np.where(present, total, 1)
                requested = tbl.sum_alloc[i][rows] + treq.total[i]
                if self.most_allocated:
                    s = np.minimum(requested, capacity) * MAX_SCORE // capacity
                else:
                    s = np.where(
                        requested > capacity, 0, (capacity - requested) * MAX_SCORE // capacity
                    )
                part = np.where(present, s * w, 0)
                score = part if score is None else score + part
                weight_sum = present * w if weight_sum is None else weight_sum + present * w
        if score is None or weight_sum is None:
            size = len(range(ledger.n_rows)[rows]) if isinstance(rows, slice) else len(rows)
            return np.zeros(size, np.int64)
        out: IntArray = score // np.maximum(weight_sum, 1)
        return out

    def _few_rows_score(
        self, ledger: NodeDeviceLedger, request: DeviceRequest, rows: list[int]
    ) -> IntArray:
        """``rows_score`` in Python ints, row by row: the same formula for a few rows, without
        numpy's per-call cost (a refresh after one placement touches one or two rows)."""
        terms = [
            (treq.total[i], w, tbl.sum_total[i], tbl.sum_alloc[i])
            for treq in request.types
            for tbl in (ledger.table(treq.device_type),)
            for i, w in self.weights[treq.device_type]
        ]
        out: list[int] = []
        for row in rows:
            score = weight_sum = 0
            for add, w, sum_total, sum_alloc in terms:
                total = int(sum_total[row])
                if total <= 0:
                    continue
                score += self.resource_score(int(sum_alloc[row]) + add, total) * w
                weight_sum += w
            out.append(score // max(weight_sum, 1))
        return np.array(out, np.int64)
