"""The device allocator: which cards of a node a pod gets, or why it gets none.

Role: Koordinator's ``AutopilotAllocator`` (``device_allocator.go``, ``allocator_gpu.go``,
``devicehandler_*.go``) for one node (``allocate``, the reference semantics used by the
per-node Filter and by Reserve; ``allocate_plain``, the same answer read straight from the
ledger's row for the common request, Reserve's fast path), its whole-cluster feasibility
(``feasible_rows``, used by the batch Filter for requests without hints or joint rules), and
the same per-card fit as matrices (``card_fits`` / ``card_taken``: which cards of many nodes
can give a request and what each would take; ``card_left``: what would be left of each) for
front ends that rank cards themselves (GPUFragmentation).

Per requested device type (gpu, rdma, fpga in that order):

1. a node without cards of the type: UnschedulableAndUnresolvable ``Insufficient <type>
   devices`` (Koordinator's device handler; a node without a Device CR has no cards);
2. candidates: existing, healthy cards (matching the hint's ``selector``) whose free amounts
   cover what the pod would take from them — the per-card request with, for a GPU, memory
   completed from the ratio (``floor(ratio * card memory / 100)``) or the ratio from memory
   (truncated). Checking the completed amounts too means no card is ever over-committed;
3. fewer candidates than devices needed: Unschedulable ``Insufficient <type> devices``;
4. the choice: whole GPUs on a node with a partition table, a ``Honor`` policy, or for a pod
   with a ``gpu-partition-spec`` go by the table first (``partitions.choose_partition``;
   honoring nodes fail with its reasons, others fall through); several whole GPUs on a node
   that publishes its interconnect go by it (``interconnect.choose_connected``: NVLink first);
   otherwise, on a node whose GPUs all report topology, GPUs go by Koordinator's scope tree
   (``scopetree``: beside the GPUs in use, tightest scope first; a ``requiredTopologyScope``
   must hold, else ``Insufficient Topology Scoped GPU Devices``); elsewhere a scope goes by
   ``topology.choose_scoped``, several whole GPUs by PCIe/NUMA (``topology.choose_whole``);
   everything else (NICs, FPGAs) by the card score (binpack or spread), ties to the lowest
   minor — a card giving a VF when the hint has a ``vfSelector`` (``vfs.choose_vf``; a node
   without VF groups of the type: UnschedulableAndUnresolvable ``Insufficient <type>
   VirtualFunctions``), only designated cards and VFs for a pod whose own ``device-allocated``
   names VFs (Koordinator #2807).

Joint allocation (``device-joint-allocate``): the primary type first, then each secondary
type with the cards on the primary's PCIe switches first, round-robin over the switches
(Koordinator's ``sortDeviceResourcesByPreferredPCIe``), up to one per switch (or the count
asked for), at least one per switch with ``SamePCIe``; with ``SamePCIe`` the switch sets must
be equal, else Unschedulable ``node(s) Device Joint-Allocate rules violation``.

Invariants: ``allocate`` is deterministic and never mutates anything; ``allocate_plain``
returns exactly what ``allocate`` over ``node_view`` would, or None; ``card_taken`` is True
exactly where ``card_amounts`` is not None, with the same amounts; ``feasible_rows`` is True
for a row exactly when ``allocate`` succeeds on that node for ``request.vectorizable``
requests on nodes outside ``ledger.honor_rows``, and whenever it succeeds otherwise (a
partition table only removes choices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from apis.hints import SCOPE_NODE
from apis.resources import DEVICE_GPU, memory_from_ratio, ratio_from_memory
from scheduler.devices.interconnect import choose_connected
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.partitions import choose_partition, uses_partitions
from scheduler.devices.request import (
    GPU_CORE_INDEX,
    GPU_MEMORY_INDEX,
    GPU_RATIO_INDEX,
    RESOURCES_BY_TYPE,
    VF,
    CardUse,
    DeviceRequest,
    TypeRequest,
)
from scheduler.devices.rowfit import FEW_ROWS, row_feasible
from scheduler.devices.scopetree import choose_by_scope, choose_minors, has_scope_tree
from scheduler.devices.scoring import Scorer
from scheduler.devices.table import SHARE
from scheduler.devices.topology import (
    CardView,
    NodeMeta,
    NodeView,
    choose_scoped,
    choose_whole,
)
from scheduler.devices.vfs import choose_vf, has_vfs, needs_vf
from scheduler.framework.status import Status, unresolvable, unschedulable
from scheduler.framework.types import BoolArray, IntArray

__all__ = [
    "ERR_JOINT_VIOLATION",
    "ERR_TOPOLOGY_SCOPED",
    "allocate",
    "allocate_plain",
    "card_amounts",
    "card_fits",
    "card_left",
    "card_taken",
    "feasible_rows",
    "gpu_amounts",
    "insufficient",
    "rows_feasible",
]

ERR_TOPOLOGY_SCOPED: Final = "Insufficient Topology Scoped GPU Devices"
ERR_JOINT_VIOLATION: Final = "node(s) Device Joint-Allocate rules violation"


def insufficient(device_type: str) -> str:
    return f"Insufficient {device_type} devices"


def card_amounts(treq: TypeRequest, card: CardView) -> tuple[int, ...] | None:
    """What the pod takes from ``card`` (completed), or None when the card cannot give it."""
    if not card.healthy:
        return None
    if treq.device_type != DEVICE_GPU:
        per = treq.per_device
        return per if per[0] <= card.free[0] else None
    return gpu_amounts(treq, card.total, card.free)


def gpu_amounts(
    treq: TypeRequest, total: Sequence[int], free: Sequence[int]
) -> tuple[int, int, int] | None:
    """``card_amounts`` of a healthy GPU given as its ``total`` and ``free`` amounts (core,
    ratio, memory): the request completed for that card, or None when it cannot give it."""
    per = treq.per_device
    core = per[GPU_CORE_INDEX] if treq.requested[GPU_CORE_INDEX] else 0
    card_memory = total[GPU_MEMORY_INDEX]
    if treq.requested[GPU_RATIO_INDEX]:
        ratio = per[GPU_RATIO_INDEX]
        memory = memory_from_ratio(ratio, card_memory)
    else:
        memory = per[GPU_MEMORY_INDEX]
        if card_memory <= 0:
            return None
        ratio = ratio_from_memory(memory, card_memory)
    if core > free[GPU_CORE_INDEX] or ratio > free[GPU_RATIO_INDEX]:
        return None
    if memory > free[GPU_MEMORY_INDEX]:
        return None
    return (core, ratio, memory)


def _use(
    treq: TypeRequest, card: CardView, amounts: tuple[int, ...], vfs: tuple[VF, ...] = ()
) -> CardUse:
    names = RESOURCES_BY_TYPE[treq.device_type]
    resources = {
        name: amount
        for i, (name, amount) in enumerate(zip(names, amounts, strict=True))
        if not (treq.device_type == DEVICE_GPU and i == GPU_CORE_INDEX)
        or treq.requested[GPU_CORE_INDEX]
    }
    return CardUse.of(treq.device_type, card.minor, resources, vfs)


def _pcie(card: CardView) -> str | None:
    topo = card.topology
    return topo.pcie_id if topo is not None else None


def _round_robin(
    cands: Sequence[CardView], rank: Callable[[CardView], tuple[int, int]],
    preferred: frozenset[str],
) -> list[CardView]:
    """Koordinator's ``sortDeviceResourcesByPreferredPCIe``: the first card of each preferred
    switch, then the second of each..., each round by score and minor; then the others."""
    ordered = sorted(cands, key=rank)
    if not preferred:
        return ordered
    groups: dict[str, list[CardView]] = {}
    rest: list[CardView] = []
    for c in ordered:
        pcie = _pcie(c)
        if pcie is not None and pcie in preferred:
            groups.setdefault(pcie, []).append(c)
        else:
            rest.append(c)
    out: list[CardView] = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        out.extend(sorted((g[i] for g in groups.values() if i < len(g)), key=rank))
    return out + rest


def _allocate_type(
    view: NodeView,
    request: DeviceRequest,
    treq: TypeRequest,
    scorer: Scorer,
    preferred: frozenset[str] = frozenset(),
    minimum: int = 0,
    most: int = 0,
) -> list[CardUse] | Status:
    t = treq.device_type
    cards = [c for c in view.cards.get(t, ()) if c.exists]
    hint = request.hints.get(t)
    if hint is not None and hint.selector is not None:
        cards = [c for c in cards if hint.matches(c.labels)]
    designated = request.designated.get(t)
    if designated is not None:
        cards = [c for c in cards if c.minor in designated]
    count = treq.count if treq.count > 0 else len(cards)
    if count == 0:
        return unresolvable(insufficient(t))
    count = max(count, minimum)
    amounts: dict[int, tuple[int, ...]] = {}
    cands: list[CardView] = []
    for c in cards:
        a = card_amounts(treq, c)
        if a is not None:
            amounts[c.minor] = a
            cands.append(c)
    scope = hint.required_topology_scope if hint is not None and t == DEVICE_GPU else ""
    scoped = scope not in ("", SCOPE_NODE)
    all_cards = view.cards.get(t, ())
    whole = t == DEVICE_GPU and not treq.shared
    chosen: list[CardView] | None = None
    if whole and not preferred and uses_partitions(view.meta, request.partition):
        # First, as in Koordinator: a node that honors partitions answers with their reasons.
        by_table = choose_partition(cands, all_cards, count, view.meta, request.partition)
        if isinstance(by_table, Status):
            return by_table
        chosen = by_table
    if chosen is None and len(cands) < count:
        return unschedulable(ERR_TOPOLOGY_SCOPED if scoped else insufficient(t))
    scores = {c.minor: scorer.card_score(t, c, amounts[c.minor]) for c in cands}

    def rank(c: CardView) -> tuple[int, int]:
        return (-scores[c.minor], c.minor)

    def binpack(c: CardView) -> tuple[bool, int, int]:
        # gpushare's rule, exactly (SPEC §10): the card with the least free memory that still
        # fits, per card (heterogeneous cards compare their own free memory).
        return (False, c.free[GPU_MEMORY_INDEX], c.minor)

    gpushare = bool(request.gpushare_units) and t == DEVICE_GPU
    topology = view.meta.gpu_topology
    if chosen is None and whole and count > 1 and topology and not preferred and not scoped:
        chosen = choose_connected(cands, all_cards, count, topology)
    if chosen is None and t == DEVICE_GPU and not gpushare and has_scope_tree(all_cards) \
            and (whole or treq.count <= 1):
        # Koordinator's GPU allocator: the scope tree (binpack, tightest scope first).
        chosen = choose_by_scope(all_cards, {c.minor: c for c in cands}, count, not whole,
                                 scope, lambda c: scores[c.minor])
        if chosen is None:
            return unschedulable(ERR_TOPOLOGY_SCOPED if scoped else insufficient(t))
    if chosen is None and scoped:
        key = binpack if gpushare else (lambda c: (False, *rank(c)))
        chosen = choose_scoped(cands, all_cards, count, scope, whole, key)
        if chosen is None:
            return unschedulable(ERR_TOPOLOGY_SCOPED)
    if chosen is None and whole and count > 1 and not preferred:
        chosen = choose_whole(cands, all_cards, count)
    if chosen is None and gpushare:
        chosen = sorted(cands, key=binpack)[:count]
    if chosen is not None:
        return [_use(treq, c, amounts[c.minor]) for c in chosen]
    # Koordinator's defaultAllocateDevices: by score (preferred switches round-robin first),
    # each card giving a VF when the hint asks for one, up to ``most`` cards.
    want_vf = needs_vf(hint)
    most = max(most, count)
    uses: list[CardUse] = []
    for c in _round_robin(cands, rank, preferred):
        vfs: tuple[VF, ...] = ()
        if want_vf:
            assert hint is not None
            only = designated.get(c.minor) if designated is not None else None
            vf = choose_vf(c, hint, view.vfs_taken.get((t, c.minor), ()), only or None)
            if vf is None:
                continue
            vfs = (vf,)
        uses.append(_use(treq, c, amounts[c.minor], vfs))
        if len(uses) == most:
            break
    if len(uses) < count:
        return unschedulable(insufficient(t))
    return uses


def _pcies(view: NodeView, uses: Sequence[CardUse]) -> frozenset[str]:
    out: set[str] = set()
    for use in uses:
        for card in view.cards.get(use.device_type, ()):
            if card.minor == use.minor and card.topology is not None:
                out.add(card.topology.pcie_id)
    return frozenset(out)


def allocate(view: NodeView, request: DeviceRequest, scorer: Scorer) -> list[CardUse] | Status:
    """The pod's cards on ``view``'s node, or the Status saying why there are none."""
    for treq in request.types:
        if not any(c.exists for c in view.cards.get(treq.device_type, ())):
            return unresolvable(insufficient(treq.device_type))
    for treq in request.types:
        t = treq.device_type
        if needs_vf(request.hints.get(t)) and not has_vfs(view.cards.get(t, ())):
            return unresolvable(f"Insufficient {t} VirtualFunctions")
    uses: list[CardUse] = []
    done: set[str] = set()
    if len(request.joint_types) >= 2:
        primary = request.type_request(request.joint_types[0])
        assert primary is not None
        got = _allocate_type(view, request, primary, scorer)
        if isinstance(got, Status):
            return got
        uses.extend(got)
        done.add(primary.device_type)
        pcies = _pcies(view, got)
        for t in request.joint_types[1:]:
            secondary = request.type_request(t)
            assert secondary is not None
            # At least one card per switch of the primary with SamePCIe, at most that many
            # (or the count asked for) either way (Koordinator's jointAllocate).
            minimum = len(pcies) if request.joint_same_pcie else 0
            got = _allocate_type(view, request, secondary, scorer, pcies, minimum, len(pcies))
            if isinstance(got, Status):
                return got
            if request.joint_same_pcie and _pcies(view, got) != pcies:
                return unschedulable(ERR_JOINT_VIOLATION)
            uses.extend(got)
            done.add(t)
    for treq in request.types:
        if treq.device_type in done:
            continue
        got = _allocate_type(view, request, treq, scorer)
        if isinstance(got, Status):
            return got
        uses.extend(got)
    return uses


_GPU_NAMES: Final = RESOURCES_BY_TYPE[DEVICE_GPU]
_GPU_BY_NAME: Final = tuple(sorted(range(len(_GPU_NAMES)), key=lambda i: _GPU_NAMES[i]))
"""The GPU resource indexes in the order of their names (``CardUse.resources`` order)."""


def plain_gpu_request(request: DeviceRequest, meta: NodeMeta) -> TypeRequest | None:
    """The request's one GPU ``TypeRequest`` when ``allocate`` on a node with ``meta`` ends
    in ``sorted(cands, key=order)[:count]`` with nothing preferred: GPUs only, no joint rule,
    no gpushare units, a GPU hint (if any) without selector or topology scope, and either
    shared cards or whole cards on a node (and pod) without partitions — several whole cards
    only where the scope tree chooses them (a node without a GPU interconnect whose GPUs all
    report topology); else None."""
    if len(request.types) != 1 or request.joint_types or request.gpushare_units:
        return None
    treq = request.types[0]
    if treq.device_type != DEVICE_GPU or treq.count <= 0:
        return None
    hint = request.hints.get(DEVICE_GPU)
    if hint is not None and (
        hint.selector is not None or hint.required_topology_scope not in ("", SCOPE_NODE)
    ):
        return None
    if not treq.shared and (
        uses_partitions(meta, request.partition)
        or (treq.count > 1 and (not meta.gpu_scope_tree or bool(meta.gpu_topology)))
    ):
        return None
    return treq


def allocate_plain(
    ledger: NodeDeviceLedger, node: str, request: DeviceRequest, scorer: Scorer
) -> list[CardUse] | Status | None:
    """``allocate(ledger.node_view(node, request.device_types), request, scorer)`` read
    straight from the node's ledger row (no ``CardView``), for the requests
    ``plain_gpu_request`` accepts; None for the others (the caller runs ``allocate``).

    The same result: the candidates are the existing, healthy cards that ``gpu_amounts``
    accepts (``card_amounts``' own completion), ranked by ``(-scorer.card_score, minor)`` (the same
    formula, ``Scorer.amounts_score``), the first ``count`` taken; the same Status when there
    is no card (``Insufficient gpu devices``, unresolvable) or too few candidates
    (unschedulable). Property-tested against ``allocate`` (tests/unit/devices)."""
    treq = plain_gpu_request(request, ledger.node_meta(node))
    if treq is None:
        return None
    row = ledger.row_of(node)
    minors = ledger.minors(node, DEVICE_GPU)
    if row is None or not minors:
        return unresolvable(insufficient(DEVICE_GPU))
    n = len(minors)
    tbl = ledger.table(DEVICE_GPU)
    exists = tbl.exists[row, :n].tolist()
    if not any(exists):
        return unresolvable(insufficient(DEVICE_GPU))
    healthy = tbl.healthy[row, :n].tolist()
    totals = tbl.total[:, row, :n].T.tolist()
    frees = tbl.free[:, row, :n].T.tolist()
    ranked: list[tuple[int, int, tuple[int, int, int]]] = []
    for col in range(n):
        if not (exists[col] and healthy[col]):
            continue
        total, free = totals[col], frees[col]
        amounts = gpu_amounts(treq, total, free)
        if amounts is None:
            continue
        score = scorer.amounts_score(DEVICE_GPU, total, free, amounts)
        ranked.append((-score, minors[col], amounts))
    if len(ranked) < treq.count:
        return unschedulable(insufficient(DEVICE_GPU))
    if ledger.node_meta(node).gpu_scope_tree and (not treq.shared or treq.count <= 1):
        ranked = _by_scope_tree(ledger, node, request, treq, ranked, exists)
    elif treq.count == 1:
        ranked = [min(ranked)]
    else:
        ranked.sort()
        del ranked[treq.count:]
    with_core = treq.requested[GPU_CORE_INDEX]
    return [
        CardUse(
            DEVICE_GPU,
            minor,
            tuple(
                (_GPU_NAMES[i], amounts[i])
                for i in _GPU_BY_NAME
                if with_core or i != GPU_CORE_INDEX
            ),
        )
        for _, minor, amounts in ranked
    ]


def _by_scope_tree(
    ledger: NodeDeviceLedger,
    node: str,
    request: DeviceRequest,
    treq: TypeRequest,
    ranked: list[tuple[int, int, tuple[int, int, int]]],
    exists: list[bool],
) -> list[tuple[int, int, tuple[int, int, int]]]:
    """``allocate_plain``'s choice on a node whose GPUs all report topology: the scope tree
    over the row (``scopetree.choose_minors``, as ``allocate`` runs it)."""
    row = ledger.row_of(node)
    assert row is not None
    minors = ledger.minors(node, DEVICE_GPU)
    used_row: IntArray = ledger.table(DEVICE_GPU).used[:, row, : len(minors)]
    in_use: list[bool] = np.any(used_row != 0, axis=0).tolist()
    layout: list[tuple[int, int, str]] = []
    used: set[int] = set()
    for col, minor in enumerate(minors):
        meta = ledger.card_meta(node, DEVICE_GPU, minor) if exists[col] else None
        if meta is None or meta.topology is None:
            continue
        layout.append((minor, meta.topology.node_id, meta.topology.pcie_id))
        if in_use[col]:
            used.add(minor)
    by_minor = {minor: entry for entry in ranked for minor in (entry[1],)}
    hint = request.hints.get(DEVICE_GPU)
    scope = hint.required_topology_scope if hint is not None else ""
    chosen = choose_minors(tuple(layout), used, {m: -e[0] for m, e in by_minor.items()},
                           treq.count, treq.shared, scope)
    assert chosen is not None  # enough candidates: the node scope always answers
    return [by_minor[m] for m in chosen]


def _take(matrix: npt.NDArray[Any], rows: IntArray | slice) -> npt.NDArray[Any]:
    """``matrix[rows]`` (rows of a 2-D matrix); ``np.take`` for index arrays (a plain gather,
    far cheaper than numpy's general fancy indexing)."""
    if isinstance(rows, slice):
        return matrix[rows]
    return np.take(matrix, rows, axis=0)


def card_fits(ledger: NodeDeviceLedger, treq: TypeRequest, rows: IntArray | slice) -> BoolArray:
    """For the ledger ``rows``: which cards can give ``treq``'s per-card request (exactly
    where ``card_amounts`` is not None; rows x cards)."""
    tbl = ledger.table(treq.device_type)
    free = tbl.free
    ok: BoolArray = _take(tbl.healthy, rows).copy()
    per = treq.per_device
    if treq.device_type != DEVICE_GPU:
        ok &= _take(free[0], rows) >= per[0]
        return ok
    if treq.requested[GPU_CORE_INDEX]:
        ok &= _take(free[GPU_CORE_INDEX], rows) >= per[GPU_CORE_INDEX]
    card_memory = _take(tbl.total[GPU_MEMORY_INDEX], rows)
    if treq.requested[GPU_RATIO_INDEX]:
        ratio = per[GPU_RATIO_INDEX]
        ok &= _take(free[GPU_RATIO_INDEX], rows) >= ratio
        ok &= _take(free[GPU_MEMORY_INDEX], rows) >= ratio * card_memory // 100
    else:
        memory = per[GPU_MEMORY_INDEX]
        ok &= card_memory > 0
        ok &= _take(free[GPU_MEMORY_INDEX], rows) >= memory
        ok &= _take(free[GPU_RATIO_INDEX], rows) >= memory * 100 // np.maximum(card_memory, 1)
    return ok


def card_taken(ledger: NodeDeviceLedger, treq: TypeRequest, rows: IntArray | slice
               ) -> tuple[BoolArray, IntArray]:
    """``card_fits`` and what the request would take from each card (resources x rows x
    cards; memory and ratio completed as ``card_amounts`` does)."""
    tbl = ledger.table(treq.device_type)
    ok = card_fits(ledger, treq, rows)
    per = treq.per_device
    taken: IntArray = np.zeros_like(tbl.free[:, rows])
    if treq.device_type == DEVICE_GPU:
        card_memory = _take(tbl.total[GPU_MEMORY_INDEX], rows)
        if treq.requested[GPU_CORE_INDEX]:
            taken[GPU_CORE_INDEX] = per[GPU_CORE_INDEX]
        if treq.requested[GPU_RATIO_INDEX]:
            ratio = per[GPU_RATIO_INDEX]
            taken[GPU_RATIO_INDEX] = ratio
            taken[GPU_MEMORY_INDEX] = ratio * card_memory // 100
        else:
            memory = per[GPU_MEMORY_INDEX]
            taken[GPU_MEMORY_INDEX] = memory
            taken[GPU_RATIO_INDEX] = memory * 100 // np.maximum(card_memory, 1)
    else:
        taken[0] = per[0]
    return ok, taken


def card_left(ledger: NodeDeviceLedger, treq: TypeRequest, rows: IntArray | slice
              ) -> tuple[BoolArray, IntArray]:
    """``card_fits`` and each card's ``share`` (thousandths free, as the ledger defines it)
    once ``treq``'s per-card request is taken from it (rows x cards; never negative)."""
    tbl = ledger.table(treq.device_type)
    fits = card_fits(ledger, treq, rows)
    per = treq.per_device
    taken: list[IntArray | int] = list(per)
    if treq.device_type == DEVICE_GPU:
        card_memory = _take(tbl.total[GPU_MEMORY_INDEX], rows)
        taken[GPU_CORE_INDEX] = per[GPU_CORE_INDEX] if treq.requested[GPU_CORE_INDEX] else 0
        if treq.requested[GPU_RATIO_INDEX]:
            taken[GPU_MEMORY_INDEX] = per[GPU_RATIO_INDEX] * card_memory // 100
        else:
            taken[GPU_RATIO_INDEX] = per[GPU_MEMORY_INDEX] * 100 // np.maximum(card_memory, 1)
    share: IntArray | None = None
    declared: BoolArray | None = None
    for i, amount in enumerate(taken):
        total = _take(tbl.total[i], rows)
        left = np.maximum(_take(tbl.free[i], rows) - amount, 0)
        part = np.where(total > 0, left * SHARE // np.maximum(total, 1), SHARE)
        share = part if share is None else np.minimum(share, part)
        declared = total > 0 if declared is None else declared | (total > 0)
    assert share is not None and declared is not None
    out: IntArray = np.where(declared, share, 0)
    return fits, out


def feasible_rows(ledger: NodeDeviceLedger, request: DeviceRequest) -> BoolArray:
    """For every ledger row, whether each requested type has ``count`` (at least one) cards
    that fit the per-card request, plus a trailing False (for nodes without a row).

    For ``request.vectorizable`` requests that is exactly "``allocate`` succeeds" except on
    rows in ``ledger.honor_rows`` (whole GPUs there must form a table partition); for the
    others (selector, scope, joint, allocate strategies, partition spec) and those rows it is
    a necessary condition.
    """
    n = ledger.n_rows
    out = np.zeros(n + 1, bool)
    if n == 0:
        return out
    out[:n] = rows_feasible(ledger, request, slice(0, n))
    return out


def rows_feasible(ledger: NodeDeviceLedger, request: DeviceRequest, rows: IntArray | slice
                  ) -> BoolArray:
    """``feasible_rows`` for the given ledger ``rows`` only (each must be < ``n_rows``)."""
    if not isinstance(rows, slice) and len(rows) <= FEW_ROWS:
        return np.array([row_feasible(ledger, request, r) for r in rows.tolist()], bool)
    ok_rows: BoolArray | None = None
    for treq in request.types:
        ok = card_fits(ledger, treq, rows)
        fit: BoolArray = (
            np.any(ok, axis=1) if treq.count <= 1 else np.sum(ok, axis=1) >= treq.count
        )
        ok_rows = fit if ok_rows is None else ok_rows & fit
    assert ok_rows is not None
    return ok_rows

