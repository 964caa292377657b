"""Per-request feasibility and node score of every ledger row, kept up to date row by row.

Role: DeviceShare's whole-cluster Filter and Score ask, for every pod, ``feasible_rows`` and
``Scorer.score_rows`` over all the ledger's rows — a pass over every card of the cluster —
although between two pods of the same request shape only the rows that a reservation, a bind
or an event touched have changed. ``RequestRows`` keeps both vectors per request shape (the
request's ``types``: all that the two depend on) with the ledger's ``tick`` when they were
last brought up to date, and recomputes only the rows whose ``row_version`` (the tick of
their last change) is newer, and the rows added since.

Invariants: ``feasible(request)`` equals ``feasible_rows(ledger, request)`` and
``scores(request)`` equals ``scorer.score_rows(ledger, request)`` (same length, a trailing
False / 0 for nodes without a row), as long as the ledger changes a row only together with its
``row_version``, set to its ever-growing ``tick`` (the ledger's own invariant; an unchanged
``tick`` skips even the scan); both are read-only views, valid until the next call. Everything is
recomputed when the ledger's row capacity changes. At most ``limit`` shapes are kept (the
least recently used dropped first).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from scheduler.devices.allocator import rows_feasible
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import DeviceRequest, TypeRequest
from scheduler.devices.scoring import Scorer
from scheduler.framework.types import BoolArray, IntArray

__all__ = ["RequestRows"]

_FULL_FRACTION = 8
"""Recompute every row when more than 1/8 of them changed (one pass beats many gathers)."""


class _Rows:
    """One request shape's vectors over ``capacity`` rows (+1 sentinel)."""

    __slots__ = ("capacity", "fits", "n", "scores", "tick")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tick = -1
        """The ledger's ``tick`` when rows ``[0, n)`` were last brought up to date."""
        self.n = 0
        self.fits: BoolArray = np.zeros(capacity + 1, bool)
        self.scores: IntArray = np.zeros(capacity + 1, np.int64)


class RequestRows:
    """``feasible_rows`` and ``score_rows`` per request shape over one ledger (see module)."""

    def __init__(self, ledger: NodeDeviceLedger, scorer: Scorer, limit: int = 32) -> None:
        self.ledger = ledger
        self.scorer = scorer
        self._limit = max(1, limit)
        self._shapes: OrderedDict[tuple[TypeRequest, ...], _Rows] = OrderedDict()

    def feasible(self, request: DeviceRequest) -> BoolArray:
        """``feasible_rows(ledger, request)``, served from the rows that did not change."""
        view: BoolArray = self._current(request).fits[: self.ledger.n_rows + 1].view()
        view.flags.writeable = False
        return view

    def scores(self, request: DeviceRequest) -> IntArray:
        """``scorer.score_rows(ledger, request)``, served from the rows that did not change."""
        view: IntArray = self._current(request).scores[: self.ledger.n_rows + 1].view()
        view.flags.writeable = False
        return view

    def _current(self, request: DeviceRequest) -> _Rows:
        ledger = self.ledger
        key = request.types
        capacity = ledger.row_capacity
        entry = self._shapes.get(key)
        if entry is not None:
            self._shapes.move_to_end(key)
        if entry is None or entry.capacity != capacity:
            entry = _Rows(capacity)
            self._shapes[key] = entry
            if len(self._shapes) > self._limit:
                self._shapes.popitem(last=False)
        n = ledger.n_rows
        if n == 0 or (entry.tick == ledger.tick and entry.n == n):
            return entry  # nothing changed since (the second call of a cycle, say)
        # Rows changed since (their version is the tick of their last change), and new rows.
        changed = np.flatnonzero(ledger.row_version[: entry.n] > entry.tick)
        if len(changed) * _FULL_FRACTION > n:
            self._refresh(entry, request, slice(0, n))
        else:
            if len(changed):
                self._refresh(entry, request, changed)
            if entry.n < n:
                self._refresh(entry, request, slice(entry.n, n))
        entry.tick, entry.n = ledger.tick, n
        return entry

    def _refresh(self, entry: _Rows, request: DeviceRequest, rows: IntArray | slice) -> None:
        entry.fits[rows] = rows_feasible(self.ledger, request, rows)
        entry.scores[rows] = self.scorer.rows_score(self.ledger, request, rows)
