"""gpushare's wire names (SPEC §10): its resource, pod annotations and memory unit.

Role: the facts shared by every component that speaks gpushare — the scheduler (requests,
accounting of pods gpushare placed, the annotations written at bind), the node agent's device
plugin and ``kubectl inspect gpushare``. Pure: constants and small codecs, no I/O.

Invariants: a pod's gpushare placement is read only from ``ALIYUN_COM_GPU_MEM_IDX`` and
``ALIYUN_COM_GPU_MEM_POD`` together (both integers ≥ 0, else ``GPUShareDecodeError``); the bind
annotations are all strings, as gpushare writes them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ANNOTATION_ASSIGNED",
    "ANNOTATION_ASSIGN_TIME",
    "ANNOTATION_ASSUME_TIME",
    "ANNOTATION_DEV",
    "ANNOTATION_IDX",
    "ANNOTATION_POD",
    "RESOURCE_GPU_COUNT",
    "RESOURCE_GPU_MEM",
    "GPUShareDecodeError",
    "GPUSharePlacement",
    "MemoryUnit",
    "bind_annotations",
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
