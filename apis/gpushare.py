"""gpushare's wire names (SPEC §10): its resource, pod annotations and memory unit.

Role: the facts shared by every component that speaks gpushare — the scheduler (requests,
accounting of pods gpushare placed, the annotations written at bind), the node agent's device
plugin and ``kubectl inspect gpushare``. Pure: constants and small codecs, no I/O.

Invariants: a pod's gpushare placement is read only from ``ALIYUN_COM_GPU_MEM_IDX`` and
``ALIYUN_COM_GPU_MEM_POD`` together (both integers ≥ 0, else ``GPUShareDecodeError``); the bind
annotations are all strings, as gpushare writes them. A node's cards, as gpushare sees them, are
``aliyun.com/gpu-count`` cards of ``aliyun.com/gpu-mem // gpu-count`` units each, from the
node's capacity (``capacity_cards``). The operator's unhealthy-card list is the ConfigMap
``kube-system/unhealthy-gpu-<node>``, key ``gpus``, a comma list of card indexes
(``decode_unhealthy``): entries that are not whole numbers are reported in ``problems`` and
skipped (gpushare's extender turned them into card 0), never raised.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ANNOTATION_ASSIGNED",
    "ANNOTATION_ASSIGN_TIME",
    "ANNOTATION_ASSUME_TIME",
    "ANNOTATION_DEV",
    "ANNOTATION_IDX",
    "ANNOTATION_POD",
    "MAX_CAPACITY_CARDS",
    "RESOURCE_GPU_COUNT",
    "RESOURCE_GPU_MEM",
    "UNHEALTHY_KEY",
    "UNHEALTHY_NAMESPACE",
    "UNHEALTHY_PREFIX",
    "GPUShareDecodeError",
    "GPUSharePlacement",
    "MemoryUnit",
    "UnhealthyGPUs",
    "bind_annotations",
    "capacity_cards",
    "decode_unhealthy",
    "is_unhealthy_configmap",
    "parse_unhealthy",
    "placement_of",
]

RESOURCE_GPU_MEM: Final = "aliyun.com/gpu-mem"
RESOURCE_GPU_COUNT: Final = "aliyun.com/gpu-count"

ANNOTATION_IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
ANNOTATION_POD: Final = "ALIYUN_COM_GPU_MEM_POD"
ANNOTATION_DEV: Final = "ALIYUN_COM_GPU_MEM_DEV"
ANNOTATION_ASSIGNED: Final = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ANNOTATION_ASSUME_TIME: Final = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ANNOTATION_ASSIGN_TIME: Final = "ALIYUN_COM_GPU_MEM_ASSIGN_TIME"

UNHEALTHY_NAMESPACE: Final = "kube-system"
UNHEALTHY_PREFIX: Final = "unhealthy-gpu-"
UNHEALTHY_KEY: Final = "gpus"


class MemoryUnit(enum.Enum):
    """The unit of one ``aliyun.com/gpu-mem``: GiB by default, MiB with ``--memory-unit=MiB``."""

    GiB = 1 << 30
    MiB = 1 << 20

    @property
    def bytes(self) -> int:
        return int(self.value)


class GPUShareDecodeError(ValueError):
    """Malformed gpushare annotations; ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class GPUSharePlacement:
    index: int
    """The card (NVIDIA minor)."""
    units: int
    """The pod's ``aliyun.com/gpu-mem`` on it."""


def placement_of(annotations: Mapping[str, str]) -> GPUSharePlacement | None:
    """The card and units gpushare recorded for a pod, None when it records none."""
    if ANNOTATION_IDX not in annotations:
        return None
    raw_idx, raw_units = annotations.get(ANNOTATION_IDX, ""), annotations.get(ANNOTATION_POD, "")
    try:
        index, units = int(raw_idx), int(raw_units)
    except ValueError:
        raise GPUShareDecodeError(
            f"{ANNOTATION_IDX}={raw_idx!r} {ANNOTATION_POD}={raw_units!r}: not integers"
        ) from None
    if index < 0 or units < 0:
        raise GPUShareDecodeError(f"{ANNOTATION_IDX}={index} {ANNOTATION_POD}={units}: negative")
    return GPUSharePlacement(index, units)


def bind_annotations(index: int, pod_units: int, card_units: int, now_ns: int) -> dict[str, str]:
    """What gpushare's extender writes on a pod it binds (its device plugin reads them)."""
    return {
        ANNOTATION_IDX: str(index),
        ANNOTATION_POD: str(pod_units),
        ANNOTATION_DEV: str(card_units),
        ANNOTATION_ASSIGNED: "false",
        ANNOTATION_ASSUME_TIME: str(now_ns),
    }


MAX_CAPACITY_CARDS: Final = 64
"""More ``aliyun.com/gpu-count`` than any node has: such a capacity describes no card (anyone
allowed to patch a node's status could otherwise make every node's row that wide)."""


def capacity_cards(capacity: Mapping[str, int]) -> tuple[int, int] | None:
    """gpushare's picture of a node: (card count, units per card) from its capacity, the
    units divided evenly (integer division, as gpushare's ``NewNodeInfo``); None when it has
    no card of at least one unit, or more than ``MAX_CAPACITY_CARDS`` cards."""
    units, count = capacity.get(RESOURCE_GPU_MEM, 0), capacity.get(RESOURCE_GPU_COUNT, 0)
    if not 0 < count <= MAX_CAPACITY_CARDS or units // count <= 0:
        return None
    return count, units // count


@dataclass(frozen=True, slots=True)
class UnhealthyGPUs:
    """One ``kube-system/unhealthy-gpu-<node>`` ConfigMap, decoded."""

    node: str
    minors: frozenset[int]
    """The card indexes marked unhealthy (the valid entries of ``gpus``)."""
    problems: tuple[str, ...] = ()
    """One line per entry that is not a card index (skipped)."""
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{UNHEALTHY_NAMESPACE}/{UNHEALTHY_PREFIX}{self.node}"


_PROBLEMS_SHOWN: Final = 5
"""Bad entries named one by one; the rest are counted."""


def parse_unhealthy(text: str) -> tuple[frozenset[int], tuple[str, ...]]:
    """``"0,2"`` -> ({0, 2}, ()); blanks around entries and empty entries are ignored, any
    other entry that is not a whole number is a problem (and skipped)."""
    minors: set[int] = set()
    problems: list[str] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry.isascii() and entry.isdigit():
            minors.add(int(entry))
        else:
            problems.append(f"{UNHEALTHY_KEY}: {entry[:40]!r} is not a card index")
    if len(problems) > _PROBLEMS_SHOWN:  # one log line, whatever the ConfigMap holds
        more = len(problems) - _PROBLEMS_SHOWN
        problems[_PROBLEMS_SHOWN:] = [f"{UNHEALTHY_KEY}: {more} more entries are not card indexes"]
    return frozenset(minors), tuple(problems)


def is_unhealthy_configmap(obj: Mapping[str, Any]) -> bool:
    """Whether a v1 ConfigMap (JSON) is an unhealthy-card list (by namespace and name)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return False
    name = meta.get("name")
    return (
        meta.get("namespace") == UNHEALTHY_NAMESPACE
        and isinstance(name, str)
        and name.startswith(UNHEALTHY_PREFIX)
        and len(name) > len(UNHEALTHY_PREFIX)
    )


def decode_unhealthy(obj: Mapping[str, Any]) -> UnhealthyGPUs:
    """A ``kube-system/unhealthy-gpu-<node>`` ConfigMap (JSON) -> ``UnhealthyGPUs``; raises
    ``GPUShareDecodeError`` for another object. A missing ``gpus`` key marks no card."""
    if not is_unhealthy_configmap(obj):
        raise GPUShareDecodeError(
            f"not a {UNHEALTHY_NAMESPACE}/{UNHEALTHY_PREFIX}<node> ConfigMap"
        )
    meta = obj["metadata"]
    data = obj.get("data")
    raw = data.get(UNHEALTHY_KEY) if isinstance(data, Mapping) else None
    minors, problems = parse_unhealthy(raw) if isinstance(raw, str) else (frozenset(), ())
    return UnhealthyGPUs(
        node=str(meta["name"])[len(UNHEALTHY_PREFIX) :],
        minors=minors,
        problems=problems,
        resource_version=str(meta.get("resourceVersion") or ""),
    )
