"""Per-card allocation, as a user could read it off the API server: the operator's view.

Role: the one place that turns Device CRs and pods' ``device-allocated`` annotations into a
per-card account (capacity, allocated amounts, pods) and renders the per-node, per-GPU table.
Three users share it: the simulator's report, ``koord-scheduler inspect`` (live cluster or
files) and the device metrics collector. ``card_usage`` is ``device_cards`` (the uncharged
cards of one Device CR) then ``account_cards`` (charge pods and checkpoints); the metrics
collector calls the two itself so that it can keep the uncharged cards of an unchanged Device
between scrapes.

Invariants:

- Pure: imports only ``apis`` and PyYAML (``load_objects``); no scheduler state is read, so
  the table shows what the node agent would enforce, not the scheduler's internal ledger.
- ``CardUsage.capacity`` is read-only (the metrics collector gives one dict to all the cards
  that declare the same capacity).
- Only bound, non-terminal pods count. An unhealthy card keeps its capacity and its users
  and is marked ``UNHEALTHY``.
- A pod's annotation is counted by the scheduler's own rule (``apis.allocation.held_amounts``,
  as its device ledger counts it): an invalid annotation never makes a card look less used.
  A card an invalid entry names (a negative amount, one beyond a device, none, a card named
  twice) is charged its whole capacity and lists the pod as ``<ns/name> (invalid annotation:
  held whole)``; an annotation that does not decode holds every card of its node that way.
  Such a pod is appended to ``errors`` when one is given; one that holds no card of its node
  is listed as ``<ns/name><invalid annotation>`` on the node's first GPU (else first card).
  Nothing raises.
- For a GPU, memory missing from an allocation is filled from its ratio
  (``ratio * total // 100``) and a missing ratio from its memory (``memory * 100 // total``),
  as the node agent reads the annotation (SPEC §3).
- GPUs listed in a Device's ``node.koordinator.sh/devices-checkpoints`` annotation (matched by
  card id) are held whole by the kubelet-allocated pod of the entry, as the scheduler's device
  ledger counts them (SPEC §8): the card's whole capacity is allocated and the pod is listed
  as ``<ns/name> (kubelet)`` (``pod uid <uid> (kubelet)`` when the pod is not among ``pods``).
  A malformed annotation never raises: the node is appended to ``checkpoint_errors``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocationReading,
    held_amounts,
    read_allocations,
)
from apis.checkpoint import CheckpointError, decode_devices_checkpoints
from apis.core import Node, Pod, decode_node, decode_pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, LABEL_GPU_MODEL, Device
from apis.quantity import Quantity, format_quantity
from apis.resources import (
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    memory_from_ratio,
    ratio_from_memory,
)
from apis.yamlload import load_all

__all__ = [
    "HELD_WHOLE",
    "INVALID",
    "KUBELET",
    "CardKey",
    "CardUsage",
    "InspectError",
    "ObjectsView",
    "account_cards",
    "card_usage",
    "cards_table",
    "device_cards",
    "gpu_summary",
    "load_objects",
    "render_inspect",
]

INVALID = "<invalid annotation>"
"""Suffix of a pod with an invalid annotation listed on a card it does not hold."""
HELD_WHOLE = " (invalid annotation: held whole)"
"""Suffix of a pod whose invalid annotation holds the card whole."""
KUBELET = " (kubelet)"
"""Suffix of a pod that holds a card through the kubelet's device checkpoint."""


class ObjectsView(Protocol):
    """What the informers hold at one moment (``scheduler.kube.cluster.ClusterView``): what
    ``card_usage`` reads, for the device metrics and the extender's ``inspect``."""

    @property
    def nodes(self) -> Mapping[str, Node]: ...

    @property
    def devices(self) -> Sequence[Device]: ...

    @property
    def pods(self) -> Sequence[Pod]: ...


class InspectError(ValueError):
    """Bad input for ``inspect`` (one line)."""


@dataclass(slots=True)
class CardUsage:
    """One device of one node and what the bound pods' annotations allocate on it."""

    node: str
    device_type: str
    minor: int
    uuid: str
    model: str
    healthy: bool
    capacity: dict[str, int]
    allocated: dict[str, int] = field(default_factory=dict)
    pods: list[str] = field(default_factory=list)

    @property
    def core_total(self) -> int:
        return self.capacity.get(GPU_CORE, 0)

    @property
    def memory_total(self) -> int:
        return self.capacity.get(GPU_MEMORY, 0)

    @property
    def core_used(self) -> int:
        return self.allocated.get(GPU_CORE, 0)

    @property
    def memory_used(self) -> int:
        return self.allocated.get(GPU_MEMORY, 0)


def _int(q: Quantity | int | None) -> int:
    if q is None:
        return 0
    if isinstance(q, int):
        return q
    return -((-q.value.numerator) // q.value.denominator)


Reader = Callable[[str], AllocationReading]
CardKey = tuple[str, str, int]
"""(node, device type, minor): one card of the cluster."""


def device_cards(device: Device, model: str = "") -> list[CardUsage]:
    """The cards of one Device CR in spec order, nothing charged: every device with a minor
    and a type (``model`` is given to the GPUs)."""
    return [
        CardUsage(
            node=device.name,
            device_type=d.type,
            minor=d.minor,
            uuid=d.id,
            model=model if d.type == "gpu" else "",
            healthy=d.health,
            capacity={name: _int(q) for name, q in d.resources.items()},
        )
        for d in device.devices
        if d.minor is not None and d.type
    ]


def account_cards(
    uncharged: Iterable[tuple[Device, Iterable[CardUsage]]],
    pods: Iterable[Pod],
    *,
    read: Reader = read_allocations,
    errors: list[Pod] | None = None,
    checkpoint_errors: list[str] | None = None,
) -> dict[CardKey, CardUsage]:
    """Charge the uncharged cards of each Device (given in name order) with the bound pods'
    annotations and the kubelet checkpoints; the cards by key, unsorted. A later card with
    the key of an earlier one replaces it."""
    cards: dict[CardKey, CardUsage] = {}
    first_card: dict[str, CardUsage] = {}
    devices: list[Device] = []
    for device, own in uncharged:
        devices.append(device)
        for card in own:
            cards[(card.node, card.device_type, card.minor)] = card
            prev = first_card.get(card.node)
            if prev is None or (prev.device_type != "gpu" and card.device_type == "gpu"):
                first_card[card.node] = card
    by_node: dict[str, list[CardUsage]] | None = None  # built at the first invalid annotation
    pods = list(pods)
    for pod in pods:
        if not pod.node_name or pod.terminal:
            continue
        text = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if text is None:
            continue
        reading = read(text)
        node_cards: list[tuple[str, int, dict[str, int]]] = []
        if not reading.valid:
            if errors is not None:
                errors.append(pod)
            if by_node is None:
                by_node = {}
                for card in cards.values():
                    by_node.setdefault(card.node, []).append(card)
            node_cards = [
                (c.device_type, c.minor, c.capacity) for c in by_node.get(pod.node_name, ())
            ]
        whole = set(reading.whole)
        held = False
        for device_type, minor, amounts in held_amounts(reading, node_cards):
            used = cards.get((pod.node_name, device_type, minor))
            if used is None:
                continue
            _charge(used, amounts)
            held = True
            if reading.unreadable or (device_type, minor) in whole:
                used.pods.append(f"{pod.key}{HELD_WHOLE}")
            else:
                used.pods.append(pod.key)
        if not reading.valid and not held:
            where = first_card.get(pod.node_name)
            if where is not None:
                where.pods.append(f"{pod.key}{INVALID}")
    _charge_checkpoints(cards, devices, pods, checkpoint_errors)
    return cards


def card_usage(
    nodes: Mapping[str, Node],
    devices: Iterable[Device],
    pods: Iterable[Pod],
    *,
    read: Reader = read_allocations,
    errors: list[Pod] | None = None,
    checkpoint_errors: list[str] | None = None,
) -> list[CardUsage]:
    """Every device with a minor of every Device CR, sorted by (node, type, minor)."""

    def model(device: Device) -> str:
        node = nodes.get(device.name)
        return node.labels.get(LABEL_GPU_MODEL, "") if node is not None else ""

    cards = account_cards(
        [(d, device_cards(d, model(d))) for d in sorted(devices, key=lambda d: d.name)],
        pods,
        read=read,
        errors=errors,
        checkpoint_errors=checkpoint_errors,
    )
    return [cards[k] for k in sorted(cards)]


def _charge_checkpoints(
    cards: Mapping[CardKey, CardUsage],
    devices: Iterable[Device],
    pods: Iterable[Pod],
    errors: list[str] | None,
) -> None:
    """The GPUs kubelet-allocated pods hold (``devices-checkpoints``): whole, with the pod."""
    by_uid = {p.uid: p for p in pods if p.uid}
    gpus: dict[str, list[CardUsage]] | None = None  # by node, built at the first annotation
    for device in devices:
        raw = device.annotations.get(ANNOTATION_DEVICES_CHECKPOINTS)
        if raw is None:
            continue
        try:
            entries = decode_devices_checkpoints(raw)
        except CheckpointError as err:
            if errors is not None:
                errors.append(f"{device.name}: {err.message}")
            continue
        holders: dict[str, list[str]] = {}
        for entry in entries:
            pod = by_uid.get(entry.pod_uid)
            who = (pod.key if pod is not None else f"pod uid {entry.pod_uid}") + KUBELET
            for device_id in entry.device_ids:
                names = holders.setdefault(device_id, [])
                if who not in names:
                    names.append(who)
        if gpus is None:
            gpus = {}
            for card in cards.values():
                if card.device_type == "gpu":
                    gpus.setdefault(card.node, []).append(card)
        for card in gpus.get(device.name, ()):
            if card.uuid not in holders:
                continue
            for name, value in card.capacity.items():
                card.allocated[name] = card.allocated.get(name, 0) + value
            card.pods.extend(holders[card.uuid])


def _charge(card: CardUsage, resources: Mapping[str, int]) -> None:
    amounts = dict(resources)
    if card.device_type == "gpu":
        total = card.memory_total
        if not amounts.get(GPU_MEMORY) and total:
            amounts[GPU_MEMORY] = memory_from_ratio(amounts.get(GPU_MEMORY_RATIO, 0), total)
        if GPU_MEMORY_RATIO not in amounts and total:
            amounts[GPU_MEMORY_RATIO] = ratio_from_memory(amounts.get(GPU_MEMORY, 0), total)
        amounts.setdefault(GPU_CORE, 0)
    for name, value in amounts.items():
        card.allocated[name] = card.allocated.get(name, 0) + value


# ---------------------------------------------------------------------------------------------
# Rendering


def _mem(n: int) -> str:
    return format_quantity(n, "BinarySI")


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, trailing blanks stripped."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def cards_table(cards: Sequence[CardUsage]) -> str:
    """The per-node, per-GPU table (GPUs only; the node name only on its first row)."""
    rows = [["NODE", "GPU", "MODEL", "HEALTH", "GPU-CORE", "GPU-MEMORY", "PODS"]]
    last = ""
    for c in cards:
        if c.device_type != "gpu":
            continue
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
    return table(rows)


def gpu_summary(cards: Sequence[CardUsage]) -> str | None:
    """``GPU allocation: ...`` over every GPU (totals over healthy ones); None without GPUs."""
    gpus = [c for c in cards if c.device_type == "gpu"]
    healthy = [c for c in gpus if c.healthy]
    core_total = sum(c.core_total for c in healthy)
    mem_total = sum(c.memory_total for c in healthy)
    if not core_total:
        return None
    core_used = sum(c.core_used for c in gpus)
    mem_used = sum(c.memory_used for c in gpus)
    return (
        f"GPU allocation: gpu-core {core_used}/{core_total} "
        f"({100 * core_used / core_total:.1f}%), gpu-memory {_mem(mem_used)}/{_mem(mem_total)}"
        f" ({100 * mem_used / mem_total if mem_total else 0:.1f}%) on {len(healthy)} healthy"
        f" GPUs"
    )


def _selected(
    nodes: Mapping[str, Node], devices: Sequence[Device], node: str | None
) -> Sequence[Device] | None:
    """The Device CRs to show (of ``node`` when given); None when that node has none."""
    if node is None:
        return devices
    if node not in nodes and all(d.name != node for d in devices):
        raise InspectError(f"node {node!r} not found")
    devices = [d for d in devices if d.name == node]
    return devices or None


def render_inspect(
    nodes: Mapping[str, Node],
    devices: Sequence[Device],
    pods: Sequence[Pod],
    node: str | None = None,
) -> str:
    """The ``inspect`` output: the GPU table (of one node, when given) and the summary."""
    shown = _selected(nodes, devices, node)
    if shown is None:
        return f"node {node} has no Device CR: no devices to show\n"
    cards = card_usage(nodes, shown, pods)
    gpus = [c for c in cards if c.device_type == "gpu"]
    if not gpus:
        return "no GPUs found in the Device CRs\n"
    out = ["GPU CARDS (allocated/total)", cards_table(gpus)]
    unhealthy = sum(1 for c in gpus if not c.healthy)
    pods_on_cards = {p for c in gpus for p in c.pods}
    out.append("")
    out.append(
        f"{len({c.node for c in gpus})} nodes, {len(gpus)} GPUs ({unhealthy} unhealthy), "
        f"{len(pods_on_cards)} pods holding GPUs"
    )
    summary = gpu_summary(gpus)
    if summary:
        out.append(summary)
    return "\n".join(out) + "\n"


def inspect_document(
    nodes: Mapping[str, Node],
    devices: Sequence[Device],
    pods: Sequence[Pod],
    node: str | None = None,
) -> dict[str, Any]:
    """``inspect -o json|yaml``: the table's content as data. Per node, per GPU: minor, uuid,
    model, health, gpu-core (percent of a card) and gpu-memory (bytes) allocated/total, the
    pods; the summary's totals count healthy cards only, as the table's."""
    shown = _selected(nodes, devices, node)
    gpus = [c for c in card_usage(nodes, shown or [], pods) if c.device_type == "gpu"]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for c in gpus:
        by_node.setdefault(c.node, []).append(
            {
                "minor": c.minor,
                "uuid": c.uuid,
                "model": c.model,
                "healthy": c.healthy,
                "gpuCore": {"allocated": c.core_used, "total": c.core_total},
                "gpuMemory": {"allocated": c.memory_used, "total": c.memory_total},
                "pods": list(c.pods),
            }
        )
    healthy = [c for c in gpus if c.healthy]
    return {
        "nodes": [{"name": name, "gpus": cards} for name, cards in by_node.items()],
        "summary": {
            "nodes": len(by_node),
            "gpus": len(gpus),
            "unhealthyGPUs": len(gpus) - len(healthy),
            "podsHoldingGPUs": len({p for c in gpus for p in c.pods}),
            "gpuCore": {
                "allocated": sum(c.core_used for c in gpus),
                "total": sum(c.core_total for c in healthy),
            },
            "gpuMemory": {
                "allocated": sum(c.memory_used for c in gpus),
                "total": sum(c.memory_total for c in healthy),
            },
        },
    }


# ---------------------------------------------------------------------------------------------
# Files


def _flatten(doc: Any) -> Iterable[Mapping[str, Any]]:
    if not isinstance(doc, Mapping):
        return
    if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
        for item in doc["items"]:
            yield from _flatten(item)
        return
    yield doc


def load_objects(
    paths: Sequence[str | os.PathLike[str]],
) -> tuple[dict[str, Node], list[Device], list[Pod]]:
    """Nodes, Device CRs and Pods from YAML/JSON files (scenarios, ``simulate -o yaml``
    output, ``kubectl get -o yaml`` lists). A later object with the same kind and name
    replaces an earlier one, so ``--file scenario.yaml --file result.yaml`` shows the result.
    Other kinds are ignored."""
    nodes: dict[str, Node] = {}
    devices: dict[str, Device] = {}
    pods: dict[str, Pod] = {}
    for path in paths:
        name = os.fspath(path)
        try:
            with open(name, encoding="utf-8") as f:
                docs = load_all(f.read())
        except OSError as exc:
            raise InspectError(f"{name}: cannot read: {exc.strerror or exc}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise InspectError(f"{name}: not YAML: {' '.join(str(exc).split())}") from None
        for index, doc in enumerate(docs, 1):
            for obj in _flatten(doc):
                kind = obj.get("kind")
                try:
                    if kind == "Node":
                        node = decode_node(obj)
                        nodes[node.name] = node
                    elif kind == "Device":
                        device = Device.from_dict(obj)
                        devices[device.name] = device
                    elif kind == "Pod":
                        pod = decode_pod(obj)
                        pods[pod.key] = pod
                except ValueError as exc:
                    raise InspectError(f"{name}: document {index}: {kind}: {exc}") from None
    return nodes, list(devices.values()), list(pods.values())
