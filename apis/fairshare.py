"""Fair-share (Gemini) shares of a pod, read from its labels and annotations.

Role: the one decoder, shared by the node agent (``koordlet.fairshare``) and the runtime hook
(``runtimehooks.hooks.fairshare``), of what a pod asks of Gemini's token scheduler: which card,
its request and limit of GPU time, its GPU memory limit. Pure; stdlib and ``apis`` only.

Names (our extension of Koordinator's, documented in ``docs/fairshare.md``):

- opt-in: label (or annotation) ``koordinator.sh/gpu-isolation-provider: Gemini``; the label
  wins when both are set. ``HAMi-core`` keeps its meaning and is not ours.
- ``koordinator.sh/gpu-core-limit`` (annotation): the most GPU time the pod may use on its
  card, in percent like ``gpu-core`` (an integer, request <= limit <= 100). Absent: the
  node's default, ``DefaultLimit.FULL`` (100, work-conserving) or ``DefaultLimit.REQUEST``
  (limit = request, strict isolation; a pod with no ``gpu-core`` then still gets 100).

Invariants:

- ``None`` for a pod that did not opt in, has no ``gpu`` allocation, or holds whole cards
  (per-card ``gpu-core`` >= 100: nothing to share).
- ``FairShareInputError`` (one clear message) for an opted-in pod that cannot be served: a
  malformed allocation or limit, a negative ``gpu-core`` or ``gpu-memory``, or a shared
  allocation spread over several cards (Gemini schedules one card per client).
- request = per-card ``gpu-core`` / 100; memory limit = the allocated per-card ``gpu-memory``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationDecodeError, decode_allocations
from apis.device import LABEL_GPU_ISOLATION_PROVIDER
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY

__all__ = [
    "ANNOTATION_GPU_CORE_LIMIT",
    "DEFAULT_GEMINI_LIBRARY",
    "GPU_ISOLATION_PROVIDER_GEMINI",
    "DefaultLimit",
    "FairShareInputError",
    "FairShareSpec",
    "fairshare_spec",
    "opted_in",
]

GPU_ISOLATION_PROVIDER_GEMINI: Final = "Gemini"
ANNOTATION_GPU_CORE_LIMIT: Final = "koordinator.sh/gpu-core-limit"
DEFAULT_GEMINI_LIBRARY: Final = "/usr/local/gemini/lib/libgemhook.so.1"
"""Where the node's image puts Gemini's hook library (``--fairshare-hook-library``)."""
_FULL: Final = 100


class DefaultLimit(StrEnum):
    """A pod's limit when it has no ``gpu-core-limit`` annotation."""

    FULL = "full"
    REQUEST = "request"


class FairShareInputError(ValueError):
    """An opted-in pod whose labels/annotations cannot be served (the message says why)."""


@dataclass(frozen=True, slots=True)
class FairShareSpec:
    """What one pod asks of its card's token scheduler."""

    minor: int
    request: float
    limit: float
    memory_bytes: int
    uuid: str = ""


def opted_in(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """Whether the pod asked for Gemini isolation."""
    value = labels.get(LABEL_GPU_ISOLATION_PROVIDER)
    if value is None:
        value = annotations.get(LABEL_GPU_ISOLATION_PROVIDER)
    return value == GPU_ISOLATION_PROVIDER_GEMINI


def _limit_percent(annotations: Mapping[str, str], core: int, default: DefaultLimit) -> int:
    raw = annotations.get(ANNOTATION_GPU_CORE_LIMIT)
    if raw is None:
        return _FULL if default is DefaultLimit.FULL or core == 0 else core
    text = raw.strip()
    if not text.isdigit():
        raise FairShareInputError(
            f"{ANNOTATION_GPU_CORE_LIMIT}: {raw!r} is not a whole percent (0-100)"
        )
    value = int(text)
    if not core <= value <= _FULL or value == 0:
        raise FairShareInputError(
            f"{ANNOTATION_GPU_CORE_LIMIT}: {value} must be between the pod's gpu-core "
            f"({core}) and 100, and above 0"
        )
    return value


def fairshare_spec(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    default_limit: DefaultLimit = DefaultLimit.FULL,
) -> FairShareSpec | None:
    """The pod's fair-share spec, None when it has none (see the module docstring)."""
    if not opted_in(labels, annotations):
        return None
    raw = annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw is None:
        return None
    try:
        gpus = decode_allocations(raw).get(DEVICE_GPU) or []
    except AllocationDecodeError as err:
        raise FairShareInputError(str(err)) from None
    if not gpus:
        return None
    cores = [a.resource_value(GPU_CORE) if GPU_CORE in a.resources else 0 for a in gpus]
    if all(c >= _FULL for c in cores):
        return None
    if len(gpus) != 1:
        raise FairShareInputError(
            f"{ANNOTATION_DEVICE_ALLOCATED}: a Gemini-isolated pod shares one card, "
            f"this one is spread over {len(gpus)}"
        )
    alloc, core = gpus[0], cores[0]
    if core < 0:
        raise FairShareInputError(f"{ANNOTATION_DEVICE_ALLOCATED}: gpu-core {core} is negative")
    memory = alloc.resource_value(GPU_MEMORY)
    if memory < 0:
        raise FairShareInputError(f"{ANNOTATION_DEVICE_ALLOCATED}: gpu-memory {memory} is negative")
    limit = _limit_percent(annotations, core, default_limit)
    return FairShareSpec(
        minor=alloc.minor,
        request=core / _FULL,
        limit=limit / _FULL,
        memory_bytes=memory,
        uuid=alloc.id,
    )
