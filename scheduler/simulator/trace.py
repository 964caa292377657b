"""Alibaba ``openb`` trace rows as Kubernetes objects (SPEC §9).

Role: read the trace's node and pod CSV files (``openb_node_list_*.csv``,
``openb_pod_list_*.csv``; columns in ``../shared/traces/alibaba-openb/README.md``) into typed
rows, and turn each row into what the scheduler sees in any other mode:

- a node row becomes a v1 Node (``cpu``, ``memory``, ``pods``; for a GPU node also the
  extended resources the node agent advertises — ``nvidia.com/gpu``, ``koordinator.sh/gpu-core``,
  ``gpu-memory-ratio``, ``gpu-memory`` — and the ``node.koordinator.sh/gpu-model`` label) and,
  when it has GPUs, a Device CR with one healthy ``gpu`` card per GPU (minor 0..n-1);
- a pod row becomes a v1 Pod: a fractional task (``num_gpu = 1, gpu_milli < 1000``) asks for
  ``koordinator.sh/gpu-core = gpu_milli / 10`` and ``gpu-memory-ratio = gpu_milli / 10``; a task
  of ``k`` whole GPUs asks for ``nvidia.com/gpu: k``; a CPU-only task asks for cpu and memory
  only; a non-empty ``gpu_spec`` (``A|B``) becomes a required node affinity on the GPU model
  label (``In [A, B]``).

The card memory of each model is not in the trace; it only matters for ``gpu-memory`` (which
these pods never request: ratio drives it), so the known models get their real size and the
undisclosed ones (G2, G3) 32Gi.

Files of the public dataset (``cluster-trace-gpu-v2023/csv/``) differ in their columns: some
carry only the first five pod columns. Only the columns a row cannot do without are required
(``NODE_COLUMNS``, ``POD_COLUMNS``); an absent optional column reads as empty, and unknown
columns are ignored.

Invariants: reading either returns fully validated rows or raises ``TraceError`` whose one-line
message names the file, the line and the column; conversion is a pure function of a row (the
same row always gives the same objects); the trace's ``qos``, ``pod_phase`` and times are read
but not used, as in the paper's simulator.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from apis.device import LABEL_GPU_MODEL, LABEL_GPU_VENDOR

__all__ = [
    "DEVICE_API_VERSION",
    "GPU_MILLI",
    "TRACE_NAMESPACE",
    "TraceError",
    "TraceNode",
    "TracePod",
    "device_object",
    "node_object",
    "pod_object",
    "read_nodes",
    "read_pods",
]

DEVICE_API_VERSION: Final = "scheduling.koordinator.sh/v1alpha1"
TRACE_NAMESPACE: Final = "openb"
GPU_MILLI: Final = 1000
"""One whole GPU in the trace's unit (``gpu_milli``); ``gpu-core`` percent is ``milli / 10``."""

NODE_PODS: Final = 1000
"""Pod capacity of a trace node: high enough that only cpu, memory and GPUs constrain
placement, as in the paper's simulator."""

GPU_MEMORY_GI: Final[Mapping[str, int]] = {
    "P100": 16,
    "T4": 16,
    "V100M16": 16,
    "V100M32": 32,
    "A10": 24,
}
DEFAULT_GPU_MEMORY_GI: Final = 32

NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu")
"""Required node columns; ``model`` is optional (absent or empty: a CPU-only node)."""
POD_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""Required pod columns: the public dataset's ``multigpu*`` files carry only these five.
``gpu_spec`` is optional (absent or empty: any model); ``qos``, ``pod_phase`` and the times,
and any column this loader does not know, are ignored."""
WHOLE_GPU_COUNTS: Final = frozenset({1, 2, 4, 8})


class TraceError(ValueError):
    """Bad trace input; ``str()`` is one line: ``<file>:<line>: <column>: <problem>``."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One node row: ``gpus`` cards of ``model`` (empty for a CPU-only node)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    @property
    def gpu_milli(self) -> int:
        return self.gpus * GPU_MILLI


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod row: ``num_gpu`` cards of ``gpu_milli`` each; ``gpu_spec`` the allowed models
    (empty: any)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI


# ---------------------------------------------------------------------------------------------
# Reading

T = TypeVar("T")


def _rows(
    path: str | os.PathLike[str], columns: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, str]]]:
    name = os.fspath(path)
    try:
        f = open(name, encoding="utf-8", newline="")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise TraceError(f"{name}: cannot read: {exc.strerror or exc}") from None
    with f:
        try:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise TraceError(f"{name}:1: missing column(s) {', '.join(missing)}")
            for row in reader:
                yield reader.line_num, row
        except UnicodeDecodeError:
            raise TraceError(f"{name}: not UTF-8 text") from None
        except csv.Error as exc:
            raise TraceError(f"{name}: malformed CSV: {exc}") from None


def _field(where: str, row: Mapping[str, str | None], column: str, parse: Callable[[str], T]) -> T:
    raw = (row.get(column) or "").strip()
    try:
        return parse(raw)
    except ValueError as exc:
        raise TraceError(f"{where}: {column}: {exc}") from None


def _count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"expected a non-negative integer, got {raw!r}")
    return value


def _name(raw: str) -> str:
    if not raw:
        raise ValueError("must be non-empty")
    return raw


def read_nodes(path: str | os.PathLike[str]) -> list[TraceNode]:
    """The node rows of an ``openb_node_list_*.csv`` file, in file order."""
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        where = f"{os.fspath(path)}:{line}"
        node = TraceNode(
            name=_field(where, row, "sn", _name),
            cpu_milli=_field(where, row, "cpu_milli", _count),
            memory_mib=_field(where, row, "memory_mib", _count),
            gpus=_field(where, row, "gpu", _count),
            model=(row.get("model") or "").strip(),
        )
        if node.gpus and not node.model:
            raise TraceError(f"{where}: model: a node with {node.gpus} GPU(s) needs a model")
        if node.name in seen:
            raise TraceError(f"{where}: sn: duplicate node {node.name!r}")
        seen.add(node.name)
        nodes.append(node)
    return nodes


def read_pods(path: str | os.PathLike[str]) -> list[TracePod]:
    """The pod rows of an ``openb_pod_list_*.csv`` file, in file order."""
    pods: list[TracePod] = []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        where = f"{os.fspath(path)}:{line}"
        spec = tuple(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        pod = TracePod(
            name=_field(where, row, "name", _name),
            cpu_milli=_field(where, row, "cpu_milli", _count),
            memory_mib=_field(where, row, "memory_mib", _count),
            num_gpu=_field(where, row, "num_gpu", _count),
            gpu_milli=_field(where, row, "gpu_milli", _count),
            gpu_spec=spec,
        )
        _check_pod(where, pod)
        if pod.name in seen:
            raise TraceError(f"{where}: name: duplicate pod {pod.name!r}")
        seen.add(pod.name)
        pods.append(pod)
    return pods


def _check_pod(where: str, pod: TracePod) -> None:
    if pod.num_gpu == 0:
        if pod.gpu_milli:
            raise TraceError(f"{where}: gpu_milli: must be 0 when num_gpu is 0")
        return
    if not 0 < pod.gpu_milli <= GPU_MILLI:
        raise TraceError(f"{where}: gpu_milli: must be in 1..{GPU_MILLI}, got {pod.gpu_milli}")
    if pod.gpu_milli % 10:
        raise TraceError(f"{where}: gpu_milli: must be a multiple of 10, got {pod.gpu_milli}")
    if pod.gpu_milli < GPU_MILLI and pod.num_gpu != 1:
        raise TraceError(f"{where}: gpu_milli: a fractional GPU share needs num_gpu 1")
    if pod.gpu_milli == GPU_MILLI and pod.num_gpu not in WHOLE_GPU_COUNTS:
        raise TraceError(f"{where}: num_gpu: must be one of 0, 1, 2, 4, 8, got {pod.num_gpu}")


# ---------------------------------------------------------------------------------------------
# Conversion


def _card_memory_gi(model: str) -> int:
    return GPU_MEMORY_GI.get(model, DEFAULT_GPU_MEMORY_GI)


def node_object(node: TraceNode) -> dict[str, Any]:
    """The v1 Node of a node row (allocatable as its node agent would advertise it)."""
    alloc: dict[str, str] = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(NODE_PODS),
    }
    labels: dict[str, str] = {"kubernetes.io/hostname": node.name}
    if node.gpus:
        alloc["nvidia.com/gpu"] = str(node.gpus)
        alloc["koordinator.sh/gpu-core"] = str(100 * node.gpus)
        alloc["koordinator.sh/gpu-memory-ratio"] = str(100 * node.gpus)
        alloc["koordinator.sh/gpu-memory"] = f"{node.gpus * _card_memory_gi(node.model)}Gi"
        labels[LABEL_GPU_MODEL] = node.model
        labels[LABEL_GPU_VENDOR] = "nvidia"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {},
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }


def device_object(node: TraceNode) -> dict[str, Any] | None:
    """The node's Device CR (one healthy card per GPU), None for a CPU-only node."""
    if not node.gpus:
        return None
    memory = f"{_card_memory_gi(node.model)}Gi"
    devices = [
        {
            "type": "gpu",
            "id": f"GPU-{node.name}-{minor}",
            "minor": minor,
            "health": True,
            "resources": {
                "koordinator.sh/gpu-core": "100",
                "koordinator.sh/gpu-memory": memory,
                "koordinator.sh/gpu-memory-ratio": "100",
            },
        }
        for minor in range(node.gpus)
    ]
    return {
        "apiVersion": DEVICE_API_VERSION,
        "kind": "Device",
        "metadata": {
            "name": node.name,
            "labels": {LABEL_GPU_MODEL: node.model, LABEL_GPU_VENDOR: "nvidia"},
        },
        "spec": {"devices": devices},
    }


def pod_requests(pod: TracePod) -> dict[str, str]:
    """The container requests of a pod row (SPEC §9)."""
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    if pod.shared:
        percent = str(pod.gpu_milli // 10)
        requests["koordinator.sh/gpu-core"] = percent
        requests["koordinator.sh/gpu-memory-ratio"] = percent
    elif pod.num_gpu:
        requests["nvidia.com/gpu"] = str(pod.num_gpu)
    return requests


def pod_object(
    pod: TracePod,
    scheduler_name: str,
    *,
    name: str | None = None,
    namespace: str = TRACE_NAMESPACE,
) -> dict[str, Any]:
    """A pending v1 Pod for a pod row; ``name`` overrides the row's (for sampled copies)."""
    pod_name = name or pod.name
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [{"name": "main", "resources": {"requests": pod_requests(pod)}}],
    }
    if pod.gpu_spec:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": LABEL_GPU_MODEL,
                                    "operator": "In",
                                    "values": list(pod.gpu_spec),
                                }
                            ]
                        }
                    ]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "uid": f"uid-{pod_name}"},
        "spec": spec,
    }
