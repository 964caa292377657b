"""GPU partition tables in the allocator: which table partition a pod gets (Koordinator's
``allocateByPartition`` and ``selectPartitionByBinPack``, ``allocator_gpu.go``).

Role: given the candidate cards of a whole-GPU request (free, healthy, matching the hint's
selector), the node's ``NodeMeta`` (table and ``gpu-partition-policy``) and the pod's
``gpu-partition-spec``, choose the cards of one table partition, or say why none.

The node honors partitions when its policy is ``Honor`` or the pod has a spec. Then:

- no table on the node: UnschedulableAndUnresolvable ``node(s) missing GPU Partition Table``;
- no partition of the pod's card count: UnschedulableAndUnresolvable ``node(s) Unsupported
  number of GPU requests``;
- no partition fits: Unschedulable ``Insufficient Partitioned GPU Devices``.

Otherwise (``Prefer`` and no spec) each of these is None: the caller falls back to its usual
choice. A partition fits when all its cards are candidates and, if the pod asks for a
``ringBusBandwidth``, its own is at least that. Score groups are tried best
``allocationScore`` first; the first group with a fitting partition is used, and a
``Restricted`` pod tries the best group only. Among the fitting partitions of that group the
one that leaves the most of the table's larger partitions whole wins (bin packing: for each
size >= max(count, 2), every best-score partition of that size still entirely free adds its
``allocationScore`` x 100^i, i the size's index among those sizes ascending), then the lowest
minors.

Invariants: pure and deterministic; the chosen cards are candidates; never mutates its input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from apis.partition import GPUPartition, PartitionSpec, PartitionTable
from scheduler.devices.topology import CardView, NodeMeta
from scheduler.framework.status import Status, unresolvable, unschedulable

__all__ = [
    "ERR_INSUFFICIENT_PARTITIONED",
    "ERR_MISSING_PARTITION_TABLE",
    "ERR_UNSUPPORTED_GPU_COUNT",
    "choose_partition",
    "uses_partitions",
]

ERR_MISSING_PARTITION_TABLE: Final = "node(s) missing GPU Partition Table"
ERR_UNSUPPORTED_GPU_COUNT: Final = "node(s) Unsupported number of GPU requests"
ERR_INSUFFICIENT_PARTITIONED: Final = "Insufficient Partitioned GPU Devices"


def uses_partitions(meta: NodeMeta, spec: PartitionSpec | None) -> bool:
    """Whether the partition step has anything to do on this node for this pod."""
    return spec is not None or meta.honor_partitions or meta.partitions is not None


def _mask(minors: Sequence[int]) -> int:
    out = 0
    for m in minors:
        out |= 1 << m
    return out


def _best_group(parts: Sequence[GPUPartition]) -> list[GPUPartition]:
    if not parts:
        return []
    top = parts[0].allocation_score
    return [p for p in parts if p.allocation_score == top]


def _packing_score(
    chosen: GPUPartition, blocked: int, table: PartitionTable, count: int
) -> int:
    taken = blocked | chosen.mask
    score = 0
    sizes = [s for s in table.sizes() if s >= max(count, 2)]
    for i, size in enumerate(sizes):
        for p in _best_group(table.of_size(size)):
            if not p.mask & taken:
                score += p.allocation_score * 100**i
    return score


def choose_partition(
    cands: Sequence[CardView],
    all_cards: Sequence[CardView],
    count: int,
    meta: NodeMeta,
    spec: PartitionSpec | None,
) -> list[CardView] | Status | None:
    """The cards of the chosen partition, the Status saying why none (honoring nodes), or
    None (the caller chooses as usual)."""
    honor = spec is not None or meta.honor_partitions

    def fail(status: Status) -> Status | None:
        return status if honor else None

    table = meta.partitions
    if table is None:
        return fail(unresolvable(ERR_MISSING_PARTITION_TABLE))
    parts = table.of_size(count)
    if not parts:
        return fail(unresolvable(ERR_UNSUPPORTED_GPU_COUNT))
    free = {c.minor: c for c in cands}
    want = spec.ring_bandwidth if spec is not None else None
    feasible: list[GPUPartition] = []
    scores = sorted({p.allocation_score for p in parts}, reverse=True)
    for score in scores:
        for p in parts:
            if p.allocation_score != score or not all(m in free for m in p.minors):
                continue
            if want is not None and (p.ring_bandwidth is None or p.ring_bandwidth < want):
                continue
            feasible.append(p)
        if feasible or (spec is not None and spec.restricted):
            break
    if not feasible:
        return fail(unschedulable(ERR_INSUFFICIENT_PARTITIONED))
    blocked = _mask([c.minor for c in all_cards if c.minor not in free])
    best = max(
        feasible,
        key=lambda p: (_packing_score(p, blocked, table, count), tuple(-m for m in p.minors)),
    )
    return [free[m] for m in best.minors]
