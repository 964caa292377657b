"""The node's pods as the runtime hook needs them: which container requests which GPU resource.

Role: ``PodRecord`` (a slim, decoded pod: uid, name, containers with their GPU requests) and
``decode_pod_record`` (the v1 Pod JSON -> record; used by the kube adapter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from apis.quantity import Quantity, QuantityError, int_value
from apis.resources import DEVICE_GPU, DEVICE_RESOURCE_NAMES

__all__ = [
    "ALIYUN_GPU_MEM",
    "CONTAINER_APP",
    "CONTAINER_INIT",
    "CONTAINER_SIDECAR",
    "GPU_REQUEST_RESOURCES",
    "ContainerRecord",
    "PodRecord",
    "decode_pod_record",
]

ALIYUN_GPU_MEM: Final = "aliyun.com/gpu-mem"
GPU_REQUEST_RESOURCES: Final = (*DEVICE_RESOURCE_NAMES[DEVICE_GPU], ALIYUN_GPU_MEM)
CONTAINER_INIT: Final = "init"
CONTAINER_SIDECAR: Final = "sidecar"
CONTAINER_APP: Final = "app"


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """A container: its name, how it runs (init, sidecar, app) and its GPU requests."""

    name: str
    kind: str = CONTAINER_APP
    gpu_requests: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod as the hook needs it; containers: init containers first, then app containers."""

    uid: str
    namespace: str = ""
    name: str = ""
    containers: tuple[ContainerRecord, ...] = ()
    allocation: str | None = None
    """The ``device-allocated`` annotation's text (None: the pod has none)."""
    created: str = ""
    """``metadata.creationTimestamp`` as written (RFC 3339, UTC: sorts as text)."""
    started: bool = False
    """A container of the pod was created: phase ``Running``, or a (init) container status
    that is running or terminated (node admission learns these pods as admitted)."""


def _started(status: Mapping[str, Any]) -> bool:
    if status.get("phase") == "Running":
        return True
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            state = (cs or {}).get("state") or {}
            if "running" in state or "terminated" in state:
                return True
    return False


def _gpu_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    out: dict[str, int] = {}
    for name in GPU_REQUEST_RESOURCES:
        raw = requests.get(name, limits.get(name))
        if raw is None:
            continue
        try:
            value = int_value(Quantity.parse(str(raw)))
        except QuantityError:
            value = 1  # admitted by the API server, so a GPU request all the same
        if value > 0:
            out[name] = value
    return out


def decode_pod_record(obj: Mapping[str, Any]) -> PodRecord:
    """A v1 Pod (JSON) -> ``PodRecord``; tolerant of missing fields."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    containers: list[ContainerRecord] = []
    for c in spec.get("initContainers") or []:
        kind = CONTAINER_SIDECAR if c.get("restartPolicy") == "Always" else CONTAINER_INIT
        containers.append(ContainerRecord(str(c.get("name") or ""), kind, _gpu_requests(c)))
    for c in spec.get("containers") or []:
        containers.append(
            ContainerRecord(str(c.get("name") or ""), CONTAINER_APP, _gpu_requests(c))
        )
    annotations = meta.get("annotations") or {}
    allocation = annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    return PodRecord(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        containers=tuple(containers),
        allocation=allocation if isinstance(allocation, str) else None,
        created=str(meta.get("creationTimestamp") or ""),
        started=_started(obj.get("status") or {}),
    )
