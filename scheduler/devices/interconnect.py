"""Interconnect-aware choice of several whole GPUs, and how well a chosen set is connected.

Role: for a pod asking for N whole cards on a node whose Device CR carries the GPU
interconnect (``gpu-topology``, ``apis.topology``), pick the N free cards that talk best with
each other, and give the 0-100 connectivity score of a set so the node Score step can prefer a
node whose free cards are well connected (``docs/topology.md``).

A pair's rank is ``apis.topology.pair_rank`` of its link (NVLink 71-100 by link count, then the
PCIe common ancestor: Internal 60, Single 50, Multiple 40, HostBridge 30, Node 20, System 10);
a pair the annotation does not list falls back to the cards' PCIe/NUMA topology from the
Device CR (same PCIe switch: Single, same NUMA node: Node, else System; unknown: 0). Sets
compare by, in order:

1. connectivity: the weakest pair's rank (bottleneck), then the average pair rank — the most
   NVLink first;
2. locality: fewer NUMA nodes, then fewer PCIe switches;
3. packing: more chosen cards under a PCIe switch that already has a card in use (keeps
   empty switches whole for later);
4. the lowest minors (lexicographic).

Search: every set when there are at most ``EXHAUSTIVE_SETS`` of them (8 candidates: at most
70), else a greedy growth from every candidate (add the card that keeps the bottleneck and the
sum of ranks highest) whose results are compared with the same key.

Invariants: pure and deterministic; ``choose_connected`` returns exactly ``count`` candidates
(or None when there are fewer); ``set_score`` of zero or one card is 100.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Final

from apis.topology import (
    ANCESTOR_NODE,
    ANCESTOR_SINGLE,
    ANCESTOR_SYSTEM,
    LINK_PCIE,
    PERFECT,
    Connectivity,
    GPULink,
    GPUTopology,
    pair_rank,
)
from scheduler.devices.topology import CardView, numa_key, pcie_key

__all__ = ["EXHAUSTIVE_SETS", "choose_connected", "pair_score", "set_connectivity", "set_score"]

EXHAUSTIVE_SETS: Final = 2000

_RANK_SINGLE: Final = pair_rank(GPULink((0, 1), LINK_PCIE, common_ancestor=ANCESTOR_SINGLE))
_RANK_NODE: Final = pair_rank(GPULink((0, 1), LINK_PCIE, common_ancestor=ANCESTOR_NODE))
_RANK_SYSTEM: Final = pair_rank(GPULink((0, 1), LINK_PCIE, common_ancestor=ANCESTOR_SYSTEM))


def pair_score(topology: GPUTopology, a: CardView, b: CardView) -> int:
    """The rank of the pair (a, b): its ``gpu-topology`` link, else its PCIe/NUMA places."""
    link = topology.link(a.minor, b.minor)
    if link is not None:
        return pair_rank(link)
    ta, tb = a.topology, b.topology
    if ta is None or tb is None:
        return 0
    if ta.pcie_id and ta.pcie_id == tb.pcie_id and ta.node_id == tb.node_id:
        return _RANK_SINGLE
    if ta.node_id == tb.node_id:
        return _RANK_NODE
    return _RANK_SYSTEM


def set_connectivity(topology: GPUTopology, cards: Sequence[CardView]) -> Connectivity:
    """Bottleneck and average pair rank of ``cards`` (``apis.topology.Connectivity``)."""
    if len(cards) < 2:
        return Connectivity(PERFECT, PERFECT)
    ranks = [pair_score(topology, a, b) for a, b in itertools.combinations(cards, 2)]
    return Connectivity(min(ranks), sum(ranks) // len(ranks))


def set_score(topology: GPUTopology, cards: Sequence[CardView]) -> int:
    """The 0-100 connectivity score of ``cards`` (the bottleneck rank)."""
    return set_connectivity(topology, cards).score


SetKey = tuple[int, int, int, int, int, tuple[int, ...]]


def _key(
    idx: Sequence[int],
    cands: Sequence[CardView],
    rank: Sequence[Sequence[int]],
    used_pcie: set[object],
) -> SetKey:
    ranks = [rank[i][j] for i, j in itertools.combinations(idx, 2)]
    bottleneck = min(ranks) if ranks else PERFECT
    average = sum(ranks) // len(ranks) if ranks else PERFECT
    cards = [cands[i] for i in idx]
    numa = len({numa_key(c) for c in cards})
    pcie = len({pcie_key(c) for c in cards})
    packed = sum(1 for c in cards if pcie_key(c) in used_pcie)
    minors = tuple(sorted(c.minor for c in cards))
    return (-bottleneck, -average, numa, pcie, -packed, minors)


def _grow(seed: int, count: int, rank: Sequence[Sequence[int]]) -> list[int]:
    chosen = [seed]
    rest = [i for i in range(len(rank)) if i != seed]
    while len(chosen) < count:
        best = max(
            rest,
            key=lambda j: (min(rank[j][i] for i in chosen), sum(rank[j][i] for i in chosen), -j),
        )
        chosen.append(best)
        rest.remove(best)
    return sorted(chosen)


def choose_connected(
    cands: Sequence[CardView],
    all_cards: Sequence[CardView],
    count: int,
    topology: GPUTopology,
) -> list[CardView] | None:
    """The ``count`` best-connected candidates (see the module docstring); None if too few."""
    if len(cands) < count or count < 1:
        return None
    ordered = sorted(cands, key=lambda c: c.minor)
    if count == 1 or count == len(ordered):
        return ordered[:count]
    n = len(ordered)
    rank = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        rank[i][j] = rank[j][i] = pair_score(topology, ordered[i], ordered[j])
    used_pcie = {pcie_key(c) for c in all_cards if c.in_use}
    if math.comb(n, count) <= EXHAUSTIVE_SETS:
        sets: list[Sequence[int]] = list(itertools.combinations(range(n), count))
    else:
        sets = [_grow(seed, count, rank) for seed in range(n)]
    best = min(sets, key=lambda idx: _key(idx, ordered, rank, used_pcie))
    return [ordered[i] for i in best]
