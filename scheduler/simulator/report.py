"""Reports of a simulation: the placement table, the per-card table, the summary, YAML/JSON.

The per-card view is ``scheduler.observability.inspect``'s (shared with ``koord-scheduler
inspect`` and the device metrics): computed from what a user could read off the API server, the
Device CRs and the pods' ``device-allocated`` annotations. So it shows what the node agent would
enforce, not the scheduler's internal ledger.

Invariant: rendering never fails on a pod's bad annotation; such a card use is shown as
``<invalid annotation>`` next to the pod instead.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import yaml

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationDecodeError, decode_allocations
from apis.core import Pod
from scheduler.observability.inspect import CardUsage, cards_table, gpu_summary, table
from scheduler.observability.inspect import card_usage as _card_usage
from scheduler.simulator.run import SimulationResult

__all__ = ["CardUsage", "card_usage", "pod_objects", "render", "render_table"]


def card_usage(result: SimulationResult) -> list[CardUsage]:
    """Every device of every Device CR, with what the bound pods' annotations allocate on it."""
    cluster = result.cluster
    return _card_usage(cluster.nodes, cluster.devices.values(), cluster.pods.values())


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
    if result.warnings:
        out.append("WARNINGS (the input as given)")
        out.extend(result.warnings)
        out.append("")
    rows = [["POD", "NODE", "DEVICES", "RESULT"]]
    for key in result.pending:
        pod = cluster.pods.get(key)
        if pod is None:
            rows.append([key, "<none>", "-", "Preempted"])
        elif pod.node_name:
            rows.append([key, pod.node_name, _devices_of(pod), "Scheduled"])
        else:
            rows.append([key, "<none>", "-", "Unschedulable"])
    out.append(f"PLACEMENTS ({len(result.pending)} pods to schedule, in file order)")
    out.append(table(rows))
    if result.failures:
        out.append("")
        out.append("UNSCHEDULABLE")
        for key in result.pending:
            if key in result.failures:
                out.append(f"{key}: {result.failures[key]}")

    if result.foreign:
        out.append("")
        out.append(
            "NOT FOR THIS SCHEDULER (spec.schedulerName names no profile of this configuration)"
        )
        profiles = ", ".join(result.profiles)
        for key, name in result.foreign.items():
            out.append(f"{key}: schedulerName {name!r} (profiles: {profiles})")

    if result.preemptions:
        out.append("")
        out.append("PREEMPTIONS (victims deleted so that a higher-priority pod fits)")
        rows = [["PREEMPTOR", "NODE", "VICTIM", "PRIORITY", "DEVICES FREED"]]
        for p in result.preemptions:
            for victim in p.victims:
                rows.append(
                    [p.pod.key, p.node, victim.key, str(victim.priority), _devices_of(victim)]
                )
        out.append(table(rows))

    cards = [c for c in card_usage(result) if c.device_type == "gpu"]
    if cards:
        out.append("")
        out.append("GPU CARDS (allocated/total)")
        out.append(cards_table(cards))

    scheduled = sum(1 for k in result.pending if k in cluster.pods and cluster.pods[k].node_name)
    running = sum(1 for p in cluster.pods.values() if p.node_name) - scheduled
    not_ours = f"; {len(result.foreign)} not for this scheduler" if result.foreign else ""
    out.append("")
    out.append("SUMMARY")
    out.append(
        f"pods: {scheduled} scheduled, {len(result.pending) - scheduled} unschedulable "
        f"(of {len(result.pending)} pending); {running} already running"
        + (
            f"; {sum(len(p.victims) for p in result.preemptions)} preempted"
            if result.preemptions
            else ""
        )
        + not_ours
    )
    summary = gpu_summary(cards)
    if summary:
        out.append(summary)
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
