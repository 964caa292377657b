"""What the hooks need from the node agent: the pod's spec, its node-side admission, and
where denials and kubelet devices go.

Role: the ports between the pure hooks (``runtimehooks/hooks/``) and the agent that serves
them (``koordlet.hookserver`` adapts the agent's pod cache, metrics, events and Device CR
syncer to these).  Records are slim and already decoded: quantities are integers.

Invariants:

- Stdlib and ``runtimehooks.context`` only; no grpc, no protobuf, no koordlet.
- ``PodSource.pod_spec`` answers the pod of the request *by uid*: a pod re-created under the
  same name is a different pod, and the answer then is ``PodLookupError`` (never the new
  pod's spec).  It blocks at most its own bounded timeout.
- ``PodAdmission.admit`` answers at once for a pod it has decided (admitted pods stay
  admitted, refused pods stay refused) and blocks at most its own bounded wait otherwise.
- ``DenialSink.denied`` and ``KubeletDeviceSink.container_devices`` must not block: they are
  called on the RPC's thread (count, queue, return).
- ``KubeletAllocations.gpu_devices`` answers from the kubelet's own record (its device
  checkpoint, written before the container is created) and never blocks on the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Protocol

from runtimehooks.context import PodMeta

__all__ = [
    "REASON_ADMISSION_NOT_READY",
    "REASON_DEVICE_OVERCOMMIT",
    "REASON_GPU_NOT_ALLOCATED",
    "REASON_INTERNAL_ERROR",
    "REASON_INVALID_ALLOCATION",
    "REASON_POD_LOOKUP_ERROR",
    "REASON_POD_NOT_FOUND",
    "AdmissionRefused",
    "ContainerKind",
    "ContainerSpec",
    "Denial",
    "DenialSink",
    "KubeletAllocations",
    "KubeletDeviceSink",
    "PodAdmission",
    "PodLookupError",
    "PodSource",
    "PodSpec",
]

REASON_INVALID_ALLOCATION: Final = "invalid-allocation"
REASON_POD_NOT_FOUND: Final = "pod-not-found"
REASON_POD_LOOKUP_ERROR: Final = "pod-lookup-error"
REASON_INTERNAL_ERROR: Final = "internal-error"
REASON_DEVICE_OVERCOMMIT: Final = "device-overcommit"
"""The pod's devices (card shares, VFs) do not fit beside the pods the node already admitted."""
REASON_GPU_NOT_ALLOCATED: Final = "gpu-not-allocated"
"""The container asked for GPUs (an environment variable, a CDI annotation) that no allocator
of the node gave it: it gets none, or only the ones it was given."""
REASON_ADMISSION_NOT_READY: Final = "admission-not-ready"
"""The agent has not yet learned the node's running pods (no pod list since it started)."""


class ContainerKind(StrEnum):
    """How a container runs next to the others of its pod."""

    INIT = "init"  # an init container: alone, one after the other, before the app containers
    SIDECAR = "sidecar"  # an init container with restartPolicy Always: runs with what follows
    APP = "app"  # spec.containers


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container of the pod spec and its GPU requests (resource name -> integer amount:
    percents, bytes for ``gpu-memory``, counts; requests, or limits where no request is set)."""

    name: str
    kind: ContainerKind = ContainerKind.APP
    gpu_requests: Mapping[str, int] = field(default_factory=dict)

    @property
    def requests_gpu(self) -> bool:
        return any(v > 0 for v in self.gpu_requests.values())


@dataclass(frozen=True, slots=True)
class PodSpec:
    """The containers of a pod, init containers first, each list in spec order."""

    uid: str
    containers: tuple[ContainerSpec, ...] = ()

    def container(self, name: str) -> ContainerSpec | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None


class PodLookupError(Exception):
    """The pod of a request cannot be found in time; ``reason`` is a denial reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class PodSource(Protocol):
    """The node's pods as the GPU hook reads them."""

    def pod_spec(self, pod: PodMeta) -> PodSpec:
        """The pod whose uid is ``pod.uid``; raises ``PodLookupError``."""
        ...


class AdmissionRefused(Exception):
    """The node refuses the pod its devices; ``reason`` is a denial reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class PodAdmission(Protocol):
    """The node's device admission: may this pod's containers see the devices (cards, RDMA
    VFs and NICs) its ``device-allocated`` annotation names?"""

    def admit(self, pod: PodMeta, allocation: str) -> None:
        """Returns when the pod is admitted (now or before); raises ``AdmissionRefused``."""
        ...


@dataclass(frozen=True, slots=True)
class Denial:
    """A container started without GPUs because its allocation could not be served."""

    pod: PodMeta
    container: str
    reason: str
    message: str


class DenialSink(Protocol):
    def denied(self, denial: Denial) -> None: ...


class KubeletDeviceSink(Protocol):
    """Receives the device-plugin GPU ids a container is created with (SPEC section 8)."""

    def container_devices(
        self, pod: PodMeta, container: str, device_ids: tuple[str, ...]
    ) -> None: ...


class KubeletAllocations(Protocol):
    """The GPUs the kubelet's device plugins gave a container (its device checkpoint)."""

    def gpu_devices(self, pod: PodMeta, container: str) -> tuple[str, ...]:
        """The container's GPU device ids as a device plugin writes them into
        ``NVIDIA_VISIBLE_DEVICES`` (a time-slicing replica as its card); () for none."""
        ...
