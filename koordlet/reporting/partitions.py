"""PURE: the node's GPU partition table, derived from the GPU interconnect koordlet discovers.

Role: turn the ``GPUTopology`` (``apis.topology``) of the node's cards into the
``scheduling.koordinator.sh/gpu-partitions`` table (``apis.partition``) that the reporter
writes on the Device CR, so the scheduler can hand multi-GPU pods well-connected card sets.
Rules (``docs/topology.md``), over the node's GPU minors sorted ascending, sizes 1, 2, 4, 8 …
(powers of two up to the number of cards):

- **PCIe only** (no pair of the node's cards talks over NVLink): no table. The scheduler's
  PCIe/NUMA-aware choice applies.
- **NVSwitch box** (every pair of the node's cards is linked through NVSwitch, e.g. 8 x H100
  SXM, 8 x A100 SXM): aligned blocks of the sorted minors — size k: cards ``[0..k)``,
  ``[k..2k)``, … — the partition shapes Fabric Manager allows in shared-NVSwitch mode and
  Koordinator's table for Hopper boxes (1: each card; 2: 0-1, 2-3, 4-5, 6-7; 4: 0-3, 4-7;
  8: all).
- **NVLink bridges and meshes** (NVLink pairs such as A100 PCIe with NV12 bridges, the V100
  hybrid cube mesh): size 1: every card; size k >= 2: every k cards (on nodes of more than 8
  cards, the aligned blocks only) joined by an NVLink *ring* — a cycle through all of them
  whose every hop is an NVLink pair of known bandwidth (sets of more than 10 cards: every pair
  NVLink). A size without such a set is left out (8 x A100 in NVLink pairs: sizes 1 and 2
  only).

Every entry has ``gpuLinkType: NVLink``; ``ringBusBandwidth`` is the best ring's bottleneck
bandwidth (``apis.topology.ring_bandwidth``; none for one card); ``allocationScore`` ranks the
entries of one size by that bandwidth, 1 for the lowest distinct value, 2 for the next, …
(all 1 when equal), so higher is better.

Invariants: deterministic (entries by minors); every listed set's cards are the node's; an
empty or NVLink-free topology gives None.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Final

from apis.partition import GPUPartition, PartitionTable
from apis.quantity import Quantity
from apis.topology import LINK_NVLINK, GPUTopology, ring_bandwidth

__all__ = ["derive_partitions", "is_nvswitch_box"]

_EXHAUSTIVE_MAX: Final = 8
"""Up to this many cards every subset is considered; above it, aligned blocks only."""
_RING_EXACT_MAX: Final = 10
"""Up to this many cards in a set the NVLink ring is searched exactly."""


def _sizes(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def _has_nvlink(topology: GPUTopology, minors: Sequence[int]) -> bool:
    return any(
        (link := topology.link(a, b)) is not None and link.is_nvlink
        for a, b in itertools.combinations(minors, 2)
    )


def is_nvswitch_box(topology: GPUTopology, minors: Sequence[int]) -> bool:
    """Every pair of ``minors`` (at least two) is linked through NVSwitch."""
    if len(minors) < 2:
        return False
    for a, b in itertools.combinations(minors, 2):
        link = topology.link(a, b)
        if link is None or not link.is_nvlink or not link.nvswitch:
            return False
    return True


def _blocks(minors: Sequence[int], k: int) -> list[tuple[int, ...]]:
    return [tuple(minors[i : i + k]) for i in range(0, len(minors) - k + 1, k)]


def _scored(
    sets: Iterable[tuple[tuple[int, ...], Quantity | None]],
) -> tuple[GPUPartition, ...]:
    entries = sorted(sets)
    levels = sorted({bw.value for _, bw in entries if bw is not None})
    rank = {v: i + 1 for i, v in enumerate(levels)}
    return tuple(
        GPUPartition(
            cards, LINK_NVLINK, bw, 1 if bw is None else rank[bw.value]
        )
        for cards, bw in entries
    )


def derive_partitions(topology: GPUTopology, minors: Iterable[int]) -> PartitionTable | None:
    """The partition table of the cards ``minors`` on ``topology``; None without NVLink."""
    cards = sorted(set(minors))
    if len(cards) < 2 or not _has_nvlink(topology, cards):
        return None
    table: dict[int, tuple[GPUPartition, ...]] = {}
    switch = is_nvswitch_box(topology, cards)
    for k in _sizes(len(cards)):
        if k == 1:
            table[1] = _scored(((m,), None) for m in cards)
            continue
        if switch or len(cards) > _EXHAUSTIVE_MAX:
            candidates: Iterable[tuple[int, ...]] = _blocks(cards, k)
        else:
            candidates = itertools.combinations(cards, k)
        found: list[tuple[tuple[int, ...], Quantity | None]] = []
        for subset in candidates:
            bw = ring_bandwidth(topology, subset)
            if bw is None and not switch:
                continue
            if not switch and not _nvlink_ring(topology, subset):
                continue
            found.append((subset, bw))
        if found:
            table[k] = _scored(found)
    return PartitionTable(table)


def _nvlink_ring(topology: GPUTopology, subset: Sequence[int]) -> bool:
    """A cycle through ``subset`` whose every hop is NVLink (two cards: their one pair).

    Exact up to ``_RING_EXACT_MAX`` cards (a search over card subsets, O(2^k k^2)); above that,
    every pair must be NVLink."""
    k = len(subset)

    def nv(a: int, b: int) -> bool:
        link = topology.link(subset[a], subset[b])
        return link is not None and link.is_nvlink

    if k == 2:
        return nv(0, 1)
    if k > _RING_EXACT_MAX:
        return all(nv(a, b) for a, b in itertools.combinations(range(k), 2))
    adjacent = [[a != b and nv(a, b) for b in range(k)] for a in range(k)]
    # reach[mask]: the cards a path from card 0 through exactly ``mask`` can end at (bit set).
    reach = [0] * (1 << k)
    reach[1] = 1
    for mask in range(1, 1 << k, 2):
        ends = reach[mask]
        if not ends:
            continue
        for v in range(k):
            if not ends >> v & 1:
                continue
            for w in range(1, k):
                if not mask >> w & 1 and adjacent[v][w]:
                    reach[mask | 1 << w] |= 1 << w
    full = reach[(1 << k) - 1]
    return any(full >> v & 1 and adjacent[v][0] for v in range(1, k))
