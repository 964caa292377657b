"""One ledger row's feasibility for a request, in Python ints: ``rows_feasible`` for a few rows.

Role: ``allocator.rows_feasible`` answers for many rows at once with numpy (``card_fits``);
after one placement, a cache refresh (``rowcache.RequestRows``) asks about one or two rows,
where numpy's per-call cost is most of the work. ``row_feasible`` is the same test card by
card: a healthy card whose free amounts cover the per-card request (memory completed from
the ratio, or the ratio from memory, as ``card_fits`` computes them), then ``count`` such
cards (at least one) per requested type.

Invariants: ``row_feasible(ledger, request, row) == rows_feasible(ledger, request,
slice(row, row + 1))[0]`` for every row (property-tested through ``RequestRows``).
"""

from __future__ import annotations

from typing import Final

from apis.resources import DEVICE_GPU
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import (
    GPU_CORE_INDEX,
    GPU_MEMORY_INDEX,
    GPU_RATIO_INDEX,
    DeviceRequest,
    TypeRequest,
)

__all__ = ["FEW_ROWS", "row_feasible"]


FEW_ROWS: Final = 4
"""Up to this many rows, ``rows_feasible`` decides row by row in Python ints (numpy's
per-call cost dominates a refresh after one placement, which touches one or two rows)."""


def row_feasible(ledger: NodeDeviceLedger, request: DeviceRequest, row: int) -> bool:
    """``rows_feasible`` of one row: ``card_fits``' test card by card, then the count."""
    for treq in request.types:
        tbl = ledger.table(treq.device_type)
        healthy: list[bool] = tbl.healthy[row].tolist()
        free: list[list[int]] = tbl.free[:, row, :].tolist()
        per = treq.per_device
        if treq.device_type != DEVICE_GPU:
            fits = [h and f >= per[0] for h, f in zip(healthy, free[0], strict=True)]
        else:
            memories: list[int] = tbl.total[GPU_MEMORY_INDEX, row, :].tolist()
            fits = [
                h and _gpu_fits(treq, memory, core, ratio, mem)
                for h, memory, core, ratio, mem in zip(
                    healthy,
                    memories,
                    free[GPU_CORE_INDEX],
                    free[GPU_RATIO_INDEX],
                    free[GPU_MEMORY_INDEX],
                    strict=True,
                )
            ]
        if not (any(fits) if treq.count <= 1 else sum(fits) >= treq.count):
            return False
    return True


def _gpu_fits(
    treq: TypeRequest, card_memory: int, free_core: int, free_ratio: int, free_memory: int
) -> bool:
    """``card_fits``' test of one healthy GPU, as its numpy form computes it."""
    per = treq.per_device
    if treq.requested[GPU_CORE_INDEX] and free_core < per[GPU_CORE_INDEX]:
        return False
    if treq.requested[GPU_RATIO_INDEX]:
        ratio = per[GPU_RATIO_INDEX]
        return free_ratio >= ratio and free_memory >= ratio * card_memory // 100
    memory = per[GPU_MEMORY_INDEX]
    return (
        card_memory > 0
        and free_memory >= memory
        and free_ratio >= memory * 100 // max(card_memory, 1)
    )
