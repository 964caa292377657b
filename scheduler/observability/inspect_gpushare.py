"""koord-py's per-node, per-card GPU-memory account in gpushare's terms, from API objects.

Role: the numbers behind the extender's ``/gpushare-scheduler/inspect`` and ``kubectl inspect
gpushare --koord`` (laid out by ``gpushare_display``), covering both kinds of pods that hold GPU
memory:

- koordinator pods: the ``gpu-memory`` of each card in their ``device-allocated`` annotation;
- gpushare pods (``aliyun.com/gpu-mem``, placed by gpushare or by koord-py's gpushare support):
  ``ALIYUN_COM_GPU_MEM_POD`` units on card ``ALIYUN_COM_GPU_MEM_IDX``.
A pod carrying both (koord-py writes both for gpushare pods) counts once, by its
``device-allocated`` annotation.

Cards come from the node's Device CR (each card's own ``gpu-memory``); a gpushare node without a
Device CR falls back to gpushare's own picture, ``aliyun.com/gpu-mem`` / ``aliyun.com/gpu-count``
of the Node. Amounts are whole units (GiB, or MiB), a card's total rounded down, a pod's use
rounded up, so the table never shows more free memory than there is.

Invariants: pure (objects in, text out); terminal pods and pods of other nodes hold nothing;
a ``device-allocated`` annotation is counted by the scheduler's own rule
(``apis.allocation.held_amounts``): an invalid one never makes a card look less used — the
cards it names (every card of its node when it does not decode) count whole — and is reported
in the output's last lines; malformed gpushare annotations count as nothing and are reported
too; never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, held_amounts, read_allocations
from apis.core import Node, Pod
from apis.device import Device
from apis.quantity import int_value
from apis.resources import DEVICE_GPU, GPU_MEMORY

__all__ = ["GPUShareCard", "GPUShareNode", "gpushare_view"]

ALIYUN_GPU_MEM: Final = "aliyun.com/gpu-mem"
ALIYUN_GPU_COUNT: Final = "aliyun.com/gpu-count"
ANNOTATION_IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
ANNOTATION_POD: Final = "ALIYUN_COM_GPU_MEM_POD"
UNITS: Final[Mapping[str, int]] = {"GiB": 1 << 30, "MiB": 1 << 20}


@dataclass(slots=True)
class GPUShareCard:
    index: int
    total: int
    pods: dict[str, int] = field(default_factory=dict)
    """``namespace/name`` -> units on this card."""

    @property
    def used(self) -> int:
        return sum(self.pods.values())


@dataclass(slots=True)
class GPUShareNode:
    name: str
    address: str
    cards: list[GPUShareCard]

    @property
    def total(self) -> int:
        return sum(c.total for c in self.cards)

    @property
    def used(self) -> int:
        return sum(c.used for c in self.cards)


def _address(node: Node) -> str:
    for addr in (node.raw.get("status") or {}).get("addresses") or []:
        if isinstance(addr, Mapping) and addr.get("type") == "InternalIP":
            return str(addr.get("address") or "")
    return ""


def _cards(node: Node, device: Device | None, unit: int) -> list[GPUShareCard]:
    if device is not None:
        gpus = [d for d in device.devices_of_type(DEVICE_GPU) if d.minor is not None]
        if gpus:
            return [
                GPUShareCard(
                    int(d.minor),  # type: ignore[arg-type]
                    int_value(d.resources[GPU_MEMORY]) // unit if GPU_MEMORY in d.resources else 0,
                )
                for d in sorted(gpus, key=lambda d: d.minor or 0)
            ]
    capacity = (node.raw.get("status") or {}).get("capacity") or {}
    try:
        units = int(str(capacity.get(ALIYUN_GPU_MEM, node.allocatable.get(ALIYUN_GPU_MEM, 0))))
        count = int(str(capacity.get(ALIYUN_GPU_COUNT, 0)))
    except ValueError:
        return []
    if count <= 0:
        return []
    return [GPUShareCard(i, units // count) for i in range(count)]


def _holdings(
    pod: Pod, unit: int, cards: Sequence[GPUShareCard], problems: list[str]
) -> dict[int, int]:
    """Card index -> units the pod holds; raises ValueError on malformed gpushare annotations
    (an invalid ``device-allocated`` one is appended to ``problems`` and held whole)."""
    raw = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw:
        reading = read_allocations(raw)
        node_cards = [] if reading.valid else [
            (DEVICE_GPU, c.index, {GPU_MEMORY: c.total * unit}) for c in cards
        ]
        if not reading.valid:
            problems.append(f"pod {pod.key}: invalid {ANNOTATION_DEVICE_ALLOCATED} annotation: "
                            f"{'; '.join(reading.problems)} (its cards count as fully used)")
        held = {
            minor: math.ceil(amounts[GPU_MEMORY] / unit)
            for device_type, minor, amounts in held_amounts(reading, node_cards)
            if device_type == DEVICE_GPU and GPU_MEMORY in amounts
        }
        if held or not reading.valid:
            return held
    if ANNOTATION_IDX in pod.annotations:
        try:
            return {int(pod.annotations[ANNOTATION_IDX]): int(pod.annotations[ANNOTATION_POD])}
        except (KeyError, ValueError):
            raise ValueError(f"{ANNOTATION_IDX}/{ANNOTATION_POD} are not integers") from None
    return {}


def gpushare_view(
    nodes: Iterable[Node],
    devices: Iterable[Device],
    pods: Iterable[Pod],
    unit: str = "GiB",
) -> tuple[list[GPUShareNode], list[str]]:
    """The nodes with GPU memory (sorted by name) and one line per pod that could not be read."""
    size = UNITS[unit]
    by_name = {d.name: d for d in devices}
    view = {
        n.name: GPUShareNode(n.name, _address(n), cards)
        for n in nodes
        if (cards := _cards(n, by_name.get(n.name), size))
    }
    problems: list[str] = []
    for pod in pods:
        node = view.get(pod.node_name)
        if node is None or pod.terminal:
            continue
        try:
            held = _holdings(pod, size, node.cards, problems)
        except ValueError as exc:
            problems.append(f"pod {pod.key}: {exc}")
            continue
        for index, units in held.items():
            card = next((c for c in node.cards if c.index == index), None)
            if card is None:
                problems.append(f"pod {pod.key}: card {index} is not on node {node.name}")
                continue
            card.pods[pod.key] = card.pods.get(pod.key, 0) + units
    return [view[name] for name in sorted(view)], problems
