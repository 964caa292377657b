"""The sync loop: keep the node's Device CR, labels and extended resources as the reporter says.

Role: the ``NodeAPI`` port (what the agent needs from the API server, as slim records) and
``DeviceSyncer``, which reconciles through it once per ``--sync-interval`` and at once when
``trigger()`` is called (a health change), on its own thread, started and stopped explicitly.

Invariants:

- One pass: read the Node (its uid, labels, status), the node's pods and the inventory;
  create or update the Device CR, then merge-patch the Node's labels and
  ``status.capacity``/``status.allocatable``. Nothing is written when nothing changed.
- A 409 on create or update is retried with a fresh GET (the desired CR is recomputed on the
  fresh object, so condition transition times and foreign fields stay right), at most
  ``max_conflict_retries`` times.
- The pod list of every pass goes to ``on_pods`` with the monotonic time the list started
  (the runtime hook's pod cache and the hot kubelet devices live on it).
- ``sync_once`` never raises: failures are logged and reported as result ``error``; every pass
  reports exactly one result (``created``, ``updated``, ``unchanged``, ``error``) to the
  observer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Protocol

import structlog

from apis.checkpoint import PodDeviceEntry
from apis.device import Device
from koordlet.reporting.reporter import (
    DEFAULT_GPU_RESOURCES,
    GPUResourceNames,
    Inventory,
    NodePods,
    desired_device,
    device_labels,
    merge_device,
    node_extended_resources,
    node_label_patch,
    node_resource_patch,
    rfc3339,
)

__all__ = [
    "RESULT_CREATED",
    "RESULT_ERROR",
    "RESULT_UNCHANGED",
    "RESULT_UPDATED",
    "ApiError",
    "ConflictError",
    "DeviceSyncer",
    "NodeAPI",
    "NodeState",
    "NotFoundError",
    "SyncObserver",
]

RESULT_CREATED: Final = "created"
RESULT_UPDATED: Final = "updated"
RESULT_UNCHANGED: Final = "unchanged"
RESULT_ERROR: Final = "error"

log = structlog.get_logger("koordlet.sync")


class ApiError(Exception):
    """An API server answer other than success; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status}: {message}" if status else message)


class NotFoundError(ApiError):
    """404."""


class ConflictError(ApiError):
    """409: a stale resourceVersion, or the object already exists."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the agent reads of its Node."""

    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)


class NodeAPI(Protocol):
    """The API server as the agent uses it; implemented by ``koordlet.kube.KubeNodeAPI``."""

    def get_node(self, name: str) -> NodeState:
        """Raises ``NotFoundError``."""
        ...

    def list_node_pods(self, node_name: str) -> NodePods: ...

    def get_device(self, name: str) -> Device:
        """Raises ``NotFoundError``."""
        ...

    def create_device(self, device: Device) -> Device:
        """Raises ``ConflictError`` when it already exists."""
        ...

    def update_device(self, device: Device) -> Device:
        """A full update at ``device.resource_version``; raises ``ConflictError``."""
        ...

    def patch_node_labels(self, name: str, labels: Mapping[str, str]) -> None: ...

    def patch_node_status(
        self,
        name: str,
        capacity: Mapping[str, str | None],
        allocatable: Mapping[str, str | None],
    ) -> None:
        """Merge-patch ``status.capacity``/``status.allocatable``; None deletes a key."""
        ...


class SyncObserver(Protocol):
    def sync_done(self, result: str) -> None: ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


class DeviceSyncer:
    """Reconciles the Device CR and the Node; see the module docstring."""

    def __init__(
        self,
        api: NodeAPI,
        node_name: str,
        inventory: Callable[[], Inventory],
        checkpoint_entries: Callable[[], Sequence[PodDeviceEntry]],
        *,
        clock: Callable[[], datetime] = _utcnow,
        observer: SyncObserver | None = None,
        max_conflict_retries: int = 5,
        on_pods: Callable[[NodePods, float], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        gpu_resources: GPUResourceNames = DEFAULT_GPU_RESOURCES,
    ) -> None:
        self._api = api
        self._gpu_resources = gpu_resources
        self._node_name = node_name
        self._inventory = inventory
        self._checkpoint_entries = checkpoint_entries
        self._clock = clock
        self._observer = observer
        self._max_conflict_retries = max_conflict_retries
        self._on_pods = on_pods
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.last_result = ""

    # -- one pass -----------------------------------------------------------------------------

    def sync_once(self) -> str:
        """Reconcile once; returns the result (also reported to the observer)."""
        try:
            result = self._sync()
        except ApiError as exc:
            log.error("device sync failed", node=self._node_name, status=exc.status, error=str(exc))
            result = RESULT_ERROR
        except Exception as exc:  # network errors of the client, bugs: the loop must go on
            log.error("device sync failed", node=self._node_name, error=repr(exc))
            result = RESULT_ERROR
        self.passes += 1
        self.last_result = result
        if self._observer is not None:
            self._observer.sync_done(result)
        return result

    def _sync(self) -> str:
        node = self._api.get_node(self._node_name)
        listed_at = self._monotonic()
        pods = self._api.list_node_pods(self._node_name)
        if self._on_pods is not None:
            self._on_pods(pods, listed_at)
        inventory = self._inventory()
        entries = self._checkpoint_entries()
        result, device = self._sync_device(node, inventory, entries, pods)

        labels = node_label_patch(node.labels, device_labels(inventory))
        if labels:
            self._api.patch_node_labels(node.name, labels)
            log.info("node labels updated", node=node.name, labels=labels)
        capacity, allocatable = node_resource_patch(
            node.capacity, node.allocatable, node_extended_resources(device)
        )
        if capacity or allocatable:
            self._api.patch_node_status(node.name, capacity, allocatable)
            log.info("node extended resources updated", node=node.name, capacity=capacity)
        if result == RESULT_UNCHANGED and (labels or capacity or allocatable):
            result = RESULT_UPDATED
        return result

    def _sync_device(
        self,
        node: NodeState,
        inventory: Inventory,
        entries: Sequence[PodDeviceEntry],
        pods: NodePods,
    ) -> tuple[str, Device]:
        for attempt in range(self._max_conflict_retries + 1):
            try:
                current: Device | None = self._api.get_device(self._node_name)
            except NotFoundError:
                current = None
            desired = desired_device(
                self._node_name,
                inventory,
                entries,
                pods,
                previous=current,
                now=rfc3339(self._clock()),
                node_uid=node.uid,
                gpu_resources=self._gpu_resources,
            )
            try:
                if current is None:
                    written = self._api.create_device(desired)
                    log.info("device created", node=self._node_name, devices=len(desired.devices))
                    return RESULT_CREATED, written
                merged = merge_device(current, desired)
                if merged is None:
                    return RESULT_UNCHANGED, current
                written = self._api.update_device(merged)
                log.info("device updated", node=self._node_name, devices=len(merged.devices))
                return RESULT_UPDATED, written
            except ConflictError as exc:
                log.info("device write conflict: retrying", attempt=attempt + 1, error=str(exc))
        raise ApiError(409, f"device {self._node_name}: still conflicting after retries")

    # -- the loop -----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval_s: float) -> None:
        """Start the loop thread: a pass at once, then every ``interval_s`` or on trigger."""
        if self._thread is not None:
            raise RuntimeError("DeviceSyncer already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval_s,), name="koordlet-device-sync", daemon=True
        )
        self._thread.start()

    def trigger(self) -> None:
        """Run a pass as soon as possible (thread-safe, cheap)."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop after the pass in progress; idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._wake.set()
        thread.join(timeout_s)
        self._thread = None

    def _run(self, interval_s: float) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self.sync_once()
            self._wake.wait(interval_s)
