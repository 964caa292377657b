"""Cards as the allocator sees them, and the topology-aware choice among them (SPEC §6).

Role: the read-only card records the ledger hands out (``CardMeta``: what the Device CR
declares; ``CardView``: a card's total/used/free at this moment; ``NodeView``: a node's cards
per type, by minor, with the node's ``NodeMeta``: GPU interconnect, partition table and
policy), and the part of Koordinator's GPU allocator that looks at
``DeviceInfo.topology`` (``allocator_gpu.go``: ``allocateByDeviceTopology``,
``allocateFromScope``; the ``requiredTopologyScope`` hint). Given the candidate cards
(those that fit the per-card request) it picks ``count`` of them:

- ``choose_whole``: several whole cards on a node whose candidates all report topology —
  all under one PCIe switch if possible, else all in one NUMA node, else spread over the node
  filling NUMA nodes and switches in turn. Among equal choices a group that already has used
  cards wins (packing next to cards in use, keeping empty switches whole for later), then the
  group with more candidates, then the lowest minor; cards inside a group go by minor.
(``vf_groups`` and ``NodeView.vfs_taken`` serve the VF choice, ``vfs``.)

- ``choose_scoped``: the chosen cards must share one scope (``PCIe``, ``NUMANode``; ``Device``
  means a single card, ``Node`` anything); None when no scope of that level has enough
  candidates.

Invariants: pure functions of their inputs, deterministic (every tie ends at the lowest
minor); a card without topology is a group of its own at every level.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.device import DeviceTopology, VirtualFunctionGroup
from apis.hints import SCOPE_DEVICE, SCOPE_NODE, SCOPE_NUMA_NODE, SCOPE_PCIE
from apis.partition import PartitionTable
from apis.topology import GPUTopology

__all__ = [
    "NO_NODE_META",
    "CardMeta",
    "CardView",
    "NodeMeta",
    "NodeView",
    "choose_scoped",
    "choose_whole",
    "has_topology",
    "numa_key",
    "pcie_key",
]


@dataclass(frozen=True, slots=True)
class CardMeta:
    """A card as its Device CR declares it (``declared`` aligned with the type's resources)."""

    minor: int
    id: str
    healthy: bool
    declared: tuple[int, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    topology: DeviceTopology | None = None
    vf_groups: tuple[VirtualFunctionGroup, ...] = ()


@dataclass(frozen=True, slots=True)
class CardView:
    """One card as Filter/Reserve see it (``used`` net of the cycle's removed pods)."""

    minor: int
    exists: bool
    healthy: bool
    total: tuple[int, ...]
    used: tuple[int, ...]
    free: tuple[int, ...]
    meta: CardMeta | None

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.labels if self.meta is not None else {}

    @property
    def topology(self) -> DeviceTopology | None:
        return self.meta.topology if self.meta is not None else None

    @property
    def in_use(self) -> bool:
        return any(self.used)


@dataclass(frozen=True, slots=True)
class NodeMeta:
    """What a node's Device CR says about its GPUs as a whole, decoded once per CR change:
    the interconnect (``gpu-topology``), the partition table (``gpu-partitions``, None when
    absent or malformed) and whether the node honors it (``gpu-partition-policy: Honor``)."""

    gpu_topology: GPUTopology = field(default_factory=GPUTopology)
    partitions: PartitionTable | None = None
    honor_partitions: bool = False
    gpu_scope_tree: bool = False
    """Every GPU of the CR reports its topology: GPUs are chosen by Koordinator's scope tree
    (``scopetree``)."""


NO_NODE_META = NodeMeta()


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node's cards per device type, sorted by minor, and the node's GPU meta."""

    name: str
    has_device: bool
    cards: Mapping[str, tuple[CardView, ...]]
    meta: NodeMeta = NO_NODE_META
    vfs_taken: Mapping[tuple[str, int], frozenset[str]] = field(default_factory=dict)
    """Per (device type, minor) of an SR-IOV card, the bus ids of the VFs someone holds."""

KeyFn = Callable[[CardView], Hashable]
OrderFn = Callable[[CardView], Any]


def has_topology(card: CardView) -> bool:
    topo = card.topology
    return topo is not None and bool(topo.pcie_id)


def pcie_key(card: CardView) -> Hashable:
    topo = card.topology
    if topo is None or not topo.pcie_id:
        return ("card", card.minor)
    return ("pcie", topo.node_id, topo.pcie_id)


def numa_key(card: CardView) -> Hashable:
    topo = card.topology
    if topo is None:
        return ("card", card.minor)
    return ("numa", topo.node_id)


def _by_minor(card: CardView) -> int:
    return card.minor


def _groups(
    cards: Sequence[CardView], key: KeyFn, used_keys: set[Hashable]
) -> list[list[CardView]]:
    """Candidates grouped by ``key``, best group first: in use, larger, lowest minor."""
    groups: dict[Hashable, list[CardView]] = {}
    for card in cards:
        groups.setdefault(key(card), []).append(card)
    ordered = [sorted(g, key=_by_minor) for g in groups.values()]
    ordered.sort(key=lambda g: (key(g[0]) not in used_keys, -len(g), g[0].minor))
    return ordered


def _used(all_cards: Sequence[CardView], key: KeyFn) -> set[Hashable]:
    return {key(c) for c in all_cards if c.in_use}


def _one_group(
    cands: Sequence[CardView], all_cards: Sequence[CardView], count: int, key: KeyFn
) -> list[CardView] | None:
    """The best single group of ``key`` holding ``count`` candidates (lowest minors in it)."""
    used = _used(all_cards, key)
    feasible = [g for g in _groups(cands, key, used) if len(g) >= count]
    if not feasible:
        return None
    feasible.sort(key=lambda g: (key(g[0]) not in used, g[0].minor))
    return feasible[0][:count]


def _fill(
    cands: Sequence[CardView], all_cards: Sequence[CardView], count: int
) -> list[CardView]:
    """Spread over the node: NUMA nodes in turn, switches in turn inside each."""
    used_numa, used_pcie = _used(all_cards, numa_key), _used(all_cards, pcie_key)
    out: list[CardView] = []
    for numa in _groups(cands, numa_key, used_numa):
        for pcie in _groups(numa, pcie_key, used_pcie):
            out.extend(pcie)
    return out[:count]


def choose_whole(
    cands: Sequence[CardView], all_cards: Sequence[CardView], count: int
) -> list[CardView] | None:
    """``count`` whole cards by topology; None when some candidate reports no topology."""
    if len(cands) < count or not all(has_topology(c) for c in cands):
        return None
    for key in (pcie_key, numa_key):
        chosen = _one_group(cands, all_cards, count, key)
        if chosen is not None:
            return chosen
    return _fill(cands, all_cards, count)


def choose_scoped(
    cands: Sequence[CardView],
    all_cards: Sequence[CardView],
    count: int,
    scope: str,
    whole: bool,
    order: OrderFn,
) -> list[CardView] | None:
    """``count`` candidates inside one ``scope``; None when no such scope has enough."""
    if len(cands) < count:
        return None
    if count <= 1 or scope in ("", SCOPE_NODE):
        if whole and count > 1:
            chosen = choose_whole(cands, all_cards, count)
            if chosen is not None:
                return chosen
        return sorted(cands, key=order)[:count]
    if scope == SCOPE_DEVICE:
        return None
    keys: tuple[KeyFn, ...] = (pcie_key,) if scope == SCOPE_PCIE else (pcie_key, numa_key)
    assert scope in (SCOPE_PCIE, SCOPE_NUMA_NODE), scope
    if whole and all(has_topology(c) for c in cands):
        for key in keys:
            chosen = _one_group(cands, all_cards, count, key)
            if chosen is not None:
                return chosen
        return None
    key = keys[-1]
    used = _used(all_cards, key)
    groups = [g for g in _groups(cands, key, used) if len(g) >= count]
    if not groups:
        return None
    groups.sort(key=lambda g: (key(g[0]) not in used, g[0].minor))
    return sorted(groups[0], key=order)[:count]
