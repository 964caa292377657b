"""Reports of a simulation: the placement table, the per-card table, the summary, YAML/JSON.

The per-card view is computed from what a user could read off the API server: the Device CRs
and the pods' ``device-allocated`` annotations. So it shows what the node agent would enforce,
not the scheduler's internal ledger.

Invariant: rendering never fails on a pod's bad annotation; such a card use is shown as
``<invalid annotation>`` next to the pod instead.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationDecodeError, decode_allocations
from apis.core import Pod
from apis.quantity import Quantity, format_quantity
from apis.resources import GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from scheduler.simulator.run import SimulationResult

GPU_MODEL_LABEL = "node.koordinator.sh/gpu-model"


@dataclass(slots=True)
class CardUsage:
    node: str
    minor: int
    model: str
    healthy: bool
    core_total: int
    memory_total: int
    core_used: int = 0
    memory_used: int = 0
    pods: list[str] = field(default_factory=list)


def _int(q: Quantity | int | None) -> int:
    if q is None:
        return 0
    if isinstance(q, int):
        return q
    return -((-q.value.numerator) // q.value.denominator)


def card_usage(result: SimulationResult) -> list[CardUsage]:
    """Every GPU of every Device CR, with what the bound pods' annotations allocate on it."""
    cluster = result.cluster
    cards: dict[tuple[str, int], CardUsage] = {}
    for name in sorted(cluster.devices):
        device = cluster.devices[name]
        node = cluster.nodes.get(name)
        model = node.labels.get(GPU_MODEL_LABEL, "") if node is not None else ""
        for d in device.devices:
            if d.type != "gpu" or d.minor is None:
                continue
            cards[(name, d.minor)] = CardUsage(
                node=name,
                minor=d.minor,
                model=model,
                healthy=d.health,
                core_total=_int(d.resources.get(GPU_CORE)),
                memory_total=_int(d.resources.get(GPU_MEMORY)),
            )
    for pod in cluster.pods.values():
        if not pod.node_name or pod.terminal:
            continue
        text = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if not text:
            continue
        try:
            allocations = decode_allocations(text)
        except AllocationDecodeError:
            for card in cards.values():
                if card.node == pod.node_name:
                    card.pods.append(f"{pod.key}<invalid annotation>")
                    break
            continue
        for alloc in allocations.get("gpu", []):
            used = cards.get((pod.node_name, alloc.minor))
            if used is None:
                continue
            card = used
            core = _int(alloc.resources.get(GPU_CORE))
            memory = _int(alloc.resources.get(GPU_MEMORY))
            if not memory and card.memory_total:
                ratio = _int(alloc.resources.get(GPU_MEMORY_RATIO))
                memory = ratio * card.memory_total // 100
            card.core_used += core
            card.memory_used += memory
            card.pods.append(pod.key)
    return [cards[k] for k in sorted(cards)]


def _mem(n: int) -> str:
    return format_quantity(n, "BinarySI")


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _devices_of(pod: Pod) -> str:
    text = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if not text:
        return "-"
    try:
        allocations = decode_allocations(text)
    except AllocationDecodeError:
        return "<invalid annotation>"
    parts = []
    for dtype in sorted(allocations):
        minors = ",".join(str(a.minor) for a in allocations[dtype])
        parts.append(f"{dtype} {minors}")
    return "; ".join(parts) or "-"


def render_table(result: SimulationResult) -> str:
    cluster = result.cluster
    out: list[str] = []
    rows = [["POD", "NODE", "DEVICES", "RESULT"]]
    for key in result.pending:
        pod = cluster.pods[key]
        if pod.node_name:
            rows.append([key, pod.node_name, _devices_of(pod), "Scheduled"])
        else:
            rows.append([key, "<none>", "-", "Unschedulable"])
    out.append(f"PLACEMENTS ({len(result.pending)} pods to schedule, in file order)")
    out.append(_table(rows))
    if result.failures:
        out.append("")
        out.append("UNSCHEDULABLE")
        for key in result.pending:
            if key in result.failures:
                out.append(f"{key}: {result.failures[key]}")

    cards = card_usage(result)
    if cards:
        out.append("")
        out.append("GPU CARDS (allocated/total)")
        rows = [["NODE", "GPU", "MODEL", "HEALTH", "GPU-CORE", "GPU-MEMORY", "PODS"]]
        last = ""
        for c in cards:
            rows.append(
                [
                    c.node if c.node != last else "",
                    str(c.minor),
                    c.model or "-",
                    "ok" if c.healthy else "UNHEALTHY",
                    f"{c.core_used}/{c.core_total}",
                    f"{_mem(c.memory_used)}/{_mem(c.memory_total)}",
                    ", ".join(c.pods) or "-",
                ]
            )
            last = c.node
        out.append(_table(rows))

    scheduled = sum(1 for k in result.pending if cluster.pods[k].node_name)
    running = sum(1 for p in cluster.pods.values() if p.node_name) - scheduled
    out.append("")
    out.append("SUMMARY")
    out.append(
        f"pods: {scheduled} scheduled, {len(result.pending) - scheduled} unschedulable "
        f"(of {len(result.pending)} pending); {running} already running"
    )
    healthy = [c for c in cards if c.healthy]
    core_total = sum(c.core_total for c in healthy)
    mem_total = sum(c.memory_total for c in healthy)
    if core_total:
        core_used = sum(c.core_used for c in cards)
        mem_used = sum(c.memory_used for c in cards)
        out.append(
            f"GPU allocation: gpu-core {core_used}/{core_total} "
            f"({100 * core_used / core_total:.1f}%), gpu-memory {_mem(mem_used)}/{_mem(mem_total)}"
            f" ({100 * mem_used / mem_total if mem_total else 0:.1f}%) on {len(healthy)} healthy"
            f" GPUs"
        )
    return "\n".join(out) + "\n"


def pod_objects(result: SimulationResult) -> list[dict[str, Any]]:
    """Every pod as it would be on the API server after the run, in the cluster's order."""
    items = []
    for pod in result.cluster.pods.values():
        raw = copy.deepcopy(dict(pod.raw))
        raw.get("metadata", {}).pop("resourceVersion", None)
        items.append(raw)
    return items


def render(result: SimulationResult, output: str) -> str:
    if output == "table":
        return render_table(result)
    doc: Mapping[str, Any] = {"apiVersion": "v1", "kind": "List", "items": pod_objects(result)}
    if output == "json":
        return json.dumps(doc, indent=2) + "\n"
    return str(yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False, width=120))
