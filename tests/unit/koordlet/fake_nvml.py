"""A fake NVML host at the ``pynvml`` FUNCTION level, and a sysfs tree to go with it.

``FakeNvmlHost.install(monkeypatch)`` replaces the ``pynvml`` module functions that
``koordlet.devices.nvml`` calls, so the real adapter code runs against what a real 8-GPU host
(two sockets, four PCIe root complexes, minors not in index order) would answer, with NVML's
real record types (``nvmlPciInfo_t``, ``c_nvmlMemory_t``, ``c_nvmlUtilization_t``,
``c_nvmlEventData_t``, ``c_nvmlDevice_t`` handles) and NVML's real exception classes
(``pynvml.NVMLError(code)`` builds the ``NVMLError_<Name>`` subclass, as ``_nvmlCheckReturn``
does).
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
            "nvmlEventSetCreate",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait",
            "nvmlEventSetFree",
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
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used, mem.free = card.total, card.used, card.total - card.used
        return mem

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
