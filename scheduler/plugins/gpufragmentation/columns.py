"""GPUFragmentation's cached columns: what the whole-cluster score reads of the cluster.

Role: ``ClusterColumns`` keeps, for the plugin, the per-ledger-row sums of the target
workload's measure (``sums``: each row's free milli-GPU in total, its healthy cards and the
grouped sums ``s``/``c`` of ``Workload.sums``; a zero sentinel row at ``capacity`` stands for
a node without a row), the map from snapshot slot to ledger row (``slot_rows``), each slot's
GPU model kind with its cpu-per-GPU and reach (``slot_access``, ``slot_rate``,
``slot_reach``), the model pressure (``pressure``) and GPUClustering's tags per row
(``row_tags``). The scoring itself stays in ``plugin`` (whole cluster) and ``pernode``.

Invariants: nothing here writes the ledger; a row's sums and tags are recomputed only when its
``row_version`` changed, every row's sums when the target workload is rebuilt (another
object or estimator generation) or the ledger's row capacity grows; the slot maps are rebuilt
when the snapshot, its node generation or size, or the ledger's node set changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from apis.device import LABEL_GPU_MODEL
from apis.resources import DEVICE_GPU
from scheduler.devices import NodeDeviceLedger
from scheduler.framework.types import IntArray, NodeInfo, Snapshot
from scheduler.plugins.gpufragmentation.baselines import node_tags
from scheduler.plugins.gpufragmentation.measure import Workload
from scheduler.plugins.gpufragmentation.workload import WorkloadEstimator

__all__ = ["ClusterColumns", "RowSums"]

F64 = npt.NDArray[np.float64]


@dataclass(slots=True)
class RowSums:
    """Per-row sums for one workload (ledger rows, plus a zero sentinel row)."""

    workload: Workload | None = None
    generation: int = -1
    capacity: int = 0
    version: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    total: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    n_cards: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    s: IntArray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    c: IntArray = field(default_factory=lambda: np.zeros((0, 0), np.int64))


class ClusterColumns:
    """The plugin's cached columns over one ledger; see the module docstring."""

    def __init__(self, ledger: NodeDeviceLedger, estimator: WorkloadEstimator) -> None:
        self.ledger = ledger
        self.estimator = estimator
        self.sums = RowSums()
        self._rows_key: tuple[int, ...] | None = None
        self._rows: IntArray = np.zeros(0, np.int64)
        self._access_key: tuple[int, ...] | None = None
        self._access: IntArray = np.zeros(0, np.int64)
        self.slot_rate: F64 = np.zeros(0, np.float64)
        """Each slot's model's ``cpu_per_gpu_of``, set with ``slot_access``."""
        self.slot_reach: F64 = np.zeros(0, np.float64)
        """Each slot's model's ``reach_of``, set with ``slot_access``."""
        self._tags: IntArray = np.zeros(1, np.int64)
        self._tags_version: IntArray = np.zeros(0, np.int64)

    def workload(self) -> Workload:
        """The current target workload, with the per-row sums brought up to date."""
        workload = self.estimator.current()
        cache, ledger = self.sums, self.ledger
        capacity = ledger.row_capacity
        n = ledger.n_rows
        if (
            cache.workload is not workload
            or cache.generation != self.estimator.generation
            or cache.capacity != capacity
        ):
            q = workload.n_groups
            cache.workload, cache.generation, cache.capacity = (
                workload,
                self.estimator.generation,
                capacity,
            )
            cache.version = np.full(capacity, -1, np.int64)
            cache.total = np.zeros(capacity + 1, np.int64)
            cache.n_cards = np.zeros(capacity + 1, np.int64)
            cache.s = np.zeros((capacity + 1, q), np.int64)
            cache.c = np.zeros((capacity + 1, q), np.int64)
        dirty = np.flatnonzero(cache.version[:n] != ledger.row_version[:n])
        if len(dirty):
            tbl = ledger.table(DEVICE_GPU)
            free = tbl.share[dirty]
            cache.s[dirty], cache.c[dirty] = workload.sums(free)
            cache.total[dirty] = free.sum(axis=1)
            cache.n_cards[dirty] = tbl.healthy[dirty].sum(axis=1)
            cache.version[dirty] = ledger.row_version[dirty]
        return workload

    def slot_rows(self, snapshot: Snapshot) -> IntArray:
        """Ledger row of every snapshot slot (``n_rows`` where a node has none), cached."""
        ledger = self.ledger
        key = (id(snapshot), snapshot.node_generation, snapshot.size, ledger.node_set_generation)
        if key != self._rows_key:
            rows = np.full(snapshot.size, ledger.n_rows, np.int64)
            for slot in range(snapshot.size):
                info = snapshot.infos[slot]
                if info is not None:
                    row = ledger.row_of(info.name)
                    if row is not None:
                        rows[slot] = row
            self._rows, self._rows_key = rows, key
        return self._rows

    def model_of(self, info: NodeInfo) -> str:
        """The node's GPU model: its Node label, else its Device CR's."""
        node = info.node
        model = node.labels.get(LABEL_GPU_MODEL, "") if node is not None else ""
        if not model:
            device = self.ledger.device(info.name)
            model = device.labels.get(LABEL_GPU_MODEL, "") if device is not None else ""
        return model

    def pressure(self, snapshot: Snapshot, workload: Workload) -> F64:
        """Per model kind: the share of GPU demand pinned to models that accept it over its
        share of the cluster's free GPU now (0 where it has none free)."""
        kinds = self.slot_access(snapshot, workload)
        rows = self.slot_rows(snapshot)
        cache = self.sums
        crow = np.where(rows < self.ledger.n_rows, rows, cache.capacity)
        pinned = workload.kind_pinned()
        free = np.bincount(kinds, weights=np.take(cache.total, crow), minlength=len(pinned))
        total = float(free.sum())
        safe = np.where(free > 0, free, 1.0)
        out: F64 = np.where(free > 0, pinned * total / safe, 0.0)
        return out

    def slot_access(self, snapshot: Snapshot, workload: Workload) -> IntArray:
        """Each snapshot slot's model ``kind`` in ``workload`` (which shapes accept its node,
        ``Workload.kind``), cached with each slot's ``cpu_per_gpu_of`` and ``reach_of`` its
        model (``slot_rate``, ``slot_reach``)."""
        key = (
            id(snapshot),
            snapshot.node_generation,
            snapshot.size,
            self.ledger.node_set_generation,
            id(workload),
            self.estimator.generation,
        )
        if key != self._access_key:
            kinds = np.zeros(snapshot.size, np.int64)
            rate = np.zeros(snapshot.size, np.float64)
            reach = np.zeros(snapshot.size, np.float64)
            for slot in range(snapshot.size):
                info = snapshot.infos[slot]
                model = self.model_of(info) if info is not None else ""
                kinds[slot] = workload.kind(model)
                rate[slot] = workload.cpu_per_gpu_of(model)
                reach[slot] = workload.reach_of(model)
            self._access, self._access_key = kinds, key
            self.slot_rate, self.slot_reach = rate, reach
        return self._access

    def row_tags(self) -> IntArray:
        """GPUClustering's tag bit set of every ledger row (plus a zero sentinel row), brought
        up to date for the rows whose ``row_version`` changed."""
        ledger = self.ledger
        capacity = ledger.row_capacity
        if len(self._tags_version) != capacity:
            self._tags = np.zeros(capacity + 1, np.int64)
            self._tags_version = np.full(capacity, -1, np.int64)
        n = ledger.n_rows
        dirty = np.flatnonzero(self._tags_version[:n] != ledger.row_version[:n])
        for row in dirty.tolist():
            holdings = ledger.holdings_on(ledger.node_name(row))
            self._tags[row] = node_tags(holdings)
        self._tags_version[dirty] = ledger.row_version[dirty]
        return self._tags
