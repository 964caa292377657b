"""The card matrices of one device type, and the cards of one node's row.

Role: the numpy half of ``NodeDeviceLedger`` (``ledger.py`` keeps the holdings and the events).
Per device type a ``CardTable`` holds ``resources x rows x cards`` int64 matrices ``total``,
``used`` and ``free``, ``rows x cards`` masks ``exists``/``healthy``, per-row sums of ``total``
and of the allocated part ``total - free``, and ``share``: the free part of each card in
thousandths, ``min_r(free_r * 1000 // total_r)`` over the card's declared resources (``SHARE``
= an idle card, 0 for an unhealthy or undeclared one). ``RowCards`` maps a row's columns to
card minors and ``CardMeta``. ``card_views`` reads a row back as ``CardView`` records, with
what-if amounts taken off (``node_view``'s removed and added holdings).

Invariants: ``free = max(total - used, 0)`` and ``share``/``sum_alloc`` follow ``used`` after
every ``refresh``/``refresh_used``; growing (by doubling) keeps every value in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.devices.request import RESOURCE_INDEX, CardUse
from scheduler.devices.topology import CardMeta, CardView

__all__ = ["SHARE", "CardTable", "RowCards", "accumulate", "card_views"]

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

SHARE = 1000
"""``share`` of an idle card (thousandths)."""


@dataclass(slots=True)
class RowCards:
    """Per row and type: the card of each column (None = held but not in the CR)."""

    cols: list[CardMeta | None] = field(default_factory=list)
    minors: list[int] = field(default_factory=list)
    col_of: dict[int, int] = field(default_factory=dict)


class CardTable:
    """The matrices of one device type."""

    def __init__(self, n_res: int, rows: int, cards: int) -> None:
        self.n_res = n_res
        self.total: I64 = np.zeros((n_res, rows, cards), np.int64)
        self.used: I64 = np.zeros((n_res, rows, cards), np.int64)
        self.free: I64 = np.zeros((n_res, rows, cards), np.int64)
        self.exists: B = np.zeros((rows, cards), bool)
        self.healthy: B = np.zeros((rows, cards), bool)
        self.sum_total: I64 = np.zeros((n_res, rows), np.int64)
        self.sum_alloc: I64 = np.zeros((n_res, rows), np.int64)
        self.share: I64 = np.zeros((rows, cards), np.int64)
    @property
    def cards(self) -> int:
        return int(self.exists.shape[1])

    def grow(self, rows: int, cards: int) -> None:
        for name in (
            "total", "used", "free", "exists", "healthy", "sum_total", "sum_alloc", "share"
        ):
            old = getattr(self, name)
            shape = {3: (self.n_res, rows, cards), 2: (rows, cards)}[old.ndim]
            if name.startswith("sum_"):
                shape = (self.n_res, rows)
            new = np.zeros(shape, old.dtype)
            new[tuple(slice(0, n) for n in old.shape)] = old
            setattr(self, name, new)

    def refresh(self, row: int, cols: Iterable[int]) -> None:
        idx = np.fromiter(cols, np.int64)
        total = self.total[:, row, idx]
        free = np.maximum(total - self.used[:, row, idx], 0)
        self.free[:, row, idx] = free
        declared = total > 0
        part = np.where(declared, free * SHARE // np.maximum(total, 1), SHARE)
        self.share[row, idx] = np.where(declared.any(axis=0), part.min(axis=0), 0)
        self.sum_total[:, row] = self.total[:, row, :].sum(axis=1)
        self.sum_alloc[:, row] = self.sum_total[:, row] - self.free[:, row, :].sum(axis=1)

    def refresh_used(self, row: int, cols: Iterable[int]) -> None:
        """``refresh`` after only ``used`` of ``cols`` changed (totals as they were): each
        card's ``free`` and ``share`` recomputed and the row's ``sum_alloc`` moved by the
        change in ``free``, in Python ints (a holding touches a few cards; numpy's per-call
        cost would dominate)."""
        moved: list[int] | None = None
        for col in cols:
            total = self.total[:, row, col].tolist()
            used = self.used[:, row, col].tolist()
            old = self.free[:, row, col].tolist()
            free = [t - u if t > u else 0 for t, u in zip(total, used, strict=True)]
            self.free[:, row, col] = free
            declared = [t > 0 for t in total]
            self.share[row, col] = min(
                f * SHARE // t if d else SHARE
                for t, f, d in zip(total, free, declared, strict=True)
            ) if any(declared) else 0
            change = [o - f for o, f in zip(old, free, strict=True)]
            moved = change if moved is None else [a + b for a, b in zip(moved, change,
                                                                         strict=True)]
        if moved is not None and any(moved):
            self.sum_alloc[:, row] += moved

    def lay_out(
        self, row: int, metas: Mapping[int, CardMeta], usage: Mapping[tuple[str, int], list[int]],
        device_type: str,
    ) -> RowCards:
        """Lay out ``row`` again: a column per card of the Device CR (``metas``) or held in
        ``usage`` (summed amounts per (type, minor)), by minor; returns the row's columns."""
        minors = sorted(set(metas) | {m for (t, m) in usage if t == device_type})
        self.ensure_cards(len(minors))
        rc = RowCards()
        self.total[:, row, :] = 0
        self.used[:, row, :] = 0
        self.exists[row, :] = False
        self.healthy[row, :] = False
        for col, minor in enumerate(minors):
            meta = metas.get(minor)
            rc.cols.append(meta)
            rc.minors.append(minor)
            rc.col_of[minor] = col
            if meta is not None:
                self.exists[row, col] = True
                self.healthy[row, col] = meta.healthy
                if meta.healthy:
                    self.total[:, row, col] = meta.declared
            used = usage.get((device_type, minor))
            if used is not None:
                self.used[:, row, col] = used
        self.refresh(row, range(self.cards))
        return rc

    def ensure_cards(self, n: int) -> None:
        """At least ``n`` card columns (doubling)."""
        if n > self.cards:
            cap = self.cards
            while cap < n:
                cap *= 2
            self.grow(int(self.exists.shape[0]), cap)


def card_views(
    tbl: CardTable,
    rc: RowCards,
    row: int,
    device_type: str,
    minus: Mapping[tuple[str, int], list[int]],
) -> tuple[CardView, ...]:
    """The row's cards, by minor, with ``minus`` (amounts per (type, minor)) taken off ``used``."""
    n = len(rc.cols)
    total = tbl.total[:, row, :n].T.tolist()
    used = tbl.used[:, row, :n].T.tolist()
    healthy = tbl.healthy[row, :n].tolist()
    views = []
    for col in range(n):
        sub = minus.get((device_type, rc.minors[col]))
        u = tuple(used[col]) if sub is None else tuple(
            x - y for x, y in zip(used[col], sub, strict=True)
        )
        tot = tuple(total[col])
        views.append(
            CardView(
                minor=rc.minors[col],
                exists=rc.cols[col] is not None,
                healthy=bool(healthy[col]),
                total=tot,
                used=u,
                free=tuple(max(a - b, 0) for a, b in zip(tot, u, strict=True)),
                meta=rc.cols[col],
            )
        )
    views.sort(key=lambda v: v.minor)
    return tuple(views)


def accumulate(into: dict[tuple[str, int], list[int]], use: CardUse, sign: int) -> None:
    """Add ``sign`` x ``use``'s amounts to ``into[(type, minor)]`` (the type's resource order)."""
    index = RESOURCE_INDEX.get(use.device_type)
    if index is None:
        return
    acc = into.setdefault((use.device_type, use.minor), [0] * len(index))
    for name, amount in use.resources:
        ri = index.get(name)
        if ri is not None:
            acc[ri] += sign * amount
