"""The node agent's assembly: inventory, health watcher, sync loop, metrics server, extra services.

Role: wire the parts that ``koordlet run`` needs and own their lifecycle (start in dependency
order, stop in reverse), and compute the one-shot report of ``koordlet report --once``. The
composition root (``koordlet.cli``) builds the adapters (library, API, hook server) and hands
them in; nothing here opens anything before ``start()``.

Invariants:

- ``NodeInventory`` discovers once, at ``open()``; a library that is absent (``init()`` is
  False) gives an empty inventory and the agent runs on.
- Every inventory snapshot first probes the cards (a card that can no longer be read turns
  unhealthy), so the sync loop sees lost cards within one interval.
- A health change wakes the sync loop at once (``HealthTracker`` -> ``DeviceSyncer.trigger``).
- ``stop()`` is idempotent and stops only what ``start()`` started.
- Kubelet-allocated GPUs reach the sync loop at once: from the runtime hook
  (``kubelet_devices``, kept in ``HotDevices``) and from an inotify watch of the checkpoint
  (``CheckpointWatcher``); the checkpoint's device-plugin ids are normalised to card UUIDs
  (``koordlet.kubelet.deviceids``) before they are published.
- Every sync pass's pod list refreshes the runtime hook's ``PodCache``; ``kubelet_grants``
  answers the hook which GPUs the kubelet gave a container (the checkpoint, read per call).
- ``deny`` (a container started without GPUs) counts the denial and queues a Warning event
  on the pod; it never blocks.
- ``toolkit`` (the NVIDIA container toolkit's config, ``koordlet.devices.toolkit``): its
  verdict is logged at start and on change, exported as ``koordlet_gpu_isolation`` and shown
  on ``/readyz``; it fails readiness only with ``require_gpu_isolation``.
- Node-side device admission (``koordlet.admission``) over the node's GPUs and, with a sysfs
  root, its RDMA NICs and VFs (re-read at each decision): every pod list feeds ``admission``;
  a pod it refuses is counted, gets a Warning event ``DeviceOvercommit`` and its status is set
  ``Failed`` (reason ``DeviceOvercommit``) off the RPC's thread, when a ``status_api`` is
  given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry

from apis.checkpoint import PodDeviceEntry
from apis.device import Device
from apis.resources import DEVICE_GPU, DEVICE_RDMA
from koordlet.admission import (
    POD_REASON,
    NodeAdmission,
    NodeDevice,
    PodFailer,
    PodStatusAPI,
    Refusal,
    gpu_devices,
    nic_devices,
)
from koordlet.devices.health import HealthTracker, HealthWatcher, probe_all
from koordlet.devices.library import GPU, DeviceLibrary, Discovery
from koordlet.devices.rdma import discover_rdma
from koordlet.devices.toolkit import SAFE, ToolkitCheck
from koordlet.events import EventAPI, EventRecorder
from koordlet.kubelet.checkpoint import DEFAULT_KUBELET_ROOT, CheckpointReader
from koordlet.kubelet.deviceids import normalize_entries
from koordlet.kubelet.devices import HotDevices
from koordlet.kubelet.grants import KubeletGrants
from koordlet.kubelet.watch import CheckpointWatcher
from koordlet.metrics import GPUCollector, GPUIsolationCollector, KoordletMetrics, MetricsServer
from koordlet.pods.cache import PodCache, PodGetter
from koordlet.reporting.reporter import (
    DEFAULT_GPU_RESOURCES,
    GPUResourceNames,
    Inventory,
    NodePods,
    desired_device,
    rfc3339,
)
from koordlet.reporting.sync import RESULT_ERROR, DeviceSyncer, NodeAPI

__all__ = ["Agent", "NodeInventory", "Service", "report_once"]

log = structlog.get_logger("koordlet")

GPU_NOT_ALLOCATED = "gpu-not-allocated"
"""The GPU hook's denial reason (``runtimehooks.ports``) for a container that asked for GPUs
no allocator gave it; spelled here because the agent does not import the hooks."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Service(Protocol):
    """Something the agent starts after its own parts and stops before them."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class NodeInventory:
    """The node's discovered cards and their health."""

    def __init__(
        self, library: DeviceLibrary, sysfs_root: str | os.PathLike[str] | None = None
    ) -> None:
        self.library = library
        self.sysfs_root = sysfs_root
        """Where RDMA NICs are discovered (``koordlet.devices.rdma``); None: no RDMA."""
        self.discovery = Discovery()
        self.tracker = HealthTracker(())
        self._opened = False

    @property
    def gpus(self) -> tuple[GPU, ...]:
        return self.discovery.gpus

    def open(self) -> None:
        """Initialize the library and discover the cards (no devices if it is absent)."""
        if self._opened:
            return
        self._opened = True
        if self.library.init():
            self.discovery = self.library.discover()
        self.tracker = HealthTracker((g.uuid for g in self.discovery.gpus), self.discovery.health)

    def snapshot(self) -> Inventory:
        """Probe the cards, then the inventory as the reporter reads it."""
        probe_all(self.library, self.discovery.gpus, self.tracker)
        return Inventory(
            gpus=self.discovery.gpus,
            health=self.tracker.snapshot(),
            driver_version=self.discovery.driver_version,
            topology=self.discovery.topology,
            # Re-read each time: port states (health) and VF counts change at run time.
            nics=discover_rdma(self.sysfs_root) if self.sysfs_root is not None else (),
        )

    def close(self) -> None:
        if self._opened:
            self._opened = False
            self.library.shutdown()


def report_once(
    node_name: str,
    library: DeviceLibrary,
    kubelet_root: str | os.PathLike[str] = DEFAULT_KUBELET_ROOT,
    clock: Callable[[], datetime] = _utcnow,
    gpu_resources: GPUResourceNames = DEFAULT_GPU_RESOURCES,
    sysfs_root: str | os.PathLike[str] | None = None,
) -> Device:
    """The Device CR the agent would write now (no API server: every GPU entry is kept)."""
    inventory = NodeInventory(library, sysfs_root)
    inventory.open()
    try:
        snapshot = inventory.snapshot()
    finally:
        inventory.close()
    entries = normalize_entries(
        CheckpointReader(kubelet_root).read(), inventory.gpus, library.mig_parent
    )
    return desired_device(
        node_name, snapshot, entries, None, now=rfc3339(clock()), gpu_resources=gpu_resources
    )


class Agent:
    """``koordlet run``: see the module docstring."""

    def __init__(
        self,
        *,
        node_name: str,
        library: DeviceLibrary,
        api: NodeAPI,
        registry: CollectorRegistry,
        sync_interval_s: float = 10.0,
        kubelet_root: str | os.PathLike[str] = DEFAULT_KUBELET_ROOT,
        metrics_address: tuple[str, int] | None = None,
        clock: Callable[[], datetime] = _utcnow,
        services: Sequence[Service] = (),
        pod_getter: PodGetter | None = None,
        event_api: EventAPI | None = None,
        watch_checkpoint: bool = True,
        gpu_resources: GPUResourceNames = DEFAULT_GPU_RESOURCES,
        status_api: PodStatusAPI | None = None,
        sysfs_root: str | os.PathLike[str] | None = None,
        toolkit: ToolkitCheck | None = None,
        require_gpu_isolation: bool = False,
    ) -> None:
        self.node_name = node_name
        self.toolkit = toolkit
        self.require_gpu_isolation = require_gpu_isolation
        self.sync_interval_s = sync_interval_s
        self.metrics = KoordletMetrics(registry)
        self.inventory = NodeInventory(library, sysfs_root)
        self.checkpoint = CheckpointReader(kubelet_root, on_error=self.metrics.checkpoint_error)
        self.kubelet_grants = KubeletGrants(
            self.checkpoint, gpu_resources, lambda: self.inventory.gpus
        )
        self.pods = PodCache(pod_getter)
        self.events = EventRecorder(event_api, node_name) if event_api is not None else None
        self.pod_failer = PodFailer(status_api) if status_api is not None else None
        self.admission = NodeAdmission(
            self._admission_devices,
            device_types=(DEVICE_GPU,) if sysfs_root is None else (DEVICE_GPU, DEVICE_RDMA),
            on_refused=self._refused,
        )
        self.syncer = DeviceSyncer(
            api,
            node_name,
            self.inventory.snapshot,
            self.checkpoint_entries,
            clock=clock,
            observer=self.metrics,
            on_pods=self._pods_listed,
            gpu_resources=gpu_resources,
        )
        self.hot_devices = HotDevices(on_change=self.syncer.trigger)
        self.checkpoint_watcher = (
            CheckpointWatcher(self.checkpoint.path, self.syncer.trigger)
            if watch_checkpoint
            else None
        )
        registry.register(
            GPUCollector(
                node_name,
                library,
                lambda: self.inventory.gpus,
                lambda: self.inventory.tracker.snapshot(),
            )
        )
        if toolkit is not None:
            registry.register(GPUIsolationCollector(node_name, toolkit.check))
        self.metrics_server = (
            MetricsServer(
                registry,
                metrics_address,
                healthz=self.healthy,
                readyz=self.ready,
                readyz_notes=self.readiness_notes,
            )
            if metrics_address is not None
            else None
        )
        self.services = list(services)
        self._pod_listeners: list[Callable[[frozenset[str], float], None]] = []
        self.watcher: HealthWatcher | None = None
        self._started: list[Callable[[], None]] = []

    def add_service(self, service: Service) -> None:
        """Start ``service`` with the agent (after its own parts); before ``start()``."""
        self.services.append(service)

    def on_pods_listed(self, listener: Callable[[frozenset[str], float], None]) -> None:
        """Call ``listener(pod uids, listed_at)`` after every pod list (on the sync thread)."""
        self._pod_listeners.append(listener)

    def checkpoint_entries(self) -> tuple[PodDeviceEntry, ...]:
        """The kubelet's GPU holders: the checkpoint plus what the hook saw, by card UUID."""
        entries = self.hot_devices.merged(self.checkpoint.read())
        return normalize_entries(entries, self.inventory.gpus, self.inventory.library.mig_parent)

    def _admission_devices(self) -> list[NodeDevice]:
        """The devices the node's hooks hand out: its cards, and its RDMA NICs (read now)."""
        devices = gpu_devices(self.inventory.gpus)
        if self.inventory.sysfs_root is not None:
            devices += nic_devices(discover_rdma(self.inventory.sysfs_root))
        return devices

    def _pods_listed(self, pods: NodePods, listed_at: float) -> None:
        self.pods.replace(pods.records.values(), listed_at)
        self.admission.observe(pods.records.values(), listed_at)
        self.hot_devices.retain(pods.uids, listed_at)
        for listener in self._pod_listeners:
            try:
                listener(pods.uids, listed_at)
            except Exception as exc:  # a listener never stops the sync loop
                log.error("a pod-list listener failed", error=repr(exc))

    def kubelet_devices(self, pod_uid: str, container: str, device_ids: tuple[str, ...]) -> None:
        """The runtime hook saw device-plugin GPUs on a container: publish them now."""
        self.hot_devices.record(pod_uid, container, device_ids)

    def deny(
        self, namespace: str, name: str, uid: str, container: str, reason: str, message: str
    ) -> None:
        """A container of pod namespace/name was started without its devices (fail closed):
        its GPUs, or for the RDMA hook's reasons (``rdma-…``) its RDMA devices; or it asked
        for GPUs no allocator gave it (``gpu-not-allocated``) and got none, or only its own."""
        self.metrics.hook_denial(reason)
        if self.events is None:
            return
        if reason == GPU_NOT_ALLOCATED:
            event = "GPUNotAllocated"
            text = f"container {container!r} asked for GPUs it was not given ({reason})"
        elif reason.startswith("rdma"):
            event = "RDMAAllocationNotServed"
            text = f"container {container!r} started without RDMA devices ({reason})"
        else:
            event = "GPUAllocationNotServed"
            text = f"container {container!r} started without GPUs ({reason})"
        self.events.warn(namespace, name, uid, event, f"{text}: {message}")

    def _refused(self, refusal: Refusal) -> None:
        """A pod refused at the node: count it, post an event, set it Failed (never blocks)."""
        self.metrics.admission_refusal()
        message = f"Pod was rejected by the node's device admission: {refusal.message}"
        if self.events is not None:
            self.events.warn(refusal.namespace, refusal.name, refusal.uid, POD_REASON, message)
        if self.pod_failer is not None:
            self.pod_failer.fail(refusal.namespace, refusal.name, refusal.uid, POD_REASON, message)

    def healthy(self) -> bool:
        """``/healthz``: the sync loop is alive."""
        return self.syncer.running

    def ready(self) -> bool:
        """``/readyz``: the node is being reported — the latest sync pass wrote (or found
        current) the Device CR and the Node; not before the first pass, not while passes fail
        (the API server unreachable, RBAC, the node missing). With ``require_gpu_isolation``
        also only while the toolkit's verdict is ``safe``."""
        reporting = self.syncer.running and self.syncer.last_result not in ("", RESULT_ERROR)
        if self.require_gpu_isolation and self.toolkit is not None:
            return reporting and self.toolkit.check().state == SAFE
        return reporting

    def readiness_notes(self) -> list[str]:
        """Lines after ``/readyz``'s status: the toolkit's GPU isolation verdict."""
        if self.toolkit is None:
            return []
        return [f"gpu-isolation: {self.toolkit.check().line()}"]

    def start(self) -> None:
        """Discover, watch health, serve metrics, start the services, then the sync loop."""
        try:
            self.inventory.open()
            self._started.append(self.inventory.close)
            self.inventory.tracker.set_on_change(self.syncer.trigger)
            watcher = HealthWatcher(
                self.inventory.library, self.inventory.tracker, self.inventory.gpus
            )
            if watcher.start():
                self.watcher = watcher
                self._started.append(watcher.stop)
            if self.metrics_server is not None:
                self.metrics_server.start()
                self._started.append(self.metrics_server.stop)
            if self.toolkit is not None:
                self.toolkit.check()  # logs the verdict once at start
            if self.events is not None:
                self.events.start()
                self._started.append(self.events.stop)
            if self.pod_failer is not None:
                self.pod_failer.start()
                self._started.append(self.pod_failer.stop)
            if self.checkpoint_watcher is not None:
                self.checkpoint_watcher.start()
                self._started.append(self.checkpoint_watcher.stop)
            for service in self.services:
                service.start()
                self._started.append(service.stop)
            self.syncer.start(self.sync_interval_s)
            self._started.append(self.syncer.stop)
        except BaseException:
            self.stop()
            raise
        log.info(
            "koordlet started",
            node=self.node_name,
            gpus=len(self.inventory.gpus),
            health_watcher=self.watcher is not None,
            sync_interval_s=self.sync_interval_s,
        )

    def stop(self) -> None:
        """Stop everything started, in reverse order; idempotent."""
        while self._started:
            stop = self._started.pop()
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                log.error("stopping a koordlet part failed", error=repr(exc))
