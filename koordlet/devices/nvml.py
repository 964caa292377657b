"""The NVML adapter of the ``DeviceLibrary`` port (nvidia-ml-py); the only importer of pynvml.

Role: discover the node's NVIDIA GPUs (UUID, minor, name, total memory, PCI bus id; NUMA node
and PCIe root from sysfs under an injectable root), read their live usage for metrics, and
turn NVML's critical-XID events into health events.

Invariants:

- Every NVML call goes through the ``pynvml`` module's attributes (``pynvml.nvmlInit()``,
  never ``from pynvml import ...``), so tests can replace those functions and still run this
  code unchanged.
- A node without the NVML library (``NVML_ERROR_LIBRARY_NOT_FOUND``) or without a working
  driver is a node without GPUs: ``init()`` logs one line and returns False, nothing raises.
- A card that cannot be identified (no handle, UUID or minor) is skipped with an error log; a
  card identified but failing another query is reported unhealthy (``DeviceQueryFailed``).
- Health events: only ``nvmlEventTypeXidCriticalError`` is registered; application XIDs are
  ignored (``koordlet.devices.health.APPLICATION_XIDS``); an event whose card cannot be told,
  or a failing wait, affects every card (NVIDIA's device plugin does the same). Registration
  unsupported on every card means no watcher: logged once, the agent keeps running.
- Topology (``Discovery.topology``): every NVLink port of every card is read
  (``nvmlDeviceGetNvLinkState``, ``nvmlDeviceGetNvLinkRemotePciInfo``; the remote is a GPU of
  this node by bus id, an NVSwitch by ``nvmlDeviceGetNvLinkRemoteDeviceType`` or, on drivers
  without it, by the NVSwitch PCI device ids), plus ``nvmlDeviceGetTopologyCommonAncestor``
  for every pair; ``koordlet.devices.interconnect`` turns that into pairs. A card answering
  ``NVML_ERROR_NOT_SUPPORTED`` on its first port has no NVLink (one log line for all such
  cards); any other failed query leaves what it would have told out (logged); topology never
  makes discovery fail.
- ``mig_parent``: ``nvmlDeviceGetHandleByUUID`` of the MIG device, then
  ``nvmlDeviceGetDeviceHandleFromMigDeviceHandle`` and the parent's UUID; an NVML error is
  logged and answers None.
- MIG: ``nvmlDeviceGetMigMode`` (current mode) at discovery; a card in MIG mode is reported
  unhealthy (``MIGEnabled``), never as a whole shareable card; ``NOT_SUPPORTED`` or
  ``FUNCTION_NOT_FOUND`` (cards and drivers without MIG) means no MIG; any other failure
  reports the card unhealthy (``DeviceQueryFailed``): a card that may be split is not offered.
- Memory: ``NVML_ERROR_NOT_SUPPORTED`` from ``nvmlDeviceGetMemoryInfo`` (unified-memory parts)
  is not a fault: the card is healthy and its memory is the node's system memory
  (``MemTotal`` of ``/proc/meminfo``, which its allocations draw from); unhealthy only when
  that cannot be read either. ``probe`` accepts ``NOT_SUPPORTED`` likewise.
- Bus ids use NVML's ``busId`` (``00000000:3B:00.0``; ``busIdLegacy`` as a fallback)
  normalized to the sysfs form ``0000:3b:00.0``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import Counter
from typing import Any, Final

import pynvml
import structlog

from apis.topology import (
    ANCESTOR_HOSTBRIDGE,
    ANCESTOR_INTERNAL,
    ANCESTOR_MULTIPLE,
    ANCESTOR_NODE,
    ANCESTOR_SINGLE,
    ANCESTOR_SYSTEM,
    GPUTopology,
)
from koordlet.devices import sysfs
from koordlet.devices.health import xid_health
from koordlet.devices.interconnect import CardLinks, build_topology
from koordlet.devices.library import (
    GPU,
    HEALTHY,
    MIG_ENABLED,
    REASON_QUERY_FAILED,
    DeviceQueryError,
    Discovery,
    GPUUsage,
    Health,
    HealthEvent,
    ProcessSample,
    query_failed,
)

__all__ = ["DEFAULT_MEMINFO", "NvmlLibrary", "system_memory"]

DEFAULT_MEMINFO: Final = "/proc/meminfo"
_NO_MIG: Final = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


def system_memory(meminfo_path: str | os.PathLike[str] = DEFAULT_MEMINFO) -> int:
    """``MemTotal`` of ``/proc/meminfo`` in bytes; 0 when it cannot be read."""
    try:
        with open(meminfo_path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    value, _, unit = rest.strip().partition(" ")
                    return int(value) * (1024 if unit.strip() == "kB" else 1)
    except (OSError, ValueError):
        return 0
    return 0

log = structlog.get_logger("koordlet.nvml")

_REASON_EVENTS_FAILED = "HealthCheckFailed"

_ANCESTORS: Final = {
    pynvml.NVML_TOPOLOGY_INTERNAL: ANCESTOR_INTERNAL,
    pynvml.NVML_TOPOLOGY_SINGLE: ANCESTOR_SINGLE,
    pynvml.NVML_TOPOLOGY_MULTIPLE: ANCESTOR_MULTIPLE,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: ANCESTOR_HOSTBRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: ANCESTOR_NODE,
    pynvml.NVML_TOPOLOGY_SYSTEM: ANCESTOR_SYSTEM,
}
_NVIDIA_VENDOR_ID: Final = 0x10DE
_NVSWITCH_DEVICE_IDS: Final = frozenset({0x1AC0, 0x1AC1, 0x1AC2, 0x1AF1, 0x22A3})
"""PCI device ids of NVSwitch generations 1 (DGX-2), 2 (A100 HGX) and 3 (H100 HGX)."""


def _text(value: object) -> str:
    """NVML strings: ``str`` from recent nvidia-ml-py, ``bytes`` from old ones."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", errors="replace")
    return str(value)


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class NvmlLibrary:
    """GPUs through NVML; see the module docstring for the invariants."""

    def __init__(
        self,
        sysfs_root: str | os.PathLike[str] = sysfs.DEFAULT_SYSFS_ROOT,
        meminfo_path: str | os.PathLike[str] = DEFAULT_MEMINFO,
    ) -> None:
        self._sysfs_root = sysfs_root
        self._meminfo_path = meminfo_path
        self._lock = threading.Lock()
        self._initialized = False
        self._event_set: Any = None
        self._idle = threading.Event()  # waited on when there is no event set
        self._no_process_util: set[str] = set()  # cards already logged as unsupported

    # -- lifecycle ----------------------------------------------------------------------------

    def init(self) -> bool:
        with self._lock:
            if self._initialized:
                return True
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                if _error_code(exc) == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                    log.warning(
                        "NVML library (libnvidia-ml.so.1) not found: no GPUs on this node",
                    )
                else:
                    log.warning("NVML init failed: no GPUs on this node", error=str(exc))
                return False
            self._initialized = True
            return True

    def shutdown(self) -> None:
        self.close_health_events()
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("NVML shutdown failed", error=str(exc))

    # -- discovery ----------------------------------------------------------------------------

    def discover(self) -> Discovery:
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            log.error("reading the NVIDIA driver version failed", error=str(exc))
            driver = ""
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            log.error("counting GPUs failed: no GPUs reported", error=str(exc))
            return Discovery(driver_version=driver)
        gpus: list[GPU] = []
        health: dict[str, Health] = {}
        for index in range(count):
            found = self._discover_one(index)
            if found is not None:
                gpu, gpu_health = found
                gpus.append(gpu)
                if not gpu_health.healthy:
                    health[gpu.uuid] = gpu_health
        gpus.sort(key=lambda g: (g.minor, g.index))
        log.info("gpus discovered", count=len(gpus), driver_version=driver)
        try:
            topology = self._discover_topology(tuple(gpus))
        except Exception as exc:  # a bug or an odd binding must not cost the node its GPUs
            log.error("gpu topology discovery failed: no topology reported", error=repr(exc))
            topology = GPUTopology()
        return Discovery(driver_version=driver, gpus=tuple(gpus), health=health, topology=topology)

    def _discover_one(self, index: int) -> tuple[GPU, Health] | None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
        except pynvml.NVMLError as exc:
            log.error("gpu cannot be identified: skipped", index=index, error=str(exc))
            return None
        health = HEALTHY
        name = ""
        memory_total = 0
        bus_id = ""
        try:
            name = _text(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            health = query_failed("nvmlDeviceGetName", exc)
        try:
            memory_total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        except pynvml.NVMLError as exc:
            if _error_code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                memory_total = system_memory(self._meminfo_path)
                log.info(
                    "gpu memory info not supported (unified memory): publishing system memory",
                    uuid=uuid,
                    memory_bytes=memory_total,
                )
                if not memory_total:
                    health = query_failed(
                        "nvmlDeviceGetMemoryInfo (not supported) and system memory", exc
                    )
            else:
                health = query_failed("nvmlDeviceGetMemoryInfo", exc)
        try:
            current = pynvml.nvmlDeviceGetMigMode(handle)[0]
        except pynvml.NVMLError as exc:
            if _error_code(exc) not in _NO_MIG:
                health = query_failed("nvmlDeviceGetMigMode", exc)
        else:
            if int(current) == pynvml.NVML_DEVICE_MIG_ENABLE:
                health = MIG_ENABLED
                log.warning("gpu in MIG mode: not offered as a whole card", uuid=uuid)
        try:
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            bus_id = sysfs.normalize_bus_id(_text(pci.busId)) or sysfs.normalize_bus_id(
                _text(pci.busIdLegacy)
            )
        except pynvml.NVMLError as exc:
            health = query_failed("nvmlDeviceGetPciInfo", exc)
        if health.reason == REASON_QUERY_FAILED:
            log.error("gpu query failed: reported unhealthy", uuid=uuid, message=health.message)
        gpu = GPU(
            uuid=uuid,
            minor=minor,
            name=name,
            memory_total=memory_total,
            bus_id=bus_id,
            numa_node=sysfs.numa_node(self._sysfs_root, bus_id),
            pcie_root=sysfs.pcie_root(self._sysfs_root, bus_id),
            index=index,
        )
        return gpu, health

    # -- topology -----------------------------------------------------------------------------

    def _discover_topology(self, gpus: tuple[GPU, ...]) -> GPUTopology:
        handles: dict[int, Any] = {}
        for gpu in gpus:
            try:
                handles[gpu.minor] = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except pynvml.NVMLError as exc:
                log.warning("gpu left out of the topology", minor=gpu.minor, error=str(exc))
        by_bus = {g.bus_id: g.minor for g in gpus if g.bus_id and g.minor in handles}
        cards: dict[int, CardLinks] = {}
        without: list[int] = []
        for minor, handle in handles.items():
            links = self._card_links(minor, handle, by_bus)
            if links is None:
                without.append(minor)
            else:
                cards[minor] = links
        if without:
            log.info("NVLink not supported: PCIe only", minors=sorted(without))
        topology = build_topology(handles, cards, self._ancestors(handles))
        nvlink_pairs = sum(1 for link in topology.links if link.is_nvlink)
        log.info("gpu topology discovered", pairs=len(topology.links), nvlink_pairs=nvlink_pairs)
        return topology

    def _card_links(self, minor: int, handle: Any, by_bus: dict[str, int]) -> CardLinks | None:
        """The card's active NVLink ports by remote end; None when it has no NVLink."""
        peers: Counter[int] = Counter()
        switches: Counter[str] = Counter()
        version: int | None = None
        failures: list[str] = []
        for port in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, port) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, port)
            except pynvml.NVMLError as exc:
                code = _error_code(exc)
                if code == pynvml.NVML_ERROR_NOT_SUPPORTED and port == 0:
                    return None
                if code not in (
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    failures.append(f"port {port}: {exc}")
                continue  # NOT_SUPPORTED / INVALID_ARGUMENT: past the card's last port
            bus = sysfs.normalize_bus_id(_text(remote.busId)) or sysfs.normalize_bus_id(
                _text(remote.busIdLegacy)
            )
            if bus in by_bus:
                peers[by_bus[bus]] += 1
            elif self._is_switch(handle, port, remote):
                switches[bus] += 1
            else:
                continue  # a CPU (IBM NPU) or a GPU this node does not show: not a GPU pair
            if version is None:
                try:
                    version = int(pynvml.nvmlDeviceGetNvLinkVersion(handle, port))
                except pynvml.NVMLError as exc:
                    failures.append(f"port {port} version: {exc}")
        if failures:
            log.warning("some NVLink ports could not be read", minor=minor, errors=failures)
        return CardLinks(minor=minor, peers=dict(peers), switches=dict(switches), version=version)

    @staticmethod
    def _is_switch(handle: Any, port: int, remote: Any) -> bool:
        try:
            kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, port)
        except pynvml.NVMLError:  # drivers before R450: tell by the PCI device id
            pci_id = int(remote.pciDeviceId)
            return pci_id & 0xFFFF == _NVIDIA_VENDOR_ID and pci_id >> 16 in _NVSWITCH_DEVICE_IDS
        return bool(kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    @staticmethod
    def _ancestors(handles: dict[int, Any]) -> dict[tuple[int, int], str]:
        out: dict[tuple[int, int], str] = {}
        unsupported = 0
        failures: list[str] = []
        for (a, ha), (b, hb) in itertools.combinations(sorted(handles.items()), 2):
            try:
                level = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
            except pynvml.NVMLError as exc:
                if _error_code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    unsupported += 1
                else:
                    failures.append(f"{a}-{b}: {exc}")
                continue
            name = _ANCESTORS.get(level)
            if name is None:
                failures.append(f"{a}-{b}: unknown level {level}")
            else:
                out[(a, b)] = name
        if unsupported:
            log.info("gpu common ancestors not supported", pairs=unsupported)
        if failures:
            log.warning("some gpu common ancestors could not be read", errors=failures)
        return out

    # -- live queries -------------------------------------------------------------------------

    def _handle(self, gpu: GPU) -> Any:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        if uuid != gpu.uuid:
            raise DeviceQueryError(f"NVML index {gpu.index} is now {uuid}, not {gpu.uuid}")
        return handle

    def probe(self, gpu: GPU) -> Health:
        try:
            handle = self._handle(gpu)
        except (pynvml.NVMLError, DeviceQueryError) as exc:
            return query_failed("NVML query", exc)
        try:
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            if _error_code(exc) != pynvml.NVML_ERROR_NOT_SUPPORTED:
                return query_failed("NVML query", exc)
        return HEALTHY

    def usage(self, gpu: GPU) -> GPUUsage:
        try:
            handle = self._handle(gpu)
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except pynvml.NVMLError as exc:
            raise DeviceQueryError(f"{gpu.uuid}: {exc}") from None
        try:
            utilization: float | None = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100
        except pynvml.NVMLError:
            utilization = None  # not supported on every card
        return GPUUsage(memory_used=used, utilization=utilization)

    def process_utilization(self, gpu: GPU, since_us: int) -> tuple[ProcessSample, ...]:
        try:
            handle = self._handle(gpu)
            raw = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == pynvml.NVML_ERROR_NOT_FOUND:
                return ()  # no sample newer than since_us
            if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                if gpu.uuid not in self._no_process_util:
                    self._no_process_util.add(gpu.uuid)
                    log.warning("per-process utilization not supported", uuid=gpu.uuid)
                return ()
            raise DeviceQueryError(f"{gpu.uuid}: {exc}") from None
        return tuple(
            ProcessSample(int(r.pid), int(r.timeStamp), min(1.0, int(r.smUtil) / 100))
            for r in raw
        )

    # -- health events ------------------------------------------------------------------------

    def open_health_events(self, gpus: tuple[GPU, ...]) -> bool:
        if self._event_set is not None:
            return True
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("gpu health events unavailable: no health watcher", error=str(exc))
            return False
        unsupported: list[str] = []
        registered = 0
        for gpu in gpus:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
                registered += 1
            except pynvml.NVMLError as exc:
                unsupported.append(f"{gpu.uuid}: {exc}")
        if registered == 0:
            self._free(event_set)
            log.warning("gpu health events not supported: no health watcher", gpus=unsupported)
            return False
        if unsupported:
            log.warning("gpu health events not supported on some gpus", gpus=unsupported)
        self._event_set = event_set
        return True

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        event_set = self._event_set
        if event_set is None:
            self._idle.wait(timeout_s)
            return None
        try:
            data = pynvml.nvmlEventSetWait(event_set, max(0, int(timeout_s * 1000)))
        except pynvml.NVMLError as exc:
            if _error_code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            log.error("waiting for gpu events failed: every gpu marked unhealthy", error=str(exc))
            return HealthEvent(
                "", Health(False, _REASON_EVENTS_FAILED, f"nvmlEventSetWait failed: {exc}")
            )
        if int(data.eventType) != pynvml.nvmlEventTypeXidCriticalError:
            return None
        xid = int(data.eventData)
        health = xid_health(xid)
        if health is None:
            log.info("application xid ignored", xid=xid)
            return None
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            log.error("xid on an unknown gpu: every gpu marked unhealthy", xid=xid, error=str(exc))
            return HealthEvent("", health)
        log.error("critical xid", uuid=uuid, xid=xid)
        return HealthEvent(uuid, health)

    def close_health_events(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is not None:
            self._free(event_set)

    # -- MIG ----------------------------------------------------------------------------------

    def mig_parent(self, mig_uuid: str) -> str | None:
        try:
            mig = pynvml.nvmlDeviceGetHandleByUUID(mig_uuid)
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            return _text(pynvml.nvmlDeviceGetUUID(parent))
        except pynvml.NVMLError as exc:
            log.warning("MIG device cannot be resolved to its gpu", mig=mig_uuid, error=str(exc))
            return None

    @staticmethod
    def _free(event_set: Any) -> None:
        try:
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as exc:
            log.warning("freeing the NVML event set failed", error=str(exc))
