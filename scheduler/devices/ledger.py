"""``NodeDeviceLedger``: every node's devices, what each card has, and who holds what.

Role: the scheduler's one source of truth for card state (Koordinator's ``nodeDeviceCache``,
``device_cache.go``), shared by every profile and plugin through the Handle
(``scheduler.devices.ledger_of``) and kept as numpy matrices (``table.CardTable``, one per
device type) so Filter and Score can look at every card of the cluster in one pass. Per device
type (gpu, rdma, fpga) and per tracked resource
(``request.RESOURCES_BY_TYPE``) there are ``rows x cards`` int64 matrices ``total``, ``used``
and ``free``, boolean ``exists``/``healthy`` masks, and per-row sums of ``total`` and of the
allocated part ``total - free``, and ``share``: the free part of each card in thousandths,
``min_r(free_r * 1000 // total_r)`` over the card's declared resources (1000 = an idle card,
0 for an unhealthy or undeclared one). ``row_version`` changes whenever anything of a row
does, so readers can cache per-row derived values. A node gets a row the first time it has a
Device or a holding; rows and card columns grow by doubling and are updated in place, per
change. A node's Device is its Device CR, else the cards its gpushare capacity implies, and
the operator's ``unhealthy-gpu-<node>`` ConfigMap takes cards away (``sources.NodeSources``).

Per node it also keeps the read-only ``NodeMeta`` of its Device CR — the GPU interconnect
(``gpu-topology``), the partition table (``gpu-partitions``) and the ``gpu-partition-policy``
label — decoded once per Device change (a malformed annotation is logged, counted in
``annotation_errors`` and treated as absent), handed out with every ``NodeView``, and the rows
that have each (``topology_rows``, ``table_rows``, ``honor_rows``) so whole-cluster passes
touch only those nodes.

Fed only by the scheduling thread: Device add/update/delete, Node changes (their gpushare
capacity), unhealthy-gpu ConfigMaps, Pod changes (the
``scheduling.koordinator.sh/device-allocated`` annotation of assigned pods of any scheduler),
and DeviceShare's Reserve/Unreserve (which also carry the bind outcome: a failed bind runs
Unreserve, a successful one is confirmed by the pod's event). Readers never write; what-if
questions (preemption dry runs) go through ``overlay.NodeOverlay``, which never mutates it.

Invariants:

- A holding is keyed by pod uid: a pod holds exactly what its latest known allocation says,
  so the informer event that follows our own bind (same allocation) changes nothing, and a
  terminal (Succeeded/Failed) or deleted pod releases everything it held.
- ``used`` of a card is the sum of the holdings' amounts on it; ``free = max(total - used, 0)``;
  ``total`` is the node's Device's amount for a healthy card and 0 otherwise (an unhealthy
  card — the Device says so, or the unhealthy-gpu ConfigMap names it — keeps its users). A
  card that is in no Device but still held is kept as an unusable column (``exists`` False,
  total 0), so a deleted and re-created Device CR cannot cause a double allocation.
- GPUs listed in the Device annotation ``node.koordinator.sh/devices-checkpoints`` (matched by
  card id) count as fully used (a per-node checkpoint holding of the card's declared amounts).
- A bound pod's ``device-allocated`` annotation never makes a card look less used (issue 23;
  ``apis.allocation.held_amounts``): an invalid entry (a negative amount, one beyond a device,
  none at all, a card named twice) holds the card it names whole, an annotation that does not
  decode every card of the node; both follow the node's Device CR as it changes. Such a pod
  is logged once per annotation text, counted in ``annotation_errors`` and handed to
  ``on_invalid`` (the plugins report it to the cluster); it never raises. A reservation of
  ours on the same node is kept beside it.
- ``replay(devices, pods, reservations)`` (a rebuild from scratch) gives the same
  ``snapshot_state()`` as the incremental ledger that saw those objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationReading, read_allocations
from apis.core import Node, Pod
from apis.device import Device
from apis.gpushare import GPUShareDecodeError, MemoryUnit, UnhealthyGPUs
from apis.resources import DEVICE_TYPES
from scheduler.devices.request import (
    ANNOTATION,
    RESERVED,
    RESOURCE_INDEX,
    RESOURCES_BY_TYPE,
    CardUse,
    Holding,
    InvalidAllocation,
    gpushare_uses,
    held_uses,
)
from scheduler.devices.sources import NodeSources, checkpoint_holding, decode_meta
from scheduler.devices.table import CardTable, RowCards, accumulate, card_views
from scheduler.devices.topology import NO_NODE_META, CardMeta, CardView, NodeMeta, NodeView
from scheduler.devices.vfs import vfs_held
from scheduler.framework.events import UNHEALTHY_GPUS_KIND, Change

__all__ = ["InvalidAllocation", "NodeDeviceLedger"]

log = structlog.get_logger(__name__)

I64 = npt.NDArray[np.int64]


class NodeDeviceLedger:
    """The cluster's device inventory and allocations (see the module docstring)."""

    def __init__(
        self, rows: int = 64, cards: int = 8, gpushare_unit: MemoryUnit = MemoryUnit.GiB
    ) -> None:
        self._sources = NodeSources(gpushare_unit)
        self._rows_cap = max(1, rows)
        self._tables = {
            t: CardTable(len(RESOURCES_BY_TYPE[t]), self._rows_cap, max(1, cards))
            for t in DEVICE_TYPES
        }
        self._row_of: dict[str, int] = {}
        self._names: list[str] = []
        self._meta: list[dict[str, RowCards]] = []
        self._devices: dict[str, Device] = {}
        self._node_meta: dict[str, NodeMeta] = {}
        self.topology_rows: set[int] = set()
        """Rows whose Device CR carries a GPU interconnect (``gpu-topology``) with NVLink or
        PCIe levels: only these get the interconnect-aware choice and score."""
        self.honor_rows: set[int] = set()
        """Rows whose Device CR says ``gpu-partition-policy: Honor``."""
        self.table_rows: set[int] = set()
        """Rows whose Device CR carries a (valid, non-empty) ``gpu-partitions`` table."""
        self._holdings: dict[str, Holding] = {}
        self._checkpoints: dict[str, Holding] = {}
        self._by_node: dict[str, set[str]] = {}
        self._vf_nodes: set[str] = set()
        """Nodes with a card that declares SR-IOV VF groups (their views list VFs held)."""
        self._invalid: dict[str, tuple[AllocationReading, tuple[CardUse, ...]]] = {}
        """Per uid of a pod with an invalid annotation: its reading and the reservation of
        ours it keeps beside it (its holding is recomputed when its node's Device changes)."""
        self.on_invalid: Callable[[InvalidAllocation], None] | None = None
        """Called once per invalid annotation text of a bound pod (reporting, by the plugins:
        the ledger never calls the cluster)."""
        self.annotation_errors = 0
        self.node_set_generation = 0
        self.row_version: I64 = np.zeros(self._rows_cap, np.int64)
        """Per row, the value ``tick`` had at its last change (``tick`` counts the changes)."""
        self.tick = 0

    # -- reading ----------------------------------------------------------------------------

    @property
    def gpushare_unit(self) -> MemoryUnit:
        """The size of one ``aliyun.com/gpu-mem`` (pods and node capacity of gpushare)."""
        return self._sources.unit

    @gpushare_unit.setter
    def gpushare_unit(self, unit: MemoryUnit) -> None:
        for node in self._sources.set_unit(unit):
            self._refresh(node)

    @property
    def n_rows(self) -> int:
        return len(self._names)

    def row_of(self, node: str) -> int | None:
        return self._row_of.get(node)

    def table(self, device_type: str) -> CardTable:
        return self._tables[device_type]

    def has_device(self, node: str) -> bool:
        return node in self._devices

    @property
    def row_capacity(self) -> int:
        """Allocated rows of every matrix (>= ``n_rows``; grows by doubling)."""
        return self._rows_cap

    def node_name(self, row: int) -> str:
        return self._names[row]

    def device(self, node: str) -> Device | None:
        """The Device that describes the node: its CR as last seen, else the cards derived
        from its gpushare capacity (``sources``)."""
        return self._devices.get(node)

    def node_meta(self, node: str) -> NodeMeta:
        """The node's GPU interconnect, partition table and policy (decoded once per CR)."""
        return self._node_meta.get(node, NO_NODE_META)

    def minors(self, node: str, device_type: str) -> tuple[int, ...]:
        """The card minor of each column of the node's row (columns in this order)."""
        row = self._row_of.get(node)
        return () if row is None else tuple(self._meta[row][device_type].minors)

    def holding(self, uid: str) -> Holding | None:
        return self._holdings.get(uid)

    def held_from_the_cluster(self, uid: str) -> Holding | None:
        """``uid``'s holding when the cluster showed it (a bound pod's annotation, a bind's
        read-back), not a reservation of ours: that pod is bound, whatever our queue says."""
        current = self._holdings.get(uid)
        return current if current is not None and current.source != RESERVED else None

    def checkpoint_holding(self, node: str) -> Holding | None:
        """The cards kubelet-allocated pods hold on ``node`` (``devices-checkpoints``)."""
        return self._checkpoints.get(node)

    def holdings_on(self, node: str) -> list[Holding]:
        return [self._holdings[u] for u in sorted(self._by_node.get(node, ()))]

    def card_meta(self, node: str, device_type: str, minor: int) -> CardMeta | None:
        row = self._row_of.get(node)
        if row is None:
            return None
        rt = self._meta[row][device_type]
        col = rt.col_of.get(minor)
        return None if col is None else rt.cols[col]

    def node_view(
        self,
        node: str,
        device_types: Iterable[str],
        removed: Iterable[Holding] = (),
        added: Iterable[Holding] = (),
    ) -> NodeView:
        """The node's cards of ``device_types``; ``removed`` holdings count as released and
        ``added`` ones as held (a what-if view: the ledger itself is not changed)."""
        row = self._row_of.get(node)
        minus: dict[tuple[str, int], list[int]] = {}
        for h in removed:
            if h.node != node:
                continue
            for use in h.uses:
                accumulate(minus, use, 1)
        for h in added:
            if h.node != node:
                continue
            for use in h.uses:
                accumulate(minus, use, -1)
        cards: dict[str, tuple[CardView, ...]] = {}
        for t in device_types:
            cards[t] = () if row is None else card_views(
                self._tables[t], self._meta[row][t], row, t, minus
            )
        vfs_taken = {}
        if node in self._vf_nodes:
            extra = [h for h in added if h.node == node]
            gone = {h.uid for h in removed if h.node == node} | {h.uid for h in extra}
            kept = [h for h in self._node_holdings(node) if h.uid not in gone]
            vfs_taken = vfs_held([*kept, *extra])
        return NodeView(node, node in self._devices, cards, self.node_meta(node), vfs_taken)

    # -- changes ----------------------------------------------------------------------------

    def apply_change(self, change: Change) -> None:
        """The event handler: Device and Pod changes (other kinds are ignored)."""
        if change.kind == "Device":
            if change.new is None:
                if change.old is not None:
                    self.delete_device(change.old.name)
            else:
                if change.old is not None and change.old.name != change.new.name:
                    self.delete_device(change.old.name)
                self.set_device(change.new)
        elif change.kind == "Pod":
            self.observe_pod(change.old, change.new)
        elif change.kind == "Node":
            self.observe_node(change.old, change.new)
        elif change.kind == UNHEALTHY_GPUS_KIND:
            record: UnhealthyGPUs = change.new if change.new is not None else change.old
            self.set_unhealthy(record.node, record.minors if change.new is not None else None)
            if change.new is not None and change.new.problems:
                log.warning("entries of an unhealthy-gpu ConfigMap that are not card indexes "
                            "are skipped; the others are honoured", configmap=record.key,
                            problems=list(record.problems), unhealthy=sorted(record.minors))

    def set_device(self, device: Device) -> None:
        """A Device CR added or updated: it describes the node from now on."""
        self._sources.set_cr(device)
        self._refresh(device.name)

    def delete_device(self, node: str) -> None:
        if self._sources.delete_cr(node):
            self._refresh(node)

    def observe_node(self, old: Node | None, new: Node | None) -> None:
        """A Node change: the cards of its gpushare capacity (used without a Device CR)."""
        if new is not None:
            if self._sources.set_node(new):
                self._refresh(new.name)
        elif old is not None and self._sources.delete_node(old.name):
            self._refresh(old.name)

    def set_unhealthy(self, node: str, minors: frozenset[int] | None) -> None:
        """The operator's unhealthy cards of ``node`` (None: its ConfigMap was deleted)."""
        if self._sources.set_unhealthy(node, minors or frozenset()) and node in self._row_of:
            self._rebuild_row(node)

    def _refresh(self, node: str) -> None:
        """The Device that describes ``node`` changed (or is gone): lay its row out again."""
        device = self._sources.device(node)
        if device is None:
            if self._devices.pop(node, None) is None:
                return
            self._set_node_meta(node, NO_NODE_META)
            self._checkpoints.pop(node, None)
        else:
            self._devices[node] = device
            meta, errors = decode_meta(device)
            checkpoint, bad = checkpoint_holding(device)
            self.annotation_errors += errors + bad
            self._set_node_meta(node, meta)
            if checkpoint is None:
                self._checkpoints.pop(node, None)
            else:
                self._checkpoints[node] = checkpoint
        self._rehold_invalid(node)
        self._rebuild_row(node)

    def observe_pod(self, old: Pod | None, new: Pod | None) -> None:
        """Apply a pod change: assigned pods hold what their annotation says."""
        if new is None:
            if old is not None:
                self._release(old.uid)
            return
        if old is not None and old.uid != new.uid:
            self._release(old.uid)
        if new.terminal:
            self._release(new.uid)
            return
        if not new.assigned:
            return
        raw = new.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if raw is None:
            self._observe_gpushare(new)
            return
        current = self._holdings.get(new.uid)
        if current is not None and current.node == new.node_name and current.annotation == raw:
            # Our own bind (or a repeated update): the same text is the same allocation.
            if current.source != ANNOTATION:
                self._holdings[new.uid] = dataclasses.replace(current, source=ANNOTATION)
            return
        reading = read_allocations(raw)
        if not reading.valid:
            self._hold_invalid(new, raw, reading, current)
            return
        uses = held_uses(reading, None)
        if not uses:
            self._release(new.uid)
            return
        self._set_holding(Holding(new.uid, new.node_name, uses, ANNOTATION, raw))

    def _hold_invalid(
        self, pod: Pod, raw: str, reading: AllocationReading, current: Holding | None
    ) -> None:
        """Hold what an invalid annotation names whole (and keep our reservation beside it);
        report it once per text."""
        kept: tuple[CardUse, ...] = ()
        if current is not None and current.source == RESERVED and current.node == pod.node_name:
            kept = current.uses
        uses = held_uses(reading, self._devices.get(pod.node_name)) + kept
        self._set_holding(Holding(pod.uid, pod.node_name, uses, ANNOTATION, raw))
        self._invalid[pod.uid] = (reading, kept)
        self.annotation_errors += 1
        whole = set(reading.whole)
        held = _cards_of(u for u in uses[: len(uses) - len(kept)]
                         if reading.unreadable or (u.device_type, u.minor) in whole)
        finding = InvalidAllocation(pod, reading, held)
        log.warning(
            "invalid device allocation on a bound pod: its cards count as fully used",
            pod=pod.key, uid=pod.uid, node=pod.node_name, problems=list(reading.problems),
            held=[f"{t} {m}" for t, m in finding.held],
        )
        if self.on_invalid is not None:
            try:
                self.on_invalid(finding)
            except Exception as err:  # reporting must never break the accounting
                log.error("reporting an invalid device allocation failed", error=repr(err))

    def _rehold_invalid(self, node: str) -> None:
        """An invalid annotation holds cards of the node's Device CR: follow it (before the
        row is rebuilt from the holdings)."""
        device = self._devices.get(node)
        for uid in self._by_node.get(node, ()):
            invalid = self._invalid.get(uid)
            if invalid is not None:
                reading, kept = invalid
                holding = self._holdings[uid]
                self._holdings[uid] = dataclasses.replace(
                    holding, uses=held_uses(reading, device) + kept
                )

    def _observe_gpushare(self, pod: Pod) -> None:
        """A bound pod without ``device-allocated``: what gpushare recorded, if anything (a
        cluster switching from gpushare keeps its running pods' memory accounted)."""
        try:
            uses = gpushare_uses(pod.annotations, self.gpushare_unit)
        except GPUShareDecodeError as err:
            self.annotation_errors += 1
            log.warning(
                "malformed gpushare annotations on a bound pod",
                pod=pod.key,
                uid=pod.uid,
                node=pod.node_name,
                error=str(err),
            )
            uses = ()
        if not uses:
            self._release(pod.uid)
            return
        text = f"gpushare:{uses[0].minor}:{dict(uses[0].resources)}"
        current = self._holdings.get(pod.uid)
        if current is not None and current.node == pod.node_name and current.annotation == text:
            return
        self._set_holding(Holding(pod.uid, pod.node_name, uses, ANNOTATION, text))

    def reserve(
        self, uid: str, node: str, uses: Sequence[CardUse], annotation: str = ""
    ) -> Holding:
        """Record our own allocation (Reserve); returns the holding to pass to ``unreserve``.

        ``annotation`` is the text PreBind will write, so the bind event is recognised
        without decoding it. A holding the cluster showed is never replaced by a reservation
        (it would free cards the pod sits on): the caller checks ``held_from_the_cluster``."""
        if self.held_from_the_cluster(uid) is not None:
            raise ValueError(f"pod {uid} holds cards per the cluster; it cannot reserve")
        holding = Holding(uid, node, tuple(uses), RESERVED, annotation)
        self._set_holding(holding)
        return holding

    def unreserve(self, holding: Holding) -> None:
        """Undo ``reserve`` unless the pod's own allocation has replaced it since."""
        if self._holdings.get(holding.uid) is holding:
            self._release(holding.uid)

    def release_reservation(self, uid: str) -> None:
        """Drop ``uid``'s holding if it is still only a reservation of ours."""
        current = self._holdings.get(uid)
        if current is not None and current.source == RESERVED:
            self._release(uid)

    # -- rebuild and comparison ----------------------------------------------------------------

    @classmethod
    def replay(
        cls,
        devices: Iterable[Device],
        pods: Iterable[Pod],
        reservations: Iterable[Holding] = (),
        gpushare_unit: MemoryUnit = MemoryUnit.GiB,
        nodes: Iterable[Node] = (),
        unhealthy: Iterable[UnhealthyGPUs] = (),
    ) -> NodeDeviceLedger:
        """A ledger rebuilt from scratch from the current objects and open reservations."""
        ledger = cls(gpushare_unit=gpushare_unit)
        for node in nodes:
            ledger.observe_node(None, node)
        for marks in unhealthy:
            ledger.set_unhealthy(marks.node, marks.minors)
        for device in devices:
            ledger.set_device(device)
        for pod in pods:
            ledger.observe_pod(None, pod)
        for h in reservations:
            ledger.reserve(h.uid, h.node, h.uses, h.annotation)
        return ledger

    def snapshot_state(self) -> dict[str, Any]:
        """A canonical, layout-independent picture of the matrices and the holdings."""
        nodes: dict[str, Any] = {}
        for name, row in sorted(self._row_of.items()):
            per_type: dict[str, Any] = {}
            for t in DEVICE_TYPES:
                rt = self._meta[row][t]
                tbl = self._tables[t]
                cards = {}
                for col, minor in enumerate(rt.minors):
                    used = tuple(int(x) for x in tbl.used[:, row, col])
                    if rt.cols[col] is None and not any(used):
                        continue
                    cards[minor] = {
                        "meta": rt.cols[col],
                        "exists": bool(tbl.exists[row, col]),
                        "healthy": bool(tbl.healthy[row, col]),
                        "total": tuple(int(x) for x in tbl.total[:, row, col]),
                        "used": used,
                        "free": tuple(int(x) for x in tbl.free[:, row, col]),
                        "share": int(tbl.share[row, col]),
                    }
                if cards:
                    per_type[t] = dict(sorted(cards.items()))
            sums = {
                t: (
                    tuple(int(x) for x in self._tables[t].sum_total[:, row]),
                    tuple(int(x) for x in self._tables[t].sum_alloc[:, row]),
                )
                for t in DEVICE_TYPES
            }
            if per_type or name in self._devices:
                nodes[name] = {"device": name in self._devices, "cards": per_type, "sums": sums}
        holders = {uid: h.state() for uid, h in sorted(self._holdings.items())}
        checkpoints = {n: h.state() for n, h in sorted(self._checkpoints.items())}
        return {"nodes": nodes, "holders": holders, "checkpoints": checkpoints}

    # -- internals ----------------------------------------------------------------------------

    def _node_holdings(self, node: str) -> list[Holding]:
        out = [self._holdings[u] for u in self._by_node.get(node, ())]
        checkpoint = self._checkpoints.get(node)
        if checkpoint is not None:
            out.append(checkpoint)
        return out

    def _set_node_meta(self, node: str, meta: NodeMeta) -> None:
        row = self._ensure_row(node)
        if meta is NO_NODE_META:
            self._node_meta.pop(node, None)
        else:
            self._node_meta[node] = meta
        for rows, on in (
            (self.topology_rows, bool(meta.gpu_topology)),
            (self.honor_rows, meta.honor_partitions),
            (self.table_rows, meta.partitions is not None),
        ):
            if on:
                rows.add(row)
            else:
                rows.discard(row)

    def _ensure_row(self, node: str) -> int:
        row = self._row_of.get(node)
        if row is not None:
            return row
        row = len(self._names)
        if row >= self._rows_cap:
            self._rows_cap *= 2
            for tbl in self._tables.values():
                tbl.grow(self._rows_cap, tbl.cards)
        self._row_of[node] = row
        self._names.append(node)
        self._meta.append({t: RowCards() for t in DEVICE_TYPES})
        if len(self.row_version) < self._rows_cap:
            version = np.zeros(self._rows_cap, np.int64)
            version[: len(self.row_version)] = self.row_version
            self.row_version = version
        self.node_set_generation += 1
        return row

    def _touch(self, row: int) -> None:
        self.tick += 1
        self.row_version[row] = self.tick

    def _rebuild_row(self, node: str) -> None:
        """Lay out the node's row again from its Device CR and its holdings."""
        row = self._ensure_row(node)
        device = self._devices.get(node)
        unhealthy = self._sources.unhealthy(node)
        usage: dict[tuple[str, int], list[int]] = {}
        vf_cards = False
        for h in self._node_holdings(node):
            for use in h.uses:
                accumulate(usage, use, 1)
        for t in DEVICE_TYPES:
            names = RESOURCES_BY_TYPE[t]
            metas: dict[int, CardMeta] = {}
            for d in device.devices_of_type(t) if device is not None else ():
                if d.minor is None or d.minor in metas:
                    continue
                metas[d.minor] = CardMeta(
                    minor=d.minor,
                    id=d.id,
                    healthy=d.health and d.minor not in unhealthy,
                    declared=tuple(d.resource_value(n) for n in names),
                    labels=d.labels,
                    topology=d.topology,
                    vf_groups=d.vf_groups,
                )
                if d.vf_groups:
                    vf_cards = True
            self._meta[row][t] = self._tables[t].lay_out(row, metas, usage, t)
        if vf_cards:
            self._vf_nodes.add(node)
        else:
            self._vf_nodes.discard(node)
        self._touch(row)

    def _set_holding(self, holding: Holding) -> None:
        self._invalid.pop(holding.uid, None)
        current = self._holdings.get(holding.uid)
        if current is not None and current.same_allocation(holding):
            self._holdings[holding.uid] = holding
            return
        if current is not None:
            self._release(holding.uid)
        self._holdings[holding.uid] = holding
        self._by_node.setdefault(holding.node, set()).add(holding.uid)
        self._apply_uses(holding.node, holding.uses, 1)

    def _release(self, uid: str) -> None:
        self._invalid.pop(uid, None)
        holding = self._holdings.pop(uid, None)
        if holding is None:
            return
        uids = self._by_node.get(holding.node)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._by_node[holding.node]
        self._apply_uses(holding.node, holding.uses, -1)

    def _apply_uses(self, node: str, uses: Sequence[CardUse], sign: int) -> None:
        row = self._ensure_row(node)
        touched: dict[str, set[int]] = {}
        for use in uses:
            index = RESOURCE_INDEX.get(use.device_type)
            if index is None:
                continue
            tbl = self._tables[use.device_type]
            rt = self._meta[row][use.device_type]
            col = rt.col_of.get(use.minor)
            if col is None:
                col = len(rt.minors)
                tbl.ensure_cards(col + 1)
                rt.cols.append(None)
                rt.minors.append(use.minor)
                rt.col_of[use.minor] = col
            for name, amount in use.resources:
                ri = index.get(name)
                if ri is not None:
                    tbl.used[ri, row, col] += sign * amount
            touched.setdefault(use.device_type, set()).add(col)
        for t, cols in touched.items():
            self._tables[t].refresh_used(row, cols)
        self._touch(row)


def _cards_of(uses: Iterable[CardUse]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted({(u.device_type, u.minor) for u in uses}))
