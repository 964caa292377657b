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
- Per container (``GPUHook`` with a ``PodSource``, as ``koordlet run`` wires it): only the
  containers that request GPU resources get the cards; every other container of a pod with a
  ``gpu`` allocation (init containers and sidecars without GPU requests, ephemeral
  containers) gets ``NVIDIA_VISIBLE_DEVICES=void``.  Under HAMi-core the per-card memory and
  compute limits are the container's share (``runtimehooks.hooks.split``), floored, at least 1.
- Fails closed, with or without a ``PodSource``: for a pod with a ``device-allocated``
  annotation the hook never raises.  An
  annotation it cannot read, a pod it cannot find in time, or any other failure answers the
  container with ``NVIDIA_VISIBLE_DEVICES=void``, logs one warning line naming the pod and the
  reason, and reports a ``Denial``.  (The proxy's failure policy is Ignore: an error reply
  would start the container unchanged, i.e. with the image's ``NVIDIA_VISIBLE_DEVICES=all``.)
- Node-side admission (``PodAdmission``, when wired): before a container is handed any card,
  the pod is admitted by the node; a refused pod's containers get ``void`` (denial reason
  ``device-overcommit`` or ``admission-not-ready``), like every other failure.  Containers that
  get no card (``void`` anyway) do not ask.
- A pod without ``device-allocated`` is echoed unchanged; when its container is created with
  device-plugin GPU ids in ``NVIDIA_VISIBLE_DEVICES`` they are reported to the
  ``KubeletDeviceSink`` (the kubelet handed those cards out; SPEC section 8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Final

import structlog

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocationDecodeError,
    DeviceAllocation,
    decode_allocations,
)
from apis.device import GPU_ISOLATION_PROVIDER_HAMI_CORE, LABEL_GPU_ISOLATION_PROVIDER
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from runtimehooks.context import ContainerContext, HookInputError
from runtimehooks.hooks.split import ALIYUN_GPU_MEM, container_share
from runtimehooks.ports import (
    REASON_INTERNAL_ERROR,
    REASON_INVALID_ALLOCATION,
    AdmissionRefused,
    Denial,
    DenialSink,
    KubeletDeviceSink,
    PodAdmission,
    PodLookupError,
    PodSource,
)

__all__ = [
    "DEFAULT_HAMI_CORE_LIBRARY",
    "ENV_CUDA_DEVICE_MEMORY_LIMIT",
    "ENV_CUDA_DEVICE_SM_LIMIT",
    "ENV_LD_PRELOAD",
    "ENV_NVIDIA_VISIBLE_DEVICES",
    "HOOK_NAME",
    "NO_GPU",
    "GPUHook",
    "GPUHookOptions",
    "VisibleDevicesBy",
    "container_env_delta",
    "device_plugin_ids",
    "gpu_env_delta",
]

log = structlog.get_logger("koordlet.runtimehooks.gpu")

HOOK_NAME: Final = "gpu-env-inject"
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_MEMORY_LIMIT: Final = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_CUDA_DEVICE_SM_LIMIT: Final = "CUDA_DEVICE_SM_LIMIT"
ENV_LD_PRELOAD: Final = "LD_PRELOAD"
DEFAULT_HAMI_CORE_LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
NO_GPU: Final = "void"
"""``NVIDIA_VISIBLE_DEVICES`` of a container that gets no GPU (no devices, no driver files)."""
_NOT_DEVICE_IDS: Final = frozenset({"", "all", "none", "void"})

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


def _allocated_gpus(raw: str) -> list[DeviceAllocation]:
    try:
        return decode_allocations(raw).get(DEVICE_GPU) or []
    except AllocationDecodeError as err:
        raise HookInputError(str(err)) from None


def _scaled(value: int, share: Fraction) -> str:
    return str(max(1, int(value * share)))


def container_env_delta(
    ctx: ContainerContext, pods: PodSource, options: GPUHookOptions | None = None
) -> dict[str, str]:
    """The environment of one container of a pod with a ``device-allocated`` annotation.

    Raises ``HookInputError`` (unreadable annotation) and ``PodLookupError``.
    """
    opts = options if options is not None else GPUHookOptions()
    raw = ctx.pod_annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    gpus = _allocated_gpus(raw) if raw is not None else []
    if not gpus:
        return {}
    names = [_device_name(i, a, opts.visible_devices_by) for i, a in enumerate(gpus)]
    pod = pods.pod_spec(ctx.pod_meta)
    container = pod.container(ctx.container_meta.name)
    if container is None or not container.requests_gpu:
        return {ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU}
    env = {ENV_NVIDIA_VISIBLE_DEVICES: ",".join(names)}
    env.update(gpushare_env(ctx.pod_annotations, container.gpu_requests.get(ALIYUN_GPU_MEM, 0)))
    if ctx.pod_labels.get(LABEL_GPU_ISOLATION_PROVIDER) != GPU_ISOLATION_PROVIDER_HAMI_CORE:
        return env
    hami = _hami_core_env(gpus[0], opts.hami_core_library)
    if not hami:
        return env  # whole cards
    first = gpus[0]
    ratio = first.resource_value(GPU_MEMORY_RATIO)
    memory = first.resource_value(GPU_MEMORY)
    card_bytes = Fraction(memory * 100, ratio) if ratio > 0 else None
    share = container_share(pod, container, card_bytes)
    if share.memory == 0 or share.core == 0:
        return {ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU}  # sidecars started before it hold it all
    hami[ENV_CUDA_DEVICE_MEMORY_LIMIT] = _scaled(memory, share.memory)
    if ENV_CUDA_DEVICE_SM_LIMIT in hami:
        hami[ENV_CUDA_DEVICE_SM_LIMIT] = _scaled(first.resource_value(GPU_CORE), share.core)
    env.update(hami)
    return env


GPUSHARE_ANNOTATIONS: Final = (
    "ALIYUN_COM_GPU_MEM_IDX",
    "ALIYUN_COM_GPU_MEM_POD",
    "ALIYUN_COM_GPU_MEM_DEV",
)
ENV_GPUSHARE_CONTAINER: Final = "ALIYUN_COM_GPU_MEM_CONTAINER"


def gpushare_env(pod_annotations: Mapping[str, str], container_units: int) -> dict[str, str]:
    """gpushare's container environment (SPEC §10) for a pod the scheduler placed with
    gpushare's annotations: taken from *this* pod's annotations (the hook knows the pod), so
    two pods of the same size can never swap cards as they can through gpushare's Allocate.
    {} for other pods; a malformed annotation is an input error (the container gets no GPU)."""
    if GPUSHARE_ANNOTATIONS[0] not in pod_annotations:
        return {}
    env: dict[str, str] = {}
    for key in GPUSHARE_ANNOTATIONS:
        value = pod_annotations.get(key, "")
        if not value.isdigit():
            raise HookInputError(f"gpushare annotation {key}={value!r} is not a whole number")
        env[key] = value
    env[ENV_GPUSHARE_CONTAINER] = str(container_units)
    return env


def device_plugin_ids(envs: Mapping[str, str]) -> tuple[str, ...]:
    """The device ids a device plugin put in ``NVIDIA_VISIBLE_DEVICES`` (() for none/all)."""
    value = envs.get(ENV_NVIDIA_VISIBLE_DEVICES, "")
    if value.strip().lower() in _NOT_DEVICE_IDS:
        return ()
    return tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))


def _hands_out_cards(delta: Mapping[str, str]) -> bool:
    return delta.get(ENV_NVIDIA_VISIBLE_DEVICES, NO_GPU) != NO_GPU


class GPUHook:
    """The PreCreateContainer hook: ``ctx`` with the GPU environment set.

    With ``pods`` the environment is per container; without it (an embedding without the
    agent's pod cache, tests, tools) it is the pod-level ``gpu_env_delta``. Failures are
    closed in both wirings (see the module docstring).
    """

    def __init__(
        self,
        options: GPUHookOptions | None = None,
        *,
        pods: PodSource | None = None,
        denials: DenialSink | None = None,
        kubelet_devices: KubeletDeviceSink | None = None,
        admission: PodAdmission | None = None,
    ) -> None:
        self.options = options if options is not None else GPUHookOptions()
        self._pods = pods
        self._admission = admission
        self._denials = denials
        self._kubelet_devices = kubelet_devices

    def __call__(self, ctx: ContainerContext) -> ContainerContext:
        if ANNOTATION_DEVICE_ALLOCATED not in ctx.pod_annotations:
            if self._pods is not None:
                self._report_kubelet_devices(ctx)
            return ctx
        try:
            if self._pods is None:  # pod-level, but closed on failure in this wiring too
                delta = gpu_env_delta(ctx.pod_annotations, ctx.pod_labels, self.options)
            else:
                delta = container_env_delta(ctx, self._pods, self.options)
            if self._admission is not None and _hands_out_cards(delta):
                allocation = ctx.pod_annotations[ANNOTATION_DEVICE_ALLOCATED]
                self._admission.admit(ctx.pod_meta, allocation)
            return ctx.with_envs(delta)
        except AdmissionRefused as err:
            return self._deny(ctx, err.reason, str(err))
        except HookInputError as err:
            return self._deny(ctx, REASON_INVALID_ALLOCATION, str(err))
        except PodLookupError as err:
            return self._deny(ctx, err.reason, str(err))
        except Exception as err:  # a bug must not hand out every GPU either
            log.error("gpu hook failed", error=repr(err), exc_info=True)
            return self._deny(ctx, REASON_INTERNAL_ERROR, repr(err))

    def _deny(self, ctx: ContainerContext, reason: str, message: str) -> ContainerContext:
        pod = ctx.pod_meta
        container = ctx.container_meta.name
        log.warning(
            "gpu allocation not served: container gets no GPU",
            pod=f"{pod.namespace}/{pod.name}",
            uid=pod.uid,
            container=container,
            reason=reason,
            error=message,
        )
        if self._denials is not None:
            try:
                self._denials.denied(Denial(pod, container, reason, message))
            except Exception as err:
                log.error("reporting a gpu denial failed", error=repr(err))
        return ctx.with_envs({ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU})

    def _report_kubelet_devices(self, ctx: ContainerContext) -> None:
        if self._kubelet_devices is None:
            return
        ids = device_plugin_ids(ctx.container_envs)
        if not ids:
            return
        try:
            self._kubelet_devices.container_devices(ctx.pod_meta, ctx.container_meta.name, ids)
        except Exception as err:
            log.error("recording kubelet-allocated gpus failed", error=repr(err))
