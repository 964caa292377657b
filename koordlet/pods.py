"""The node's pods as the runtime hook needs them: which container requests which GPU resource.

Role: ``PodRecord`` (a slim, decoded pod: uid, name, containers with their GPU requests),
``decode_pod_record`` (the v1 Pod JSON -> record; used by the kube adapter), and ``PodCache``:
filled by the sync loop's pod list, and on a miss asking the API server once for the pod
(``PodGetter``, a bounded call) rather than guessing.

Invariants:

- Identity is the uid: a lookup for uid U never answers another pod, even one of the same
  namespace/name (a pod re-created under its name); that is ``PodMissing``.
- ``lookup`` makes at most one API call and raises ``PodMissing`` (the API server says the pod
  does not exist, or it has another uid) or ``PodUnavailable`` (no answer in time, an error).
- A fetched pod stays cached until a pod list newer than the fetch no longer has it, so a
  list that was started before the pod was bound cannot drop it.
- Thread-safe: the sync thread updates, RPC threads look up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

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
    "PodCache",
    "PodGetter",
    "PodMissing",
    "PodRecord",
    "PodUnavailable",
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


class PodMissing(LookupError):
    """The pod does not exist (or exists under another uid)."""


class PodUnavailable(Exception):
    """The pod could not be read in time."""


class PodGetter(Protocol):
    """One pod from the API server; implemented by ``koordlet.kube.KubeNodeAPI``."""

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> PodRecord:
        """Raises ``PodMissing`` (404) or ``PodUnavailable`` (any other failure, a timeout)."""
        ...


class PodCache:
    """uid -> ``PodRecord``; see the module docstring."""

    def __init__(
        self,
        getter: PodGetter | None,
        *,
        fetch_timeout_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._getter = getter
        self._fetch_timeout_s = fetch_timeout_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._pods: dict[str, PodRecord] = {}
        self._fetched: dict[str, float] = {}  # uid -> when it was fetched
        self.fetches = 0

    def replace(self, records: Iterable[PodRecord], listed_at: float) -> None:
        """The node's pods as listed (the list started at ``listed_at``, monotonic)."""
        fresh = {r.uid: r for r in records if r.uid}
        with self._lock:
            for uid, at in list(self._fetched.items()):
                if uid in fresh or at < listed_at:
                    del self._fetched[uid]
                else:
                    fresh[uid] = self._pods[uid]
            self._pods = fresh

    def now(self) -> float:
        return self._monotonic()

    def _cached(self, uid: str, namespace: str, name: str) -> PodRecord | None:
        with self._lock:
            if uid:
                return self._pods.get(uid)
            for pod in self._pods.values():
                if pod.namespace == namespace and pod.name == name:
                    return pod
        return None

    def lookup(self, uid: str, namespace: str, name: str) -> PodRecord:
        """The pod ``uid`` (by namespace/name when the uid is empty); raises ``PodMissing``,
        ``PodUnavailable``."""
        cached = self._cached(uid, namespace, name)
        if cached is not None:
            return cached
        if self._getter is None:
            raise PodUnavailable(f"pod {namespace}/{name} ({uid}) is not cached")
        self.fetches += 1
        pod = self._getter.get_pod(namespace, name, self._fetch_timeout_s)
        if uid and pod.uid != uid:
            raise PodMissing(f"pod {namespace}/{name} is now uid {pod.uid}, not {uid}")
        with self._lock:
            self._pods[pod.uid] = pod
            self._fetched[pod.uid] = self._monotonic()
        return pod
