"""gpushare's ``kubectl inspect gpushare`` output, computed and laid out as the original does.

Role: the text behind ``kubectl-inspect-gpushare``. A port of gpushare-device-plugin's
``cmd/inspect`` (nodeinfo.go, display.go at commit 45fb8b88), so that what users and their
scripts read does not change when the cluster moves to koord-py:

- a node's cards: ``aliyun.com/gpu-count`` of its ``status.allocatable``, each of
  ``aliyun.com/gpu-mem / gpu-count`` units; without a NODE argument only nodes whose allocatable
  ``aliyun.com/gpu-mem`` is above 0 are shown (``nodes_of``);
- a pod counts when it is on the node, not Succeeded/Failed, and has ``aliyun.com/gpu-mem``
  container limits: on the cards of its ``scheduler.framework.gpushare.allocation`` annotation,
  else on card ``ALIYUN_COM_GPU_MEM_IDX`` with its limits, else (no usable index) as *pending*
  (card -1: the ``PENDING(Allocated)`` column);
- the unit in the header is MiB when the first node's cards have more than 100 units, else GiB
  (empty when no node has GPU memory), like the original's ``setUnit``;
- the summary and ``-d`` layouts, rules and totals line, through Go's tabwriter.

The original walks Go maps (nodes, a node's cards), so its row order varies from run to run;
here nodes are in name order and ``-d`` walks a node's cards in the order they were added
(``0..gpu-count-1``, then the others as its pods name them): the order of the original's map
walk from its first slot, one of the orders it prints. ``koord_nodes`` turns koord-py's own account
(``inspect_gpushare.gpushare_view``: Device CR card sizes, koordinator pods too) into the same
picture, for ``--koord``.

Invariants: pure (objects in, text out); malformed values count the way the original reads them
(an unparsable index is pending, an unparsable allocation is ignored); never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apis.core import Node, Pod
from apis.gpushare import ANNOTATION_IDX, RESOURCE_GPU_COUNT, RESOURCE_GPU_MEM
from apis.jsonload import loads
from apis.quantity import Quantity, QuantityError, int_value
from scheduler.observability.inspect_gpushare import GPUShareNode
from scheduler.observability.tabwriter import tabwrite

__all__ = [
    "ANNOTATION_ALLOCATION",
    "Dev",
    "NodeInfo",
    "PodRow",
    "build_node_infos",
    "display_details",
    "display_summary",
    "koord_nodes",
    "nodes_of",
]

ANNOTATION_ALLOCATION: Final = "scheduler.framework.gpushare.allocation"
PENDING: Final = -1
MAX_CARDS: Final = 1024
"""More cards than this on one node is a broken object, not a machine (the original would
allocate and print that many columns): such a node is shown with no cards, and said so."""
_ATOI = re.compile(r"[+-]?[0-9]+")


@dataclass(slots=True)
class PodRow:
    uid: str
    name: str
    namespace: str
    memory: int
    """The pod's ``aliyun.com/gpu-mem`` limits (what ``-d`` shows under its card)."""
    allocation: dict[int, int] = field(default_factory=dict)
    """Card -> units from the allocation annotation; when set, ``-d`` shows these instead."""


@dataclass(slots=True)
class Dev:
    idx: int
    total: int
    used: int = 0
    pods: list[PodRow] = field(default_factory=list)

    def __str__(self) -> str:
        return str(self.used) if self.idx == PENDING else f"{self.used}/{self.total}"


@dataclass(slots=True)
class NodeInfo:
    name: str
    address: str
    gpu_count: int
    total_memory: int
    devs: dict[int, Dev] = field(default_factory=dict)

    @property
    def has_pending(self) -> bool:
        return PENDING in self.devs


# -- reading the objects, as nodeinfo.go / podinfo.go --------------------------------------


def _atoi(text: str) -> int | None:
    """Go's ``strconv.Atoi`` on 64-bit: None where it fails (out of range included)."""
    if not _ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else None


def _allocatable(node: Node, resource: str) -> int:
    raw = ((node.raw.get("status") or {}).get("allocatable") or {}).get(resource)
    if raw is None:
        return 0
    try:
        return _value(raw)
    except QuantityError:
        return 0


def _value(raw: Any) -> int:
    """A quantity's Go ``Value()`` (rounded up to an integer); raises QuantityError."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise QuantityError(raw)
    return int_value(Quantity.parse(raw))


def address_of(node: Node) -> str:
    """The node's InternalIP, else ``unknown``."""
    for addr in (node.raw.get("status") or {}).get("addresses") or []:
        if isinstance(addr, Mapping) and addr.get("type") == "InternalIP":
            return str(addr.get("address") or "")
    return "unknown"


def gpu_memory_in_pod(pod: Pod) -> int:
    """The ``aliyun.com/gpu-mem`` limits of the pod's app containers (init ones excluded)."""
    total = 0
    for c in (pod.raw.get("spec") or {}).get("containers") or []:
        limits = ((c.get("resources") or {}).get("limits") or {}) if isinstance(c, Mapping) else {}
        raw = limits.get(RESOURCE_GPU_MEM) if isinstance(limits, Mapping) else None
        if raw is None:
            continue
        try:
            total += _value(raw)
        except QuantityError:
            continue
    return total


def allocation_of(annotations: Mapping[str, str]) -> dict[int, int]:
    """``scheduler.framework.gpushare.allocation`` (``{container: {card: units}}``) summed per
    card; empty when absent or not exactly that shape (as Go's ``json.Unmarshal`` fails)."""
    raw = annotations.get(ANNOTATION_ALLOCATION)
    if raw is None:
        return {}
    try:
        doc = loads(raw)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    out: dict[int, int] = {}
    for key, containers in doc.items():
        if _atoi(key) is None or not isinstance(containers, dict | None):
            return {}
        for card, units in (containers or {}).items():
            if units is not None and (not isinstance(units, int) or isinstance(units, bool)):
                return {}
            index = _atoi(card)
            if index is None:
                return {}
            out[index] = out.get(index, 0) + (units or 0)
    return out


def _device_info(pod: Pod, memory: int) -> dict[int, int]:
    allocation = allocation_of(pod.annotations)
    if allocation:
        return allocation
    index = PENDING
    if pod.annotations and ANNOTATION_IDX in pod.annotations:
        parsed = _atoi(pod.annotations[ANNOTATION_IDX])
        index = PENDING if parsed is None else parsed
    return {index: memory}


def nodes_of(nodes: Iterable[Node]) -> list[Node]:
    """The nodes shown without a NODE argument: allocatable ``aliyun.com/gpu-mem`` above 0."""
    return [n for n in nodes if _allocatable(n, RESOURCE_GPU_MEM) > 0]


def build_node_infos(
    nodes: Iterable[Node], pods: Iterable[Pod], problems: list[str] | None = None
) -> tuple[list[NodeInfo], str]:
    """The nodes (by name) with their cards and pods, and the header's unit; a node whose
    card count is not believable is appended to ``problems``."""
    infos: list[NodeInfo] = []
    by_name: dict[str, NodeInfo] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        if node.name in by_name:
            continue
        count = _allocatable(node, RESOURCE_GPU_COUNT)
        total = _allocatable(node, RESOURCE_GPU_MEM)
        if count > MAX_CARDS:
            _note(problems, f"node {node.name}: {RESOURCE_GPU_COUNT} {count} is over "
                            f"{MAX_CARDS}: shown with no cards")  # fmt: skip
            count = 0
        info = NodeInfo(node.name, address_of(node), count, total)
        for i in range(count):
            info.devs[i] = Dev(i, total // count)
        by_name[node.name] = info
        infos.append(info)
    unit = ""
    pods_on: dict[str, list[Pod]] = {}
    for pod in pods:
        if pod.node_name in by_name and not pod.terminal:
            pods_on.setdefault(pod.node_name, []).append(pod)
    for info in infos:
        if info.total_memory <= 0:
            continue
        if not unit and info.gpu_count:
            unit = "MiB" if info.total_memory // info.gpu_count > 100 else "GiB"
        card_total = info.total_memory // info.gpu_count if info.gpu_count > 0 else 0
        for pod in pods_on.get(info.name, ()):
            memory = gpu_memory_in_pod(pod)
            if memory <= 0:
                continue
            row = PodRow(pod.uid or pod.key, pod.name, pod.namespace, memory,
                         allocation_of(pod.annotations))  # fmt: skip
            for index, units in _device_info(pod, memory).items():
                dev = info.devs.setdefault(index, Dev(index, card_total))
                dev.used += units
                dev.pods.append(row)
    return infos, unit


def _note(problems: list[str] | None, problem: str) -> None:
    if problems is not None:
        problems.append(problem)


def koord_nodes(view: Sequence[GPUShareNode], problems: list[str] | None = None) -> list[NodeInfo]:
    """koord-py's account (``gpushare_view``) as the original's picture: each card its own
    size, every pod shown with its units on each of its cards (a card index over
    ``MAX_CARDS`` is left out and appended to ``problems``)."""
    infos = []
    for node in view:
        per_pod: dict[str, dict[int, int]] = {}
        cards = [c for c in node.cards if 0 <= c.index < MAX_CARDS]
        for card in node.cards:
            if not 0 <= card.index < MAX_CARDS:
                _note(problems, f"node {node.name}: card {card.index} is over {MAX_CARDS}: "
                                "left out")  # fmt: skip
        for card in cards:
            for key, units in card.pods.items():
                per_pod.setdefault(key, {})[card.index] = units
        count = max((c.index for c in cards), default=-1) + 1
        info = NodeInfo(node.name, node.address or "unknown", count, sum(c.total for c in cards))
        for card in cards:
            dev = info.devs[card.index] = Dev(card.index, card.total, card.used)
            for key in card.pods:
                ns, _, name = key.partition("/")
                dev.pods.append(PodRow(key, name, ns, 0, per_pod[key]))
        infos.append(info)
    return infos


# -- display.go ------------------------------------------------------------------------------


def _percent(used: int, total: int) -> int:
    return int(used / total * 100) if total > 0 else 0


def display_summary(infos: Sequence[NodeInfo], unit: str) -> str:
    """The table ``kubectl inspect gpushare`` prints."""
    has_pending = any(i.has_pending for i in infos)
    max_count = max((i.gpu_count for i in infos), default=0)
    out = ["NAME\tIPADDRESS\t"]
    out += [f"GPU{i}(Allocated/Total)\t" for i in range(max_count)]
    if has_pending:
        out.append("PENDING(Allocated)\t")
    out.append(f"GPU Memory({unit})\n")
    used_in_cluster = total_in_cluster = rule = 0
    for info in infos:
        if info.total_memory <= 0:
            continue
        used = 0
        cells = []
        for i in range(max_count):
            dev = info.devs.get(i)
            cells.append(str(dev) if dev is not None else "0/0")
            used += dev.used if dev is not None else 0
        pending = ""
        if (dev := info.devs.get(PENDING)) is not None:
            pending = str(dev.used)
            used += dev.used
        row = f"{info.name}\t{info.address}\t" + "".join(f"{c}\t" for c in cells)
        if has_pending:
            row += f"{pending}\t"
        row += f"{used}/{info.total_memory}\n"
        out.append(row)
        if rule == 0:
            rule = len(row.encode()) + 20
        used_in_cluster += used
        total_in_cluster += info.total_memory
    out.append("-" * rule + "\n")
    out.append("Allocated/Total GPU Memory In Cluster:\n")
    out.append(
        f"{used_in_cluster}/{total_in_cluster} ({_percent(used_in_cluster, total_in_cluster)}%)\t\n"
    )
    return tabwrite("".join(out))


def display_details(infos: Sequence[NodeInfo]) -> str:
    """``kubectl inspect gpushare -d``: each node's pods with their units per card."""
    out: list[str] = []
    used_in_cluster = total_in_cluster = rule = 0
    for info in infos:
        if info.total_memory <= 0:
            continue
        out += ["\n", f"NAME:\t{info.name}\n", f"IPADDRESS:\t{info.address}\n", "\n"]
        header = "NAME\tNAMESPACE\t" + "".join(
            f"GPU{i}(Allocated)\t" for i in range(info.gpu_count)
        )
        if info.has_pending:
            header += "Pending(Allocated)\t"
        out.append(header + "\n")
        columns = info.gpu_count + (1 if info.has_pending else 0)
        rows: list[str] = []
        seen: set[str] = set()
        used = 0
        for dev in info.devs.values():
            used += dev.used
            for pod in dev.pods:
                if pod.uid in seen:
                    continue
                seen.add(pod.uid)
                cells = []
                for k in range(columns):
                    if pod.allocation:
                        cells.append(pod.allocation.get(k, 0))
                    elif k == dev.idx or (dev.idx == PENDING and k == info.gpu_count):
                        cells.append(pod.memory)
                    else:
                        cells.append(0)
                rows.append(f"{pod.name}\t{pod.namespace}\t" + "".join(f"{c}\t" for c in cells))
        block = "".join(r + "\n" for r in rows)
        if rule == 0:
            rule = len(block.encode()) + 10
        out.append(block)
        out.append(f"Allocated :\t{used} ({_percent(used, info.total_memory)}%)\t\n")
        out.append(f"Total :\t{info.total_memory} \t\n")
        out.append("-" * rule + "\n")
        used_in_cluster += used
        total_in_cluster += info.total_memory
    out += ["\n", "\n", "Allocated/Total GPU Memory In Cluster:\t"]
    out.append(
        f"{used_in_cluster}/{total_in_cluster} ({_percent(used_in_cluster, total_in_cluster)}%)\t\n"
    )
    return tabwrite("".join(out))
