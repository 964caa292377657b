"""Per-slot columns derived from a snapshot, recomputed only at the slots that changed.

Role: a whole-cluster plugin computes, for every pod, a mask or a score over all the
snapshot's slots, although between two pods only the slots that a placement or an event
touched have changed (``Snapshot.slot_version``). ``SlotColumns`` keeps one such column per
key (what the column depends on besides the slots' columns: a pod's requests, say) with the
version each slot had when it was computed, and asks its ``compute`` function only for the
slots whose version differs.

Invariants: ``get(snapshot, key, compute)`` equals ``compute(slice(0, snapshot.size))`` as
long as ``compute``'s value at a slot depends only on ``key`` and that slot's columns (the
ones ``slot_version`` covers; an unchanged ``Snapshot.tick`` skips even the comparison); the
result is a read-only view, valid until the next call.
A column is recomputed whole for another snapshot or when its capacity changes; at most
``limit`` keys are kept (the least recently used dropped first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler.framework.types import IntArray, Snapshot

__all__ = ["SlotColumns"]

Column = npt.NDArray[Any]
Compute = Callable[[IntArray | slice], Column]

_FULL_FRACTION = 8
"""Recompute every slot when more than 1/8 of them changed (one pass beats many gathers)."""


class _Column:
    __slots__ = ("size", "snapshot", "tick", "values", "version")

    def __init__(self, snapshot: Snapshot, values: Column) -> None:
        self.snapshot = snapshot
        self.values = values
        self.tick, self.size = snapshot.tick, snapshot.size  # when last brought up to date
        self.version: IntArray = snapshot.slot_version.copy()
        self.version[snapshot.size :] = -1  # not computed: recomputed once they are in use


class SlotColumns:
    """Columns per key over one snapshot's slots (see the module docstring)."""

    def __init__(self, limit: int = 32) -> None:
        self._limit = max(1, limit)
        self._columns: OrderedDict[Hashable, _Column] = OrderedDict()

    def get(self, snapshot: Snapshot, key: Hashable, compute: Compute) -> Column:
        size = snapshot.size
        entry = self._columns.get(key)
        if entry is not None:
            self._columns.move_to_end(key)
        if (
            entry is None
            or entry.snapshot is not snapshot
            or len(entry.version) != len(snapshot.slot_version)
        ):
            full = compute(slice(0, size))
            values = np.empty(snapshot.capacity, dtype=full.dtype)
            values[:size] = full
            entry = _Column(snapshot, values)
            self._columns[key] = entry
            if len(self._columns) > self._limit:
                self._columns.popitem(last=False)
        elif entry.tick != snapshot.tick or entry.size != size:
            versions = snapshot.slot_version[:size]
            dirty = np.flatnonzero(entry.version[:size] != versions)
            if len(dirty):
                slots: IntArray | slice = (
                    slice(0, size) if len(dirty) * _FULL_FRACTION > size else dirty
                )
                entry.values[slots] = compute(slots)
                entry.version[slots] = versions[slots]
            entry.tick, entry.size = snapshot.tick, size
        view: Column = entry.values[:size].view()
        view.flags.writeable = False
        return view
