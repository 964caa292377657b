"""Koordinator's GPU scope tree: which GPUs of a node whose GPUs all report topology.

Role: ``allocateByDeviceTopology`` / ``allocateFromScope`` of Koordinator's GPU allocator
(``allocator_gpu.go``, ``allocator_gpu_helper.go``: ``GetGPUTopologyScope``), the choice that
packs a pod beside the GPUs already in use and prefers the tightest scope that fits. The
tree is the node, its NUMA nodes (by id) and, in each, its PCIe switches (by id, as strings);
a scope with fewer GPUs than asked for is never entered. Every scope that can give the pod
its GPUs answers with its depth (node 1, NUMA node 2, switch 3) and how many scopes on its
path hold a used GPU; the deepest answer wins, then the one with more used scopes on its path
(binpack), then, for a shared GPU, the better card score; remaining ties go to the first in
tree order. Inside a scope the GPUs go by minor (whole GPUs: the first ``count`` that fit;
a shared GPU: the best card score, the lowest minor among equals).

``requiredTopologyScope`` (the GPU hint) forbids answers from scopes wider than it: PCIe
only from a switch, NUMANode from a NUMA node or a switch. ``Device`` is narrower than every
scope of the tree, so, as in Koordinator, it is never satisfied here.

Invariants: pure and deterministic; "used" is any GPU of the node with something in use
(also those the request could not take), as Koordinator's ``deviceUsedMinorsHash``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from apis.device import Device, DeviceInfo
from apis.hints import SCOPE_NODE, SCOPE_NUMA_NODE, SCOPE_PCIE, TOPOLOGY_SCOPE_LEVEL
from apis.resources import DEVICE_GPU
from scheduler.devices.topology import CardView

__all__ = [
    "Layout",
    "choose_by_scope",
    "choose_minors",
    "device_has_scope_tree",
    "has_scope_tree",
]

_NODE_LEVEL = TOPOLOGY_SCOPE_LEVEL[SCOPE_NODE]
_NUMA_LEVEL = TOPOLOGY_SCOPE_LEVEL[SCOPE_NUMA_NODE]
_PCIE_LEVEL = TOPOLOGY_SCOPE_LEVEL[SCOPE_PCIE]


@dataclass(slots=True)
class _Scope:
    level: int
    minors: list[int] = field(default_factory=list)
    children: list[_Scope] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Answer:
    minors: tuple[int, ...]
    depth: int
    not_empty: int
    score: int


def device_has_scope_tree(device: Device) -> bool:
    """``has_scope_tree`` of the GPUs a ledger row lays out from ``device`` (the first entry
    of each minor): ``NodeMeta.gpu_scope_tree``."""
    first: dict[int, DeviceInfo] = {}
    for d in device.devices_of_type(DEVICE_GPU):
        if d.minor is not None:
            first.setdefault(d.minor, d)
    return bool(first) and all(d.topology is not None for d in first.values())


def has_scope_tree(cards: Sequence[CardView]) -> bool:
    """Whether the node's GPUs form a tree: at least one, and every one reports topology."""
    present = [c for c in cards if c.exists]
    return bool(present) and all(c.topology is not None for c in present)


Layout = tuple[tuple[int, int, str], ...]
"""(minor, NUMA node, PCIe id) of each GPU: all a tree depends on."""


@lru_cache(maxsize=4096)
def _tree(layout: Layout) -> _Scope:
    """The scope tree of a layout (cached: a node's layout changes only with its CR; the tree
    is never mutated)."""
    numas: dict[int, dict[str, list[int]]] = {}
    for minor, node_id, pcie in layout:
        numas.setdefault(node_id, {}).setdefault(pcie, []).append(minor)
    root = _Scope(_NODE_LEVEL, sorted(minor for minor, _, _ in layout))
    for numa_id in sorted(numas):
        pcies = numas[numa_id]
        numa = _Scope(_NUMA_LEVEL, sorted(m for ms in pcies.values() for m in ms))
        numa.children = [_Scope(_PCIE_LEVEL, sorted(pcies[p])) for p in sorted(pcies)]
        root.children.append(numa)
    return root


def choose_by_scope(
    all_cards: Sequence[CardView],
    fits: Mapping[int, CardView],
    count: int,
    shared: bool,
    required_scope: str,
    score: Callable[[CardView], int],
) -> list[CardView] | None:
    """``count`` GPUs (one when ``shared``) among ``fits`` (the candidates, by minor) by the
    scope tree of ``all_cards`` (the node's GPUs, each with topology); None when no scope
    allowed by ``required_scope`` has enough candidates."""
    present = [c for c in all_cards if c.exists]
    layout = tuple(
        (c.minor, c.topology.node_id, c.topology.pcie_id) for c in present if c.topology
    )
    used = frozenset(c.minor for c in present if c.in_use)
    scores = {m: score(c) for m, c in fits.items()} if shared else dict.fromkeys(fits, 0)
    chosen = choose_minors(layout, used, scores, count, shared, required_scope)
    return None if chosen is None else [fits[m] for m in chosen]


def choose_minors(
    layout: Layout,
    used: frozenset[int] | set[int],
    fits: Mapping[int, int],
    count: int,
    shared: bool,
    required_scope: str,
) -> tuple[int, ...] | None:
    """``choose_by_scope`` on minors: ``layout`` the node's GPUs, ``used`` those with
    something in use, ``fits`` the candidates and their card scores (read when ``shared``).
    Answered from a cache of the pure choice: nodes of one layout meet the same few states."""
    candidates = tuple(sorted(fits.items())) if shared else tuple((m, 0) for m in sorted(fits))
    return _choose_minors(layout, frozenset(used), candidates, count, shared, required_scope)


@lru_cache(maxsize=16384)
def _choose_minors(
    layout: Layout,
    used: frozenset[int],
    candidates: tuple[tuple[int, int], ...],
    count: int,
    shared: bool,
    required_scope: str,
) -> tuple[int, ...] | None:
    fits = dict(candidates)
    required_level = TOPOLOGY_SCOPE_LEVEL.get(required_scope, 0)
    want = 1 if shared else count

    def leaf(scope: _Scope, depth: int, not_empty: int) -> _Answer | None:
        if required_level > scope.level:
            return None
        picked: list[int] = []
        best_minor, best_score = -1, -1
        for minor in scope.minors:
            s = fits.get(minor)
            if s is None:
                continue
            if not shared:
                picked.append(minor)
                if len(picked) == want:
                    return _Answer(tuple(picked), depth, not_empty, -1)
                continue
            if s > best_score:
                best_minor, best_score = minor, s
        if shared and best_minor >= 0:
            return _Answer((best_minor,), depth, not_empty, best_score)
        return None

    def rank(a: _Answer) -> tuple[int, int, int]:
        return (a.depth, a.not_empty, a.score if shared else 0)

    def visit(scope: _Scope, depth: int, not_empty: int) -> _Answer | None:
        if len(scope.minors) < want:
            return None
        depth += 1
        if used.intersection(scope.minors):
            not_empty += 1
        best: _Answer | None = None
        for child in scope.children:
            if len(child.minors) < want:
                continue
            got = visit(child, depth, not_empty)
            if got is None:
                continue
            # Deeper, then more used scopes on the path, then (shared) the better card.
            if best is None or rank(best) < rank(got):
                best = got
        if best is not None:
            return best
        return leaf(scope, depth, not_empty)

    answer = visit(_tree(layout), 0, 0)
    return None if answer is None else answer.minors
