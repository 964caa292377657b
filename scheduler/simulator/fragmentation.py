"""The simulator's cluster-wide GPU meter: allocated, fragmented and occupied, pod by pod.

Role: what a trace replay reports after each arriving pod (the FGD paper's metrics): the GPU
allocated (milli-GPU), the cluster's fragmented GPU ``Σ_n F_n(M)`` for the trace's typical
task shapes ``M`` (``gpufragmentation.measure``), and the number of occupied nodes (nodes with
at least one pod). It is independent of the scheduler's own bookkeeping: it is fed only with
what a user could read off the cluster — each Node's cpu, each Device CR's cards and each bound
pod's cpu request and ``device-allocated`` annotation — so it also checks what the plugins did.

Invariants: per-node values are recomputed only for the node a pod lands on; amounts are
integers (milli-GPU, millicores) and the fragmentation of a node equals the reference
definition; a card's free capacity is ``min(free gpu-core, free gpu-memory-ratio) * 10``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from apis.allocation import decode_allocations
from apis.core import CPU, Node
from apis.device import LABEL_GPU_MODEL, Device
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY_RATIO
from scheduler.plugins.gpufragmentation.measure import Workload

__all__ = ["CardUse", "FragmentationMeter", "uses_from_annotation"]

CardUse = tuple[int, int, int]
"""(minor, gpu-core percent, gpu-memory-ratio percent) taken from one card."""


def uses_from_annotation(raw: str) -> tuple[CardUse, ...]:
    """The GPU cards of a ``device-allocated`` value; raises ``AllocationDecodeError``."""
    allocations = decode_allocations(raw).get(DEVICE_GPU, ())
    return tuple(
        (a.minor, a.resource_value(GPU_CORE), a.resource_value(GPU_MEMORY_RATIO))
        for a in allocations
    )

MILLI_PER_PERCENT = 10
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class FragmentationMeter:
    """Per-node cpu, card frees and ``F_n(M)`` for a fixed node set; see the module."""

    def __init__(
        self, nodes: Sequence[Node], devices: Mapping[str, Device], workload: Workload
    ) -> None:
        self.workload = workload
        self._row = {n.name: i for i, n in enumerate(nodes)}
        cards = [self._cards(devices.get(n.name)) for n in nodes]
        width = max([len(c) for c in cards] + [1])
        self._minor_col = [{minor: j for j, (minor, _, _) in enumerate(c)} for c in cards]
        self._core = np.zeros((len(nodes), width), np.int64)
        self._ratio = np.zeros((len(nodes), width), np.int64)
        for i, c in enumerate(cards):
            for j, (_, core, ratio) in enumerate(c):
                self._core[i, j], self._ratio[i, j] = core, ratio
        self.cpu_free: I64 = np.array([n.allocatable.get(CPU, 0) for n in nodes], np.int64)
        self.free: I64 = self._free(np.arange(len(nodes)))
        self.capacity_milli = int(self.free.sum())
        self._access = np.array(
            [workload.access(n.labels.get(LABEL_GPU_MODEL, "")) for n in nodes], bool
        ).reshape(len(nodes), len(workload.shapes))
        self.frag: F64 = workload.node_values(self.cpu_free, self.free, self._access)
        self._pods = np.zeros(len(nodes), np.int64)
        self.allocated_milli = 0
        self.occupied_nodes = 0

    @staticmethod
    def _cards(device: Device | None) -> list[CardUse]:
        out: dict[int, CardUse] = {}
        for d in device.devices_of_type(DEVICE_GPU) if device is not None else ():
            if d.minor is None or d.minor in out or not d.health:
                continue
            out[d.minor] = (d.minor, d.resource_value(GPU_CORE), d.resource_value(GPU_MEMORY_RATIO))
        return [out[m] for m in sorted(out)]

    def _free(self, rows: I64) -> I64:
        free: I64 = np.maximum(np.minimum(self._core[rows], self._ratio[rows]), 0)
        return free * MILLI_PER_PERCENT

    @property
    def fragmented_milli(self) -> float:
        return float(self.frag.sum())

    def place(self, node: str, cpu_milli: int, uses: Iterable[CardUse]) -> None:
        """A pod bound to ``node`` with ``cpu_milli`` requested and these cards taken."""
        row = self._row[node]
        before = int(self.free[row].sum())
        self.cpu_free[row] -= cpu_milli
        for minor, core, ratio in uses:
            col = self._minor_col[row][minor]
            self._core[row, col] -= core
            self._ratio[row, col] -= ratio
        rows = np.array([row], np.int64)
        self.free[row] = self._free(rows)[0]
        self.allocated_milli += before - int(self.free[row].sum())
        self.frag[row] = self.workload.node_values(
            self.cpu_free[rows], self.free[rows], self._access[rows]
        )[0]
        if self._pods[row] == 0:
            self.occupied_nodes += 1
        self._pods[row] += 1
