"""Per-slot columns derived from a snapshot, recomputed only at the slots that changed.

Role: a whole-cluster plugin computes, for every pod, a mask or a score over all the
snapshot's slots, although between two pods only the slots that a placement or an event
touched have changed (``Snapshot.slot_version``: the snapshot's ``tick`` at each slot's last
change). ``SlotColumns`` keeps one such column per key (what the column depends on besides
the slots' columns: a pod's requests, say) with the ``tick`` it was last brought up to date
at, and asks its ``compute`` function only for the slots changed since and the new ones.

Invariants: ``get(snapshot, key, compute)`` equals ``compute(slice(0, snapshot.size))`` as
long as ``compute``'s value at a slot depends only on ``key`` and that slot's columns (the
ones ``slot_version`` covers; an unchanged ``Snapshot.tick`` skips even the scan); the
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
    __slots__ = ("capacity", "size", "snapshot", "tick", "values")

    def __init__(self, snapshot: Snapshot, values: Column) -> None:
        self.snapshot = snapshot
        self.values = values
        self.capacity = snapshot.capacity
        self.tick, self.size = snapshot.tick, snapshot.size  # when last brought up to date


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
            or entry.capacity != snapshot.capacity
            or entry.size > size
        ):
            full = compute(slice(0, size))
            values = np.empty(snapshot.capacity, dtype=full.dtype)
            values[:size] = full
            entry = _Column(snapshot, values)
            self._columns[key] = entry
            if len(self._columns) > self._limit:
                self._columns.popitem(last=False)
        elif entry.tick != snapshot.tick or entry.size != size:
            # Slots changed since (their version is the tick of their last change), new slots.
            changed = np.flatnonzero(snapshot.slot_version[: entry.size] > entry.tick)
            if len(changed) * _FULL_FRACTION > size:
                entry.values[:size] = compute(slice(0, size))
            else:
                if len(changed):
                    entry.values[changed] = compute(changed)
                if entry.size < size:
                    entry.values[entry.size : size] = compute(slice(entry.size, size))
            entry.tick, entry.size = snapshot.tick, size
        view: Column = entry.values[:size].view()
        view.flags.writeable = False
        return view
