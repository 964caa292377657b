"""A fake NVML host at the ``pynvml`` FUNCTION level, and a sysfs tree to go with it.

``FakeNvmlHost.install(monkeypatch)`` replaces the ``pynvml`` module functions that
``koordlet.devices.nvml`` calls, so the real adapter code runs against what a real 8-GPU host
(two sockets, four PCIe root complexes, minors not in index order) would answer, with NVML's
real record types (``nvmlPciInfo_t``, ``c_nvmlMemory_t``, ``c_nvmlUtilization_t``,
``c_nvmlEventData_t``, ``c_nvmlDevice_t`` handles) and NVML's real exception classes
(``pynvml.NVMLError(code)`` builds the ``NVMLError_<Name>`` subclass, as ``_nvmlCheckReturn``
does).

Interconnect: each ``Card`` lists its NVLink ports (``Port``: the remote's NVML bus id, what it
is, whether the link is up) and its PCIe path (``pcie_switches``, outermost first, under
``root`` on NUMA node ``numa``), from which the host answers ``nvmlDeviceGetNvLink*`` and
``nvmlDeviceGetTopologyCommonAncestor`` the way NVML does. ``*_cards()`` build the four boxes
of ``docs/device-topology.md`` (the same boxes as ``config/examples/fake-gpus-*.yaml``).
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

DRIVER = "535.129.03"
A100 = "NVIDIA A100-SXM4-80GB"
A100_BYTES = 80 * 1024**3
FULL_INSTANCE = 0xFFFFFFFF
_HANDLE_BASE = 0x1000
GPU_PCI_ID = 0x20B210DE
NVSWITCH_PCI_ID = 0x22A310DE  # NVSwitch gen 3 (HGX H100)
REMOTE_TYPES = {
    "gpu": pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
    "switch": pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
    "npu": pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU,
}


@dataclass(frozen=True)
class Port:
    """One NVLink port: the remote end's NVML bus id and kind (gpu | switch | npu)."""

    remote: str
    kind: str = "gpu"
    active: bool = True


@dataclass
class Card:
    uuid: str
    minor: int
    bus_id: str  # NVML's form: 8-digit domain, upper case
    numa: int
    root: str  # pciDDDD:BB
    name: str = A100
    total: int = A100_BYTES
    used: int = 0
    util: int = 0
    lost: bool = False  # every query on the handle fails with GPU_IS_LOST
    lost_handle: bool = False  # nvmlDeviceGetHandleByIndex fails
    failing: set[str] = field(default_factory=set)  # pynvml function names that fail
    events_supported: bool = True
    util_supported: bool = True
    ports: list[Port] = field(default_factory=list)  # NVLink ports in port order
    nvlink_supported: bool = True  # False: NOT_SUPPORTED on port 0 (no NVLink on the card)
    nvlink_version: int = 3
    pcie_switches: tuple[str, ...] = ()  # PCIe switches above the card, outermost first
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)  # pid, ts us, sm%
    process_util_supported: bool = True
    mig_mode: int | None = 0  # current MIG mode (1 = enabled); None: NOT_SUPPORTED (pre-Ampere)
    memory_supported: bool = True  # False: NOT_SUPPORTED (unified-memory parts)

    @property
    def sysfs_bus_id(self) -> str:
        domain, rest = self.bus_id.split(":", 1)
        return f"{int(domain, 16):04x}:{rest.lower()}"


def dgx_cards() -> list[Card]:
    """Eight A100s in NVML index (PCI bus) order; minors as the driver numbered them."""
    layout = [  # bus, numa, root, minor
        ("07", 0, "pci0000:00", 2),
        ("0F", 0, "pci0000:00", 3),
        ("47", 0, "pci0000:40", 0),
        ("4E", 0, "pci0000:40", 1),
        ("87", 1, "pci0000:80", 6),
        ("90", 1, "pci0000:80", 7),
        ("B7", 1, "pci0000:b0", 4),
        ("BD", 1, "pci0000:b0", 5),
    ]
    return [
        Card(
            uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-{minor:012x}",
            minor=minor,
            bus_id=f"00000000:{bus}:00.0",
            numa=numa,
            root=root,
            used=(i + 1) * 1024**3,
            util=10 * i,
        )
        for i, (bus, numa, root, minor) in enumerate(layout)
    ]


def _bus(bus: str) -> str:
    return f"00000000:{bus}:00.0"


def _switch_ports(switches: list[tuple[str, int]]) -> list[Port]:
    return [Port(_bus(bus), "switch") for bus, n in switches for _ in range(n)]


def h100_nvswitch_cards() -> list[Card]:
    """HGX H100 8-GPU: 18 NVLink 4 ports per card to four NVSwitches (5, 4, 4, 5 links);
    two cards per PCIe switch, two switches per socket, each switch on its own root complex."""
    switches = [("E1", 5), ("E2", 4), ("E3", 4), ("E4", 5)]
    layout = [("1B", 0, "pci0000:1a"), ("1C", 0, "pci0000:1a"), ("3B", 0, "pci0000:3a")]
    layout += [("3C", 0, "pci0000:3a"), ("9B", 1, "pci0000:9a"), ("9C", 1, "pci0000:9a")]
    layout += [("BB", 1, "pci0000:ba"), ("BC", 1, "pci0000:ba")]
    return [
        Card(
            uuid=f"GPU-{i:08x}-1111-2222-3333-{i:012x}",
            minor=i,
            bus_id=_bus(bus),
            numa=numa,
            root=root,
            name="NVIDIA H100 80GB HBM3",
            ports=_switch_ports(switches),
            nvlink_version=4,
            pcie_switches=(f"sw{i // 2}",),
        )
        for i, (bus, numa, root) in enumerate(layout)
    ]


def a100_nvlink_pairs_cards() -> list[Card]:
    """8 x A100 80GB PCIe, each pair under one PCIe switch joined by three NVLink bridges
    (12 NVLink 3 links); two switches per socket; minors not in index order."""
    layout = [  # bus, numa, root, minor
        ("17", 0, "pci0000:16", 1),
        ("18", 0, "pci0000:16", 0),
        ("31", 0, "pci0000:30", 2),
        ("32", 0, "pci0000:30", 3),
        ("98", 1, "pci0000:97", 5),
        ("99", 1, "pci0000:97", 4),
        ("B1", 1, "pci0000:b0", 6),
        ("B2", 1, "pci0000:b0", 7),
    ]
    cards = []
    for i, (bus, numa, root, _minor) in enumerate(layout):
        peer = layout[i ^ 1][0]
        cards.append(
            Card(
                uuid=f"GPU-{i:08x}-4444-5555-6666-{i:012x}",
                minor=_minor,
                bus_id=_bus(bus),
                numa=numa,
                root=root,
                name="NVIDIA A100 80GB PCIe",
                ports=[Port(_bus(peer)) for _ in range(12)],
                pcie_switches=(f"sw{i // 2}",),
            )
        )
    return cards


def v100_cube_mesh_cards() -> list[Card]:
    """4 x V100 SXM2: one quad of the DGX-1 hybrid cube mesh (as in AWS p3.8xlarge): six
    NVLink 2 ports per card, 1 or 2 links to each peer, the ports towards the missing quad
    down; cards (0, 1) and (2, 3) under two PCIe switches behind one upper switch."""
    buses = ["15", "16", "3A", "3B"]
    links = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2}
    cards = []
    for i, bus in enumerate(buses):
        ports = [
            Port(_bus(buses[b if a == i else a]))
            for (a, b), n in links.items()
            if i in (a, b)
            for _ in range(n)
        ]
        ports += [Port(_bus("00"), active=False)] * (6 - len(ports))
        cards.append(
            Card(
                uuid=f"GPU-{i:08x}-7777-8888-9999-{i:012x}",
                minor=i,
                bus_id=_bus(bus),
                numa=0,
                root="pci0000:00",
                name="Tesla V100-SXM2-16GB",
                total=16 * 1024**3,
                ports=ports,
                nvlink_version=2,
                pcie_switches=("up0", f"sw{i // 2}"),
            )
        )
    return cards


def t4_pcie_cards() -> list[Card]:
    """4 x T4 (no NVLink): cards 0 and 1 under one PCIe switch on socket 0; cards 2 and 3
    straight on one root complex of socket 1."""
    layout = [("18", 0, "pci0000:17", ("sw0",)), ("19", 0, "pci0000:17", ("sw0",))]
    layout += [("86", 1, "pci0000:85", ()), ("87", 1, "pci0000:85", ())]
    return [
        Card(
            uuid=f"GPU-{i:08x}-aaaa-0000-1111-{i:012x}",
            minor=i,
            bus_id=_bus(bus),
            numa=numa,
            root=root,
            name="Tesla T4",
            total=15 * 1024**3,
            nvlink_supported=False,
            pcie_switches=switches,
        )
        for i, (bus, numa, root, switches) in enumerate(layout)
    ]


def nvml_error(code: int) -> pynvml.NVMLError:
    """The exception NVML raises for ``code`` (e.g. ``NVMLError_GpuIsLost``)."""
    return pynvml.NVMLError(code)


class FakeNvmlHost:
    """What NVML answers on the host; mutate ``cards`` and the flags to stage failures."""

    def __init__(self, cards: list[Card] | None = None, driver: str = DRIVER) -> None:
        self.cards = dgx_cards() if cards is None else cards
        self.driver = driver
        self.init_error: int | None = None  # e.g. NVML_ERROR_LIBRARY_NOT_FOUND
        self.event_set_error: int | None = None
        self.wait_error: int | None = None
        self.uuid_error_on_event = False
        self.remote_type_supported = True  # False: FUNCTION_NOT_FOUND, as on old drivers
        self.ancestor_error: int | None = None  # e.g. NVML_ERROR_NOT_SUPPORTED for every pair
        self.ancestor_level: int | None = None  # force this level for every pair
        self.calls: list[str] = []
        self.freed: list[Any] = []
        self.registered: list[tuple[int, int]] = []
        self._events: deque[tuple[int, int, int]] = deque()
        self._cond = threading.Condition()
        self.initialized = 0

    # -- staging ------------------------------------------------------------------------------

    def inject_event(
        self, index: int, xid: int, event_type: int = pynvml.nvmlEventTypeXidCriticalError
    ) -> None:
        with self._cond:
            self._events.append((index, xid, event_type))
            self._cond.notify_all()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvmlHost:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlSystemGetDriverVersion",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetMinorNumber",
            "nvmlDeviceGetName",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetProcessUtilization",
            "nvmlEventSetCreate",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait",
            "nvmlEventSetFree",
            "nvmlDeviceGetNvLinkState",
            "nvmlDeviceGetNvLinkRemotePciInfo",
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            "nvmlDeviceGetNvLinkVersion",
            "nvmlDeviceGetTopologyCommonAncestor",
            "nvmlDeviceGetMigMode",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    # -- helpers ------------------------------------------------------------------------------

    def _check_init(self) -> None:
        if not self.initialized:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    @staticmethod
    def handle(index: int) -> Any:
        return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + index), pynvml.c_nvmlDevice_t)

    def _card(self, handle: Any, fn: str) -> Card:
        self._check_init()
        self.calls.append(fn)
        value = ctypes.cast(handle, ctypes.c_void_p).value
        index = (value or 0) - _HANDLE_BASE
        if not 0 <= index < len(self.cards):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        card = self.cards[index]
        if card.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in card.failing:
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        return card

    # -- the pynvml functions -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.calls.append("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.cards):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.cards[index].lost_handle:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.handle(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._card(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._card(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._card(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        card = self._card(handle, "nvmlDeviceGetMemoryInfo")
        if not card.memory_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used, mem.free = card.total, card.used, card.total - card.used
        return mem

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        card = self._card(handle, "nvmlDeviceGetMigMode")
        if card.mig_mode is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [card.mig_mode, card.mig_mode]

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        card = self._card(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = card.bus_id.encode()
        info.busIdLegacy = card.bus_id[4:].encode()
        domain, bus, rest = card.bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        info.pciDeviceId = 0x20B210DE
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        card = self._card(handle, "nvmlDeviceGetUtilizationRates")
        if not card.util_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = card.util, card.util // 2
        return util

    def nvmlDeviceGetProcessUtilization(self, handle: Any, time_stamp: int) -> Any:
        """NVML's sample buffer: samples newer than ``time_stamp``; NOT_FOUND when none."""
        card = self._card(handle, "nvmlDeviceGetProcessUtilization")
        if not card.process_util_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        newer = [smp for smp in card.process_samples if smp[1] > time_stamp]
        if not newer:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, ts, sm in newer:
            rec = pynvml.c_nvmlProcessUtilizationSample_t()
            rec.pid, rec.timeStamp, rec.smUtil, rec.memUtil = pid, ts, sm, sm // 2
            out.append(rec)
        return out

    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        if self.event_set_error is not None:
            raise nvml_error(self.event_set_error)
        return pynvml.c_nvmlEventSet_t()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        card = self._card(handle, "nvmlDeviceRegisterEvents")
        if not card.events_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append((self.cards.index(card), event_types))

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._check_init()
        if self.wait_error is not None:
            raise nvml_error(self.wait_error)
        with self._cond:
            if not self._events:
                self._cond.wait(timeout_ms / 1000)
            if not self._events:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            index, xid, event_type = self._events.popleft()
        data = pynvml.c_nvmlEventData_t()
        data.device = self.handle(index)
        data.eventType = event_type
        data.eventData = xid
        data.gpuInstanceId = FULL_INSTANCE
        data.computeInstanceId = FULL_INSTANCE
        if self.uuid_error_on_event:
            self.cards[index].lost = True
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed.append(event_set)

    def _port(self, handle: Any, port: int, fn: str) -> Port:
        card = self._card(handle, fn)
        if not card.nvlink_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= port < len(card.ports):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return card.ports[port]

    def nvmlDeviceGetNvLinkState(self, handle: Any, port: int) -> int:
        p = self._port(handle, port, "nvmlDeviceGetNvLinkState")
        return pynvml.NVML_FEATURE_ENABLED if p.active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, port: int) -> Any:
        p = self._port(handle, port, "nvmlDeviceGetNvLinkRemotePciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = p.remote.encode()
        info.busIdLegacy = p.remote[4:].encode()
        info.pciDeviceId = NVSWITCH_PCI_ID if p.kind == "switch" else GPU_PCI_ID
        return info

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, port: int) -> int:
        if not self.remote_type_supported:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return REMOTE_TYPES[self._port(handle, port, "nvmlDeviceGetNvLinkRemoteDeviceType").kind]

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, port: int) -> int:
        self._port(handle, port, "nvmlDeviceGetNvLinkVersion")
        return self._card(handle, "nvmlDeviceGetNvLinkVersion").nvlink_version

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: Any, handle2: Any) -> int:
        a = self._card(handle1, "nvmlDeviceGetTopologyCommonAncestor")
        b = self._card(handle2, "nvmlDeviceGetTopologyCommonAncestor")
        if self.ancestor_error is not None:
            raise nvml_error(self.ancestor_error)
        if self.ancestor_level is not None:
            return self.ancestor_level
        if a.pcie_switches and a.pcie_switches[-1:] == b.pcie_switches[-1:]:
            return pynvml.NVML_TOPOLOGY_SINGLE
        if set(a.pcie_switches) & set(b.pcie_switches):
            return pynvml.NVML_TOPOLOGY_MULTIPLE
        if a.root == b.root:
            return pynvml.NVML_TOPOLOGY_HOSTBRIDGE
        if a.numa == b.numa:
            return pynvml.NVML_TOPOLOGY_NODE
        return pynvml.NVML_TOPOLOGY_SYSTEM


def make_sysfs(root: Path, cards: list[Card], numa_override: dict[str, str] | None = None) -> Path:
    """A sysfs tree for ``cards``: ``devices/<root>/<bridge>/<bus id>`` with ``numa_node``, and
    the kernel's relative symlink ``bus/pci/devices/<bus id>`` to it. Returns ``root``."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    for card in cards:
        bus = card.sysfs_bus_id
        domain = bus.split(":")[0]
        bridge = f"{domain}:{card.root.split(':')[1]}:01.0"
        target = root / "devices" / card.root / bridge / bus
        target.mkdir(parents=True, exist_ok=True)
        numa = (numa_override or {}).get(bus, str(card.numa))
        (target / "numa_node").write_text(f"{numa}\n")
        link = devices / bus
        if not link.exists():
            link.symlink_to(Path("..") / ".." / ".." / "devices" / card.root / bridge / bus)
    return root


class FakeMigHost:
    """MIG devices on a ``FakeNvmlHost``: ``migs`` maps a MIG UUID to its card's NVML index.

    ``install`` replaces the two pynvml functions ``NvmlLibrary.mig_parent`` uses.
    """

    _MIG_BASE = 0x8000

    def __init__(self, host: FakeNvmlHost, migs: dict[str, int]) -> None:
        self.host = host
        self.migs = migs
        self._by_handle: dict[int, int] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeMigHost:
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", self.nvmlDeviceGetHandleByUUID)
        monkeypatch.setattr(
            pynvml,
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            self.nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
        )
        return self

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self.host._check_init()
        if uuid not in self.migs:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        value = self._MIG_BASE + len(self._by_handle)
        self._by_handle[value] = self.migs[uuid]
        return ctypes.cast(ctypes.c_void_p(value), pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> Any:
        value = ctypes.cast(handle, ctypes.c_void_p).value or 0
        if value not in self._by_handle:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeNvmlHost.handle(self._by_handle[value])
