"""The GPU hook: the pod's device allocation -> the container's GPU environment.

Role: at PreCreateContainer, read the scheduler's ``scheduling.koordinator.sh/device-allocated``
pod annotation (SPEC section 5) and tell the NVIDIA container runtime which cards the
container gets, and HAMi-core how much of a shared card it may use.  Koordinator's koordlet
hook (``pkg/koordlet/runtimehooks/hooks/gpu``) is the reference.

Invariants:

- Pure: no I/O, no globals; the same context and options give the same result.
- ``gpu_env_delta``/``container_env_delta``: no ``gpu`` allocation (no annotation, no ``gpu``
  key, an empty list) is ``{}``; a malformed annotation raises ``HookInputError`` naming it.
- ``NVIDIA_VISIBLE_DEVICES`` lists the allocated GPUs comma-joined in annotation order: their
  minors by default, their ``id`` (NVML UUID) with ``visible_devices_by="uuid"`` (the NVML
  index need not equal the minor on every host); an allocation without an id is then an
  input error.  Any value the pod spec set is replaced.
- With ``GPUDelivery.CDI`` the cards go in the container annotation ``ANNOTATION_CDI_GPU``
  (``nvidia.com/gpu=<UUID>,...``) and ``NVIDIA_VISIBLE_DEVICES`` is ``void``.
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
  annotation with ``gpu`` entries the hook never raises.  An annotation it cannot read, a pod
  it cannot find in time, or any other failure answers the container with
  ``NVIDIA_VISIBLE_DEVICES=void``, logs one warning line naming the pod and the reason, and
  reports a ``Denial``: the container runs, visibly without GPUs.  (An error reply would
  refuse it under koordlet's Fail registration, and start it unchanged, i.e. with the image's
  ``NVIDIA_VISIBLE_DEVICES=all``, under an operator's Ignore.)
- Node-side admission (``PodAdmission``, when wired): before a container is handed any card,
  the pod is admitted by the node; a refused pod's containers get ``void`` (denial reason
  ``device-overcommit`` or ``admission-not-ready``), like every other failure.  Containers that
  get no card (``void`` anyway) do not ask.
- A container sees exactly the GPUs an allocator of the node gave it.  A container that no
  ``gpu`` entry covers (a pod without ``device-allocated``, or one without ``gpu`` entries) is
  checked against the kubelet's device-plugin allocation (``KubeletAllocations``, the
  kubelet's checkpoint): the ids its ``NVIDIA_VISIBLE_DEVICES`` selects (read as the toolkit
  reads it, ``selected_devices``) are kept when the kubelet gave it every one of them (and
  reported to the ``KubeletDeviceSink``); otherwise the variable becomes the kubelet's ids,
  or ``void`` when it gave none.  An absent variable becomes ``void`` (the image's default is
  not in the request, and CUDA images say ``all``); a value that selects nothing stays.
  Without a grant ``CUDA_VISIBLE_DEVICES``, when set, becomes ``-1``.
- Every container: the toolkit's other device-selecting variables (``OTHER_DEVICE_ENV``) are
  voided, and a ``cdi.k8s.io/`` container annotation keeps only the NVIDIA CDI devices the
  kubelet gave it (``REFUSED_CDI_DEVICE`` when none is left).  A pod annotation naming NVIDIA
  CDI devices is a ``HookInputError``: the hook cannot rewrite it, so the container is refused
  (koordlet registers with the Fail policy).
- A container that *asked* for devices it was not given (a selecting value, a CDI name) is
  reported as a ``Denial`` with reason ``gpu-not-allocated``; one that merely runs an image
  whose default may select GPUs is voided silently.
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
from runtimehooks.cdi import ANNOTATION_PREFIX as CDI_ANNOTATION_PREFIX
from runtimehooks.context import ContainerContext, HookInputError
from runtimehooks.hooks.split import ALIYUN_GPU_MEM, container_share
from runtimehooks.ports import (
    REASON_GPU_NOT_ALLOCATED,
    REASON_INTERNAL_ERROR,
    REASON_INVALID_ALLOCATION,
    AdmissionRefused,
    Denial,
    DenialSink,
    KubeletAllocations,
    KubeletDeviceSink,
    PodAdmission,
    PodLookupError,
    PodSource,
)

__all__ = [
    "ALL_GPUS",
    "ANNOTATION_CDI_GPU",
    "CDI_GPU_KIND",
    "CUDA_NO_DEVICE",
    "DEFAULT_HAMI_CORE_LIBRARY",
    "ENV_CUDA_DEVICE_MEMORY_LIMIT",
    "ENV_CUDA_DEVICE_SM_LIMIT",
    "ENV_CUDA_VISIBLE_DEVICES",
    "ENV_LD_PRELOAD",
    "ENV_NVIDIA_VISIBLE_DEVICES",
    "HOOK_NAME",
    "NO_GPU",
    "OTHER_DEVICE_ENV",
    "REFUSED_CDI_DEVICE",
    "GPUDelivery",
    "GPUHook",
    "GPUHookOptions",
    "VisibleDevicesBy",
    "container_env_delta",
    "device_plugin_ids",
    "gpu_env_delta",
    "selected_devices",
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
ALL_GPUS: Final = "all"
OTHER_DEVICE_ENV: Final = (
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
)
"""The NVIDIA container toolkit's other device-selecting variables (``image/envvars.go``):
no allocator of ours hands these out, so they are always voided."""
ENV_CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
CUDA_NO_DEVICE: Final = "-1"
"""CUDA sees the devices listed before the first invalid index: none."""
VOLUME_MOUNTS_MARKER: Final = "/var/run/nvidia-container-devices"
"""``NVIDIA_VISIBLE_DEVICES`` of the device plugin's ``volume-mounts`` strategy: the devices
are the mounts below it, the value itself selects none."""
NVIDIA_CDI_VENDOR: Final = "nvidia.com/"
CDI_GPU_KIND: Final = "nvidia.com/gpu"
ANNOTATION_CDI_GPU: Final = f"{CDI_ANNOTATION_PREFIX}koordinator.sh_gpu"
"""The container annotation of ``GPUDelivery.CDI`` (CDI's ``AnnotationKey`` form)."""
REFUSED_CDI_DEVICE: Final = "nvidia.com/gpu=refused"
"""A CDI name no NVIDIA spec defines: a CDI runtime refuses a container that names it."""
_MAX_SHOWN: Final = 120

_FULL_CARD_PERCENT: Final = 100


class VisibleDevicesBy(StrEnum):
    """How ``NVIDIA_VISIBLE_DEVICES`` names a card."""

    MINOR = "minor"
    UUID = "uuid"


class GPUDelivery(StrEnum):
    """How a container's cards reach the runtime: ``NVIDIA_VISIBLE_DEVICES`` (needs the
    toolkit's ``accept-nvidia-visible-devices-envvar-when-unprivileged``), or a CDI container
    annotation naming the NVIDIA CDI spec's devices by UUID (``nvidia-ctk cdi generate``; the
    variable is then ``void``), which works with that setting off."""

    ENV = "env"
    CDI = "cdi"


@dataclass(frozen=True, slots=True)
class GPUHookOptions:
    """Node-level settings of the GPU hook."""

    visible_devices_by: VisibleDevicesBy = VisibleDevicesBy.MINOR
    hami_core_library: str = DEFAULT_HAMI_CORE_LIBRARY
    delivery: GPUDelivery = GPUDelivery.ENV

    def __post_init__(self) -> None:
        object.__setattr__(self, "visible_devices_by", VisibleDevicesBy(self.visible_devices_by))
        object.__setattr__(self, "delivery", GPUDelivery(self.delivery))
        if not self.hami_core_library:
            raise ValueError("hami_core_library must not be empty")
        by_uuid = self.visible_devices_by is VisibleDevicesBy.UUID
        if self.delivery is GPUDelivery.CDI and not by_uuid:
            raise ValueError("CDI delivery names cards by UUID: visible_devices_by must be uuid")


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


def selected_devices(value: str | None) -> tuple[str, ...] | None:
    """What a device-selecting variable's value selects, read as the NVIDIA container toolkit
    reads it (``image.devicesFromEnvvars``: comma-split, each entry trimmed, empties dropped):
    None for nothing (absent, empty, ``void``, ``none``, the volume-mount marker of the device
    plugin's ``volume-mounts`` strategy), ``("all",)`` for every device (``all`` anywhere in the
    list), else the ids, deduplicated in order (MIG ids, UUIDs, indexes, anything else)."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    entries = [e for e in entries if e]
    if not entries or NO_GPU in entries:
        return None
    if ALL_GPUS in entries:
        return (ALL_GPUS,)
    if "none" in entries or entries == [VOLUME_MOUNTS_MARKER]:
        return None
    return tuple(dict.fromkeys(entries))


def device_plugin_ids(envs: Mapping[str, str]) -> tuple[str, ...]:
    """The device ids a device plugin put in ``NVIDIA_VISIBLE_DEVICES`` (() for none/all)."""
    selected = selected_devices(envs.get(ENV_NVIDIA_VISIBLE_DEVICES))
    return () if selected is None or selected == (ALL_GPUS,) else selected


def _hands_out_cards(delta: Mapping[str, str]) -> bool:
    return delta.get(ENV_NVIDIA_VISIBLE_DEVICES, NO_GPU) != NO_GPU


def _quoted(name: str, value: str) -> str:
    shown = value if len(value) <= _MAX_SHOWN else f"{value[:_MAX_SHOWN]}... ({len(value)} chars)"
    return f"{name}={shown!r}"


def _is_nvidia_cdi_name(name: str) -> bool:
    return name.strip().startswith(NVIDIA_CDI_VENDOR)


def _pod_cdi_requests(pod_annotations: Mapping[str, str]) -> list[str]:
    return [
        key
        for key, value in pod_annotations.items()
        if key.startswith(CDI_ANNOTATION_PREFIX) and any(map(_is_nvidia_cdi_name, value.split(",")))
    ]


def _foreign_requests(
    ctx: ContainerContext, granted: frozenset[str]
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The container's device requests by channels other than ``NVIDIA_VISIBLE_DEVICES``:
    (environment updates, container annotation updates, what was asked).  The other
    device-selecting variables are voided; a ``cdi.k8s.io/`` annotation loses every NVIDIA CDI
    device not in ``granted`` (``REFUSED_CDI_DEVICE`` when nothing is left: the proxy merges
    annotations and cannot delete a key, and a runtime refuses a device no spec defines)."""
    env: dict[str, str] = {}
    asked: list[str] = []
    for name in OTHER_DEVICE_ENV:
        value = ctx.container_envs.get(name)
        if value is None:
            continue
        if selected_devices(value) is not None:
            asked.append(_quoted(name, value))
        if value != NO_GPU:
            env[name] = NO_GPU
    annotations: dict[str, str] = {}
    for key, value in ctx.container_annotations.items():
        if not key.startswith(CDI_ANNOTATION_PREFIX):
            continue
        names = value.split(",")
        kept = [
            n for n in names
            if not _is_nvidia_cdi_name(n) or n.strip().partition("=")[2] in granted
        ]
        if len(kept) != len(names):
            asked.append(_quoted(key, value))
            annotations[key] = ",".join(kept) if kept else REFUSED_CDI_DEVICE
    return env, annotations, asked


class GPUHook:
    """The PreCreateContainer hook: ``ctx`` with the GPU environment set.

    With ``pods`` the environment is per container; without it (an embedding without the
    agent's pod cache, tests, tools) it is the pod-level ``gpu_env_delta``. Failures are
    closed in both wirings (see the module docstring).  ``kubelet_allocations`` is what the
    kubelet's device plugins gave each container; without it no container of a pod without
    ``device-allocated`` sees any GPU.
    """

    def __init__(
        self,
        options: GPUHookOptions | None = None,
        *,
        pods: PodSource | None = None,
        denials: DenialSink | None = None,
        kubelet_devices: KubeletDeviceSink | None = None,
        admission: PodAdmission | None = None,
        kubelet_allocations: KubeletAllocations | None = None,
    ) -> None:
        self.options = options if options is not None else GPUHookOptions()
        self._pods = pods
        self._admission = admission
        self._denials = denials
        self._kubelet_devices = kubelet_devices
        self._kubelet_allocations = kubelet_allocations

    def __call__(self, ctx: ContainerContext) -> ContainerContext:
        if keys := _pod_cdi_requests(ctx.pod_annotations):
            # PreCreateContainer cannot rewrite pod annotations; a runtime that passes them
            # to the container would hand these devices out: refuse the container instead.
            raise HookInputError(
                f"pod annotation {keys[0]} names NVIDIA CDI devices: a pod cannot select "
                "GPUs by annotation (the container is refused)"
            )
        if ANNOTATION_DEVICE_ALLOCATED in ctx.pod_annotations:
            served = self._serve_allocation(ctx)
            if served is not None:
                return self._close_other_requests(ctx, served, frozenset())
        return self._serve_kubelet_allocation(ctx)

    def _serve_allocation(self, ctx: ContainerContext) -> ContainerContext | None:
        """The container with the pod's ``gpu`` allocation served (or denied: void); None when
        the annotation has no ``gpu`` entries (no GPU from us)."""
        try:
            if self._pods is None:  # pod-level, but closed on failure in this wiring too
                delta = gpu_env_delta(ctx.pod_annotations, ctx.pod_labels, self.options)
            else:
                delta = container_env_delta(ctx, self._pods, self.options)
            if not delta:
                return None
            if self._admission is not None and _hands_out_cards(delta):
                allocation = ctx.pod_annotations[ANNOTATION_DEVICE_ALLOCATED]
                self._admission.admit(ctx.pod_meta, allocation)
            if self.options.delivery is GPUDelivery.CDI and _hands_out_cards(delta):
                names = delta[ENV_NVIDIA_VISIBLE_DEVICES].split(",")
                cdi = ",".join(f"{CDI_GPU_KIND}={n}" for n in names)
                delta = {**delta, ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU}
                return ctx.with_envs(delta).with_container_annotations({ANNOTATION_CDI_GPU: cdi})
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

    def _granted(self, ctx: ContainerContext) -> tuple[str, ...]:
        """What the kubelet gave this container; () when unknown (fail closed)."""
        if self._kubelet_allocations is None:
            return ()
        try:
            return tuple(
                self._kubelet_allocations.gpu_devices(ctx.pod_meta, ctx.container_meta.name)
            )
        except Exception as err:
            log.error("reading the kubelet's gpu allocation failed: container gets none",
                      pod=f"{ctx.pod_meta.namespace}/{ctx.pod_meta.name}",
                      container=ctx.container_meta.name, error=repr(err))
            return ()

    def _serve_kubelet_allocation(self, ctx: ContainerContext) -> ContainerContext:
        """A container that no ``gpu`` entry of ours covers: it sees exactly the GPUs the
        kubelet's device plugins gave it (their ids in ``NVIDIA_VISIBLE_DEVICES``), or none."""
        value = ctx.container_envs.get(ENV_NVIDIA_VISIBLE_DEVICES)
        selected = selected_devices(value)
        needs_grant = (
            selected is not None
            or ENV_CUDA_VISIBLE_DEVICES in ctx.container_envs
            or any(k.startswith(CDI_ANNOTATION_PREFIX) for k in ctx.container_annotations)
        )
        granted = self._granted(ctx) if needs_grant else ()
        env: dict[str, str] = {}
        asked: list[str] = []
        if value is None:
            env[ENV_NVIDIA_VISIBLE_DEVICES] = NO_GPU  # the image's default may well be "all"
        elif selected is None:
            pass  # selects nothing: kept as it is
        elif selected != (ALL_GPUS,) and set(selected) <= set(granted):
            self._report_kubelet_devices(ctx, selected)
        else:
            asked.append(_quoted(ENV_NVIDIA_VISIBLE_DEVICES, value))
            env[ENV_NVIDIA_VISIBLE_DEVICES] = ",".join(granted) if granted else NO_GPU
            self._report_kubelet_devices(ctx, granted)
        cuda = ctx.container_envs.get(ENV_CUDA_VISIBLE_DEVICES)
        if not granted and cuda is not None and cuda != CUDA_NO_DEVICE:
            env[ENV_CUDA_VISIBLE_DEVICES] = CUDA_NO_DEVICE
        out = ctx.with_envs(env)
        if asked:
            given = ",".join(granted) if granted else "none"
            self._report(ctx, REASON_GPU_NOT_ALLOCATED,
                         f"asked for GPUs no allocator of the node gave it ({'; '.join(asked)}); "
                         f"the kubelet gave it: {given}")
        return self._close_other_requests(ctx, out, frozenset(granted))

    def _close_other_requests(
        self, ctx: ContainerContext, out: ContainerContext, granted: frozenset[str]
    ) -> ContainerContext:
        env, annotations, asked = _foreign_requests(ctx, granted)
        annotations = {  # a key the serving step wrote (our CDI delivery) is ours, not theirs
            k: v for k, v in annotations.items()
            if out.container_annotations.get(k) == ctx.container_annotations.get(k)
        }
        if asked:
            self._report(ctx, REASON_GPU_NOT_ALLOCATED,
                         f"asked for devices no allocator of the node gave it: {'; '.join(asked)}")
        return out.with_envs(env).with_container_annotations(annotations)

    def _report(self, ctx: ContainerContext, reason: str, message: str) -> None:
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

    def _deny(self, ctx: ContainerContext, reason: str, message: str) -> ContainerContext:
        self._report(ctx, reason, message)
        return ctx.with_envs({ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU})

    def _report_kubelet_devices(self, ctx: ContainerContext, ids: tuple[str, ...]) -> None:
        if self._kubelet_devices is None or not ids:
            return
        try:
            self._kubelet_devices.container_devices(ctx.pod_meta, ctx.container_meta.name, ids)
        except Exception as err:
            log.error("recording kubelet-allocated gpus failed", error=repr(err))
