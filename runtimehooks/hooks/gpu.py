"""The GPU hook: the pod's device allocation -> the container's GPU environment.

Role: at PreCreateContainer, read the scheduler's ``scheduling.koordinator.sh/device-allocated``
pod annotation (SPEC section 5) and tell the NVIDIA container runtime which cards the
container gets, and HAMi-core how much of a shared card it may use.  Koordinator's koordlet
hook (``pkg/koordlet/runtimehooks/hooks/gpu``) is the reference.

Invariants:

- Pure: no I/O, no globals; the same context and options give the same result.
- No ``gpu`` allocation (no annotation, no ``gpu`` key, an empty list): the context is
  returned unchanged.  A malformed annotation raises ``HookInputError`` naming the problem.
- ``NVIDIA_VISIBLE_DEVICES`` lists the allocated GPUs comma-joined in annotation order: their
  minors by default, their ``id`` (NVML UUID) with ``visible_devices_by="uuid"`` (the NVML
  index need not equal the minor on every host); an allocation without an id is then an
  input error.  Any value the pod spec set is replaced.
- HAMi-core (pod label ``koordinator.sh/gpu-isolation-provider: HAMi-core``), as Koordinator
  does it: the first allocation's per-card ``gpu-memory-ratio`` decides; below 100 the card
  is shared and the container also gets ``CUDA_DEVICE_MEMORY_LIMIT`` (the per-card
  ``gpu-memory`` in bytes, a plain integer; one variable for every visible card),
  ``CUDA_DEVICE_SM_LIMIT`` (the per-card ``gpu-core`` percent, when present) and
  ``LD_PRELOAD`` (the HAMi-core library, default ``/usr/local/vgpu/libvgpu.so``).  Without a
  ``gpu-memory-ratio`` (or, when shared, a ``gpu-memory``) in the allocation it is an input
  error, as in Koordinator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocationDecodeError,
    DeviceAllocation,
    decode_allocations,
)
from apis.device import GPU_ISOLATION_PROVIDER_HAMI_CORE, LABEL_GPU_ISOLATION_PROVIDER
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from runtimehooks.context import ContainerContext, HookInputError

__all__ = [
    "DEFAULT_HAMI_CORE_LIBRARY",
    "ENV_CUDA_DEVICE_MEMORY_LIMIT",
    "ENV_CUDA_DEVICE_SM_LIMIT",
    "ENV_LD_PRELOAD",
    "ENV_NVIDIA_VISIBLE_DEVICES",
    "HOOK_NAME",
    "GPUHook",
    "GPUHookOptions",
    "VisibleDevicesBy",
    "gpu_env_delta",
]

HOOK_NAME: Final = "gpu-env-inject"
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_MEMORY_LIMIT: Final = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_CUDA_DEVICE_SM_LIMIT: Final = "CUDA_DEVICE_SM_LIMIT"
ENV_LD_PRELOAD: Final = "LD_PRELOAD"
DEFAULT_HAMI_CORE_LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"

_FULL_CARD_PERCENT: Final = 100


class VisibleDevicesBy(StrEnum):
    """How ``NVIDIA_VISIBLE_DEVICES`` names a card."""

    MINOR = "minor"
    UUID = "uuid"


@dataclass(frozen=True, slots=True)
class GPUHookOptions:
    """Node-level settings of the GPU hook."""

    visible_devices_by: VisibleDevicesBy = VisibleDevicesBy.MINOR
    hami_core_library: str = DEFAULT_HAMI_CORE_LIBRARY

    def __post_init__(self) -> None:
        object.__setattr__(self, "visible_devices_by", VisibleDevicesBy(self.visible_devices_by))
        if not self.hami_core_library:
            raise ValueError("hami_core_library must not be empty")


def _device_name(index: int, alloc: DeviceAllocation, by: VisibleDevicesBy) -> str:
    if by is VisibleDevicesBy.MINOR:
        return str(alloc.minor)
    if not alloc.id:
        raise HookInputError(
            f"{ANNOTATION_DEVICE_ALLOCATED}: gpu[{index}] (minor {alloc.minor}) has no id, "
            "but NVIDIA_VISIBLE_DEVICES is configured to list GPU UUIDs"
        )
    return alloc.id


def _require(alloc: DeviceAllocation, resource: str) -> int:
    if resource not in alloc.resources:
        raise HookInputError(
            f"{ANNOTATION_DEVICE_ALLOCATED}: gpu[0] has no {resource}, "
            "which HAMi-core isolation needs"
        )
    return alloc.resource_value(resource)


def _hami_core_env(first: DeviceAllocation, library: str) -> dict[str, str]:
    if _require(first, GPU_MEMORY_RATIO) >= _FULL_CARD_PERCENT:
        return {}  # whole cards: nothing to isolate
    env = {ENV_CUDA_DEVICE_MEMORY_LIMIT: str(_require(first, GPU_MEMORY))}
    if GPU_CORE in first.resources:
        env[ENV_CUDA_DEVICE_SM_LIMIT] = str(first.resource_value(GPU_CORE))
    env[ENV_LD_PRELOAD] = library
    return env


def gpu_env_delta(
    pod_annotations: Mapping[str, str],
    pod_labels: Mapping[str, str],
    options: GPUHookOptions | None = None,
) -> dict[str, str]:
    """The environment variables to set for the pod's GPU allocation ({} when it has none)."""
    opts = options if options is not None else GPUHookOptions()
    raw = pod_annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw is None:
        return {}
    try:
        allocations = decode_allocations(raw)
    except AllocationDecodeError as err:
        raise HookInputError(str(err)) from None
    gpus = allocations.get(DEVICE_GPU)
    if not gpus:
        return {}
    names = [_device_name(i, a, opts.visible_devices_by) for i, a in enumerate(gpus)]
    env = {ENV_NVIDIA_VISIBLE_DEVICES: ",".join(names)}
    if pod_labels.get(LABEL_GPU_ISOLATION_PROVIDER) == GPU_ISOLATION_PROVIDER_HAMI_CORE:
        env.update(_hami_core_env(gpus[0], opts.hami_core_library))
    return env


class GPUHook:
    """The PreCreateContainer hook: ``ctx`` with the GPU environment set."""

    def __init__(self, options: GPUHookOptions | None = None) -> None:
        self.options = options if options is not None else GPUHookOptions()

    def __call__(self, ctx: ContainerContext) -> ContainerContext:
        return ctx.with_envs(gpu_env_delta(ctx.pod_annotations, ctx.pod_labels, self.options))
