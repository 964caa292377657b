"""The node's one pod record: what every node service reads of a pod, decoded once.

Role: ``PodRecord`` (a slim, decoded pod: identity, labels and annotations, containers with
their GPU requests, creation time, whether it started) and ``decode_pod_record`` (the v1 Pod
JSON -> record), the one decoder the kube adapter runs for the sync loop's pod list and a
single GET alike. The runtime hook reads the containers' requests, node admission the
allocation and the start, fair share the labels and annotations.

Invariants: decoding never raises on a pod the API server admitted (a missing field reads
as empty; a GPU quantity that does not parse counts as a request of 1); labels and
annotations are string maps (a ``None`` value dropped, anything else written as text).
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
    "str_map",
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
    """A live pod of this node; containers: init containers first, then app containers."""

    uid: str
    namespace: str = ""
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerRecord, ...] = ()
    created: str = ""
    """``metadata.creationTimestamp`` as written (RFC 3339, UTC: sorts as text)."""
    started: bool = False
    """A container of the pod was created: phase ``Running``, or a (init) container status
    that is running or terminated (node admission learns these pods as admitted)."""

    @property
    def allocation(self) -> str | None:
        """The ``device-allocated`` annotation's text (None: the pod has none)."""
        return self.annotations.get(ANNOTATION_DEVICE_ALLOCATED)


def str_map(v: object) -> dict[str, str]:
    """An API object's string map (labels, annotations, quantities) as text; not a map: {}."""
    if not isinstance(v, Mapping):
        return {}
    return {str(k): str(val) for k, val in v.items() if val is not None}


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
    return PodRecord(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        labels=str_map(meta.get("labels")),
        annotations=str_map(meta.get("annotations")),
        containers=tuple(containers),
        created=str(meta.get("creationTimestamp") or ""),
        started=_started(obj.get("status") or {}),
    )
