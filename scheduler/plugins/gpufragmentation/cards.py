"""``CardTable``: every node's GPU cards as GPUFragmentation sees them, kept incrementally.

Role: the plugin's own per-node state — for each node a row with the free capacity of each
GPU card in milli-GPU (``min(free gpu-core, free gpu-memory-ratio) * 10``, 1000 = an idle
card), the node's GPU model, and a per-row version that changes whenever the row does, so that
the plugin recomputes its per-node sums only for rows that changed. One table per scheduler
(``Handle.shared_state``), fed on the scheduling thread by:

- Node changes (the ``node.koordinator.sh/gpu-model`` label),
- Device changes (the cards: a healthy card's ``gpu-core`` / ``gpu-memory-ratio``; an
  unhealthy or vanished card has no capacity, its holders stay accounted),
- Pod changes (the ``device-allocated`` annotation of assigned pods of any scheduler; a
  terminal or deleted pod releases its cards),
- the plugin's Reserve/Unreserve (the allocation DeviceShare chose, read from cycle state).

Invariants: a holding is keyed by pod uid and replaced as a whole, so the bind event that
follows our own Reserve (same annotation text) changes nothing; ``free`` is never negative;
columns of a row are its card minors in ascending order (absent columns have 0 free); a
malformed annotation is counted in ``annotation_errors`` and never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from apis.allocation import AllocationDecodeError, decode_allocations
from apis.core import Node, Pod
from apis.device import LABEL_GPU_MODEL, Device
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY_RATIO
from scheduler.framework.events import Change

__all__ = ["ANNOTATION_DEVICE_ALLOCATED", "CardTable", "CardUse", "uses_from_annotation"]

ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
MILLI_PER_PERCENT = 10

I64 = npt.NDArray[np.int64]

CardUse = tuple[int, int, int]
"""(minor, gpu-core percent, gpu-memory-ratio percent) taken from one card."""


def uses_from_annotation(raw: str) -> tuple[CardUse, ...]:
    """The GPU cards of a ``device-allocated`` value; raises ``AllocationDecodeError``."""
    allocations = decode_allocations(raw).get(DEVICE_GPU, ())
    return tuple(
        (a.minor, a.resource_value(GPU_CORE), a.resource_value(GPU_MEMORY_RATIO))
        for a in allocations
    )


@dataclass(slots=True)
class _Holding:
    node: str
    uses: tuple[CardUse, ...]
    annotation: str
    reserved: bool = False


@dataclass(slots=True)
class _Row:
    model: str = ""
    minors: list[int] = field(default_factory=list)
    totals: dict[int, tuple[int, int]] = field(default_factory=dict)
    used: dict[int, list[int]] = field(default_factory=dict)


class CardTable:
    """Rows of card frees (nodes x cards, milli-GPU), models and versions; see the module."""

    def __init__(self, rows: int = 64, cards: int = 8) -> None:
        self.free: I64 = np.zeros((max(1, rows), max(1, cards)), np.int64)
        self.n_cards: I64 = np.zeros(max(1, rows), np.int64)
        """Healthy GPU cards of each row (the node's size in GPUs)."""
        self.version: I64 = np.zeros(max(1, rows), np.int64)
        self._rows: list[_Row] = []
        self._row_of: dict[str, int] = {}
        self._holdings: dict[str, _Holding] = {}
        self._node_model: dict[str, str] = {}
        self.annotation_errors = 0
        self.node_set_generation = 0
        self._tick = 0

    # -- reading ----------------------------------------------------------------------------

    @property
    def n_rows(self) -> int:
        return len(self._rows)

    def row_of(self, node: str) -> int | None:
        return self._row_of.get(node)

    def model(self, row: int) -> str:
        return self._rows[row].model

    def minor(self, row: int, col: int) -> int:
        return self._rows[row].minors[col]

    def holding(self, uid: str) -> tuple[str, tuple[CardUse, ...]] | None:
        h = self._holdings.get(uid)
        return None if h is None else (h.node, h.uses)

    # -- changes ----------------------------------------------------------------------------

    def apply_change(self, change: Change) -> None:
        """The event handler (scheduling thread): Node, Device and Pod changes."""
        if change.kind == "Node":
            node = change.new if change.new is not None else None
            if isinstance(node, Node):
                self._set_model(node.name, node.labels.get(LABEL_GPU_MODEL, ""))
        elif change.kind == "Device":
            if change.new is None:
                if isinstance(change.old, Device):
                    self._set_cards(change.old.name, None)
            elif isinstance(change.new, Device):
                self._set_cards(change.new.name, change.new)
        elif change.kind == "Pod":
            old = change.old if isinstance(change.old, Pod) else None
            new = change.new if isinstance(change.new, Pod) else None
            self.observe_pod(old, new)

    def observe_pod(self, old: Pod | None, new: Pod | None) -> None:
        if new is None:
            if old is not None:
                self.release(old.uid)
            return
        if old is not None and old.uid != new.uid:
            self.release(old.uid)
        if new.terminal or not new.assigned:
            if new.terminal:
                self.release(new.uid)
            return
        raw = new.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if raw is None:
            self.release(new.uid)
            return
        self.hold(new.uid, new.node_name, raw)

    def hold(self, uid: str, node: str, annotation: str, reserved: bool = False) -> None:
        """``uid`` holds what ``annotation`` allocates on ``node``: a bound pod, or our own
        Reserve (``reserved``) until the pod shows the allocation."""
        current = self._holdings.get(uid)
        if current is not None and current.node == node and current.annotation == annotation:
            current.reserved = current.reserved and reserved
            return
        try:
            uses = uses_from_annotation(annotation)
        except AllocationDecodeError:
            self.annotation_errors += 1
            return
        self.release(uid)
        if not uses:
            return
        self._holdings[uid] = _Holding(node, uses, annotation, reserved)
        self._apply(node, uses, 1)

    def release_reservation(self, uid: str) -> None:
        """Drop ``uid``'s holding if it is still only a reservation of ours (Unreserve)."""
        current = self._holdings.get(uid)
        if current is not None and current.reserved:
            self.release(uid)

    def release(self, uid: str) -> None:
        holding = self._holdings.pop(uid, None)
        if holding is not None:
            self._apply(holding.node, holding.uses, -1)

    # -- internals ----------------------------------------------------------------------------

    def _ensure_row(self, node: str) -> int:
        row = self._row_of.get(node)
        if row is not None:
            return row
        row = len(self._rows)
        if row >= self.free.shape[0]:
            self._grow(2 * self.free.shape[0], self.free.shape[1])
        self._rows.append(_Row(model=self._node_model.get(node, "")))
        self._row_of[node] = row
        self.node_set_generation += 1
        return row

    def _grow(self, rows: int, cards: int) -> None:
        free = np.zeros((rows, cards), np.int64)
        free[: self.free.shape[0], : self.free.shape[1]] = self.free
        version = np.zeros(rows, np.int64)
        version[: self.version.shape[0]] = self.version
        n_cards = np.zeros(rows, np.int64)
        n_cards[: self.n_cards.shape[0]] = self.n_cards
        self.free, self.version, self.n_cards = free, version, n_cards

    def _set_model(self, node: str, model: str) -> None:
        self._node_model[node] = model
        row = self._row_of.get(node)
        if row is not None and self._rows[row].model != model:
            self._rows[row].model = model
            self._touch(row)

    def _set_cards(self, node: str, device: Device | None) -> None:
        row = self._ensure_row(node)
        r = self._rows[row]
        totals: dict[int, tuple[int, int]] = {}
        for d in device.devices_of_type(DEVICE_GPU) if device is not None else ():
            if d.minor is None or d.minor in totals:
                continue
            healthy = d.health
            totals[d.minor] = (
                d.resource_value(GPU_CORE) if healthy else 0,
                d.resource_value(GPU_MEMORY_RATIO) if healthy else 0,
            )
        if not r.model and device is not None:
            r.model = device.labels.get(LABEL_GPU_MODEL, "")
        r.totals = totals
        r.minors = sorted(set(totals) | set(r.used))
        self._refresh(row)

    def _apply(self, node: str, uses: Sequence[CardUse], sign: int) -> None:
        row = self._ensure_row(node)
        r = self._rows[row]
        for minor, core, ratio in uses:
            used = r.used.setdefault(minor, [0, 0])
            used[0] += sign * core
            used[1] += sign * ratio
            if used == [0, 0]:
                del r.used[minor]
        minors = sorted(set(r.totals) | set(r.used))
        if minors != r.minors:
            r.minors = minors
        self._refresh(row)

    def _refresh(self, row: int) -> None:
        r = self._rows[row]
        if len(r.minors) > self.free.shape[1]:
            self._grow(self.free.shape[0], max(len(r.minors), 2 * self.free.shape[1]))
        values = []
        for minor in r.minors:
            total_core, total_ratio = r.totals.get(minor, (0, 0))
            used_core, used_ratio = r.used.get(minor, (0, 0))
            free = min(total_core - used_core, total_ratio - used_ratio)
            values.append(max(free, 0) * MILLI_PER_PERCENT)
        self.free[row, :] = 0
        self.free[row, : len(values)] = values
        self.n_cards[row] = sum(1 for t in r.totals.values() if t[0] > 0 and t[1] > 0)
        self._touch(row)

    def _touch(self, row: int) -> None:
        self._tick += 1
        self.version[row] = self._tick
