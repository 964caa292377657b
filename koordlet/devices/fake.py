"""A ``DeviceLibrary`` described in YAML (``--fake-gpus FILE``): nodes without NVML, demos, tests.

Role: the second implementation of the port. The file lists the cards the way NVML and sysfs
would report them; an optional *health file* lets a test (or an operator rehearsing) flip
cards unhealthy, healthy again, or "lost" while the agent runs.

File format (every key but ``gpus[].uuid`` and ``gpus[].minor`` optional)::

    driverVersion: "535.129.03"
    healthFile: fake-gpus-health.yaml      # relative to this file
    gpus:
    - uuid: GPU-7c4f2a35-1b2e-4f59-9e0c-5b7a3c1d0e01
      minor: 0
      name: NVIDIA A100-SXM4-80GB          # NVML name
      memory: 80Gi                         # total, a quantity or bytes
      busID: "0000:07:00.0"
      numaNode: 0
      pcieRoot: pci0000:00
      memoryUsed: 1Gi                      # for metrics
      utilization: 0.25                    # 0.0 to 1.0, for metrics
      pcieSwitches: [sw0]                  # PCIe switches above the card, outermost first
      nvlink:                              # absent: no NVLink (as NVML's NOT_SUPPORTED)
        version: 3                         # NVLink version (1-5) -> per-link bandwidth
        peers: {1: 12}                     # peer GPU minor -> direct links
        switches: {nvswitch0: 2}           # NVSwitch name -> links

Topology (``Discovery.topology``, rules in ``koordlet.devices.interconnect``): NVLink from the
``nvlink`` blocks; the common ancestor of a pair as NVML would report it from the PCIe path:
the same last ``pcieSwitches`` entry -> Single, any shared switch -> Multiple, the same
``pcieRoot`` -> HostBridge, the same ``numaNode`` -> Node, both NUMA nodes known -> System,
else unknown. Examples of whole boxes: ``config/examples/fake-gpus-*.yaml``.
      processes: {4242: 0.5}               # pid -> SM utilization, per-process samples
      migDevices: [MIG-5d7a...]            # UUIDs of MIG devices on this card

Health file: a mapping from a card's uuid (or its minor, as a string) to
``{healthy: false, reason: Xid79, message: ..., lost: false}``; cards not listed are healthy;
a missing or empty file means all healthy. ``lost: true`` makes ``probe``/``usage`` fail as
for a card whose NVML handle went away. A file that cannot be parsed is logged and ignored.

Invariants: loading validates everything and raises ``FakeSpecError`` naming the field;
``wait_health_event`` polls the health file (every ``poll_interval_s``) and returns one event
per card whose health changed, in minor order.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import yaml

from apis.quantity import Quantity, QuantityError, int_value
from apis.topology import (
    ANCESTOR_HOSTBRIDGE,
    ANCESTOR_MULTIPLE,
    ANCESTOR_NODE,
    ANCESTOR_SINGLE,
    ANCESTOR_SYSTEM,
    GPUTopology,
)
from apis.yamlload import load_one
from koordlet.devices.interconnect import CardLinks, build_topology
from koordlet.devices.library import (
    GPU,
    HEALTHY,
    DeviceQueryError,
    Discovery,
    GPUUsage,
    Health,
    HealthEvent,
    ProcessSample,
    query_failed,
)

__all__ = [
    "FakeGPU",
    "FakeLibrary",
    "FakeSpec",
    "FakeSpecError",
    "load_fake_spec",
    "parse_fake_spec",
]

log = structlog.get_logger("koordlet.fake")

_DEFAULT_UNHEALTHY: Final = Health(False, "FakeUnhealthy", "marked unhealthy in the health file")
_LOST_ERROR: Final = "GPU is lost"


class FakeSpecError(ValueError):
    """A fake-GPU file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class FakeGPU:
    """A described card: its discovery record plus the live numbers metrics read."""

    gpu: GPU
    memory_used: int = 0
    utilization: float | None = None
    pcie_switches: tuple[str, ...] = ()
    nvlink: CardLinks | None = None
    processes: Mapping[int, float] = field(default_factory=dict)
    mig_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FakeSpec:
    """A parsed fake-GPU file."""

    driver_version: str
    gpus: tuple[FakeGPU, ...]
    health_file: Path | None = None

    def topology(self) -> GPUTopology:
        """The cards' interconnect (see the module docstring)."""
        ancestors = {
            (a.gpu.minor, b.gpu.minor): level
            for i, a in enumerate(self.gpus)
            for b in self.gpus[i + 1 :]
            if (level := _ancestor(a, b))
        }
        cards = {g.gpu.minor: g.nvlink for g in self.gpus if g.nvlink is not None}
        return build_topology((g.gpu.minor for g in self.gpus), cards, ancestors)


def _ancestor(a: FakeGPU, b: FakeGPU) -> str:
    if a.pcie_switches and b.pcie_switches and a.pcie_switches[-1] == b.pcie_switches[-1]:
        return ANCESTOR_SINGLE
    if set(a.pcie_switches) & set(b.pcie_switches):
        return ANCESTOR_MULTIPLE
    if a.gpu.pcie_root and a.gpu.pcie_root == b.gpu.pcie_root:
        return ANCESTOR_HOSTBRIDGE
    if a.gpu.numa_node is None or b.gpu.numa_node is None:
        return ""
    return ANCESTOR_NODE if a.gpu.numa_node == b.gpu.numa_node else ANCESTOR_SYSTEM


def _fail(path: str, reason: str) -> FakeSpecError:
    return FakeSpecError(f"{path}: {reason}")


def _opt_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    v = obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str | int | float) or isinstance(v, bool):
        raise _fail(f"{path}.{key}", f"expected a string, got {type(v).__name__}")
    return str(v)


def _int(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> int | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise _fail(f"{path}.{key}", "required")
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(f"{path}.{key}", f"expected an integer, got {v!r}")
    return v


def _bytes(obj: Mapping[str, Any], key: str, path: str) -> int:
    v = obj.get(key)
    if v is None:
        return 0
    try:
        if isinstance(v, bool):
            raise QuantityError(v)
        n = int_value(Quantity.parse(v if isinstance(v, int | float) else str(v)))
    except QuantityError as exc:
        raise _fail(f"{path}.{key}", str(exc)) from None
    if n < 0:
        raise _fail(f"{path}.{key}", f"must not be negative, got {v!r}")
    return n


def _gpu(obj: object, index: int) -> FakeGPU:
    path = f"gpus[{index}]"
    if not isinstance(obj, Mapping):
        raise _fail(path, "expected a mapping")
    uuid = _opt_str(obj, "uuid", path)
    if not uuid:
        raise _fail(f"{path}.uuid", "required")
    minor = _int(obj, "minor", path, required=True)
    assert minor is not None
    if minor < 0:
        raise _fail(f"{path}.minor", f"must not be negative, got {minor}")
    utilization = obj.get("utilization")
    if utilization is not None and (
        isinstance(utilization, bool)
        or not isinstance(utilization, int | float)
        or not 0 <= utilization <= 1
    ):
        raise _fail(f"{path}.utilization", f"expected a number from 0 to 1, got {utilization!r}")
    gpu = GPU(
        uuid=uuid,
        minor=minor,
        name=_opt_str(obj, "name", path),
        memory_total=_bytes(obj, "memory", path),
        bus_id=_opt_str(obj, "busID", path).lower(),
        numa_node=_int(obj, "numaNode", path),
        pcie_root=_opt_str(obj, "pcieRoot", path),
        index=index,
    )
    migs = obj.get("migDevices") or []
    if not isinstance(migs, list) or not all(isinstance(m, str) and m for m in migs):
        raise _fail(f"{path}.migDevices", "expected a list of MIG device UUIDs")
    return FakeGPU(
        gpu=gpu,
        memory_used=_bytes(obj, "memoryUsed", path),
        utilization=None if utilization is None else float(utilization),
        pcie_switches=_names(obj.get("pcieSwitches"), f"{path}.pcieSwitches"),
        nvlink=_nvlink(obj.get("nvlink"), minor, f"{path}.nvlink"),
        processes=_processes(obj.get("processes"), f"{path}.processes"),
        mig_devices=tuple(migs),
    )


def _names(v: object, path: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(n, str) and n for n in v):
        raise _fail(path, f"expected a list of names, got {v!r}")
    return tuple(v)


def _link_counts(v: object, path: str, key: Callable[[object], Any]) -> dict[Any, int]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise _fail(path, f"expected a mapping, got {v!r}")
    out: dict[Any, int] = {}
    for k, n in v.items():
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise _fail(f"{path}[{k!r}]", f"expected a positive number of links, got {n!r}")
        try:
            out[key(k)] = n
        except ValueError as exc:
            raise _fail(path, str(exc)) from None
    return out


def _peer(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"expected a GPU minor, got {k!r}")
    return k


def _nvlink(v: object, minor: int, path: str) -> CardLinks | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise _fail(path, "expected a mapping")
    peers = _link_counts(v.get("peers"), f"{path}.peers", _peer)
    if minor in peers:
        raise _fail(f"{path}.peers", f"a card cannot link to itself ({minor})")
    version = _int(v, "version", path)
    if version is not None and version <= 0:
        raise _fail(f"{path}.version", f"must be positive, got {version}")
    return CardLinks(
        minor=minor,
        peers=peers,
        switches=_link_counts(v.get("switches"), f"{path}.switches", str),
        version=version,
    )


def _processes(v: object, path: str) -> dict[int, float]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise _fail(path, "expected a mapping from pid to utilization")
    out: dict[int, float] = {}
    for pid, util in v.items():
        ok_pid = isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
        ok_util = isinstance(util, int | float) and not isinstance(util, bool) and 0 <= util <= 1
        if not (ok_pid and ok_util):
            raise _fail(f"{path}[{pid!r}]", f"expected pid > 0 -> 0..1, got {util!r}")
        out[int(pid)] = float(util)
    return out


def parse_fake_spec(doc: object, base_dir: Path, source: str = "<fake gpus>") -> FakeSpec:
    """Validate a loaded YAML document; raises ``FakeSpecError``."""
    try:
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise _fail("<root>", "expected a mapping with a `gpus` list")
        raw = doc.get("gpus") or []
        if not isinstance(raw, list):
            raise _fail("gpus", "expected a list")
        gpus = tuple(_gpu(g, i) for i, g in enumerate(raw))
        seen_uuid: set[str] = set()
        seen_minor: set[int] = set()
        for i, g in enumerate(gpus):
            if g.gpu.uuid in seen_uuid:
                raise _fail(f"gpus[{i}].uuid", f"duplicate {g.gpu.uuid!r}")
            if g.gpu.minor in seen_minor:
                raise _fail(f"gpus[{i}].minor", f"duplicate {g.gpu.minor}")
            seen_uuid.add(g.gpu.uuid)
            seen_minor.add(g.gpu.minor)
        for i, g in enumerate(gpus):
            for peer in g.nvlink.peers if g.nvlink is not None else ():
                if peer not in seen_minor:
                    raise _fail(f"gpus[{i}].nvlink.peers", f"no gpu with minor {peer}")
        health_file = _opt_str(doc, "healthFile", "")
        return FakeSpec(
            driver_version=_opt_str(doc, "driverVersion", ""),
            gpus=tuple(sorted(gpus, key=lambda g: g.gpu.minor)),
            health_file=(base_dir / health_file) if health_file else None,
        )
    except FakeSpecError as exc:
        raise FakeSpecError(f"{source}: {exc}") from None


def load_fake_spec(path: str | os.PathLike[str]) -> FakeSpec:
    """Read and validate a fake-GPU file; raises ``FakeSpecError`` (also for I/O errors)."""
    p = Path(path)
    try:
        doc = load_one(p.read_text())
    except OSError as exc:
        raise FakeSpecError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise FakeSpecError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise FakeSpecError(f"{p}: invalid YAML: {exc}") from None
    return parse_fake_spec(doc, p.parent, str(p))


@dataclass(frozen=True, slots=True)
class _CardState:
    health: Health = HEALTHY
    lost: bool = False


def _card_state(entry: object) -> _CardState:
    if entry is None or entry is False:
        return _CardState(_DEFAULT_UNHEALTHY)
    if not isinstance(entry, Mapping):
        raise ValueError(f"expected a mapping, got {entry!r}")
    healthy = bool(entry.get("healthy", False))
    lost = bool(entry.get("lost", False))
    if healthy:
        return _CardState(HEALTHY, lost)
    return _CardState(
        Health(
            False,
            str(entry.get("reason") or _DEFAULT_UNHEALTHY.reason),
            str(entry.get("message") or _DEFAULT_UNHEALTHY.message),
        ),
        lost,
    )


class FakeLibrary:
    """The port over a ``FakeSpec``; see the module docstring."""

    def __init__(
        self,
        spec: FakeSpec,
        *,
        poll_interval_s: float = 0.1,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._spec = spec
        self._by_uuid = {g.gpu.uuid: g for g in spec.gpus}
        self._mig_parents = {m: g.gpu.uuid for g in spec.gpus for m in g.mig_devices}
        self._poll_interval_s = poll_interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reported: dict[str, Health] = {g.gpu.uuid: HEALTHY for g in spec.gpus}
        self._pending: deque[HealthEvent] = deque()
        self._subscribed = False

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, poll_interval_s: float = 0.1
    ) -> FakeLibrary:
        """Load and validate ``path``; raises ``FakeSpecError``."""
        return cls(load_fake_spec(path), poll_interval_s=poll_interval_s)

    def init(self) -> bool:
        return True

    def shutdown(self) -> None:
        self.close_health_events()

    def _read_states(self) -> dict[str, _CardState] | None:
        """The health file per uuid; None when it cannot be parsed (logged)."""
        states = {uuid: _CardState() for uuid in self._by_uuid}
        path = self._spec.health_file
        if path is None:
            return states
        try:
            doc = load_one(path.read_text())
        except FileNotFoundError:
            return states
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            log.warning("fake gpu health file ignored", path=str(path), error=str(exc))
            return None
        if doc is None:
            return states
        by_minor = {str(g.gpu.minor): g.gpu.uuid for g in self._spec.gpus}
        try:
            if not isinstance(doc, Mapping):
                raise ValueError("expected a mapping of uuid or minor to a health entry")
            for key, entry in doc.items():
                uuid = str(key) if str(key) in self._by_uuid else by_minor.get(str(key))
                if uuid is None:
                    raise ValueError(f"unknown card {key!r}")
                states[uuid] = _card_state(entry)
        except ValueError as exc:
            log.warning("fake gpu health file ignored", path=str(path), error=str(exc))
            return None
        return states

    def discover(self) -> Discovery:
        states = self._read_states() or {}
        health = {u: s.health for u, s in states.items() if not s.health.healthy}
        with self._lock:
            self._reported.update(health)
        return Discovery(
            driver_version=self._spec.driver_version,
            gpus=tuple(g.gpu for g in self._spec.gpus),
            health=health,
            topology=self._spec.topology(),
        )

    def _lost(self, gpu: GPU) -> bool:
        states = self._read_states()
        return gpu.uuid not in self._by_uuid or bool(states and states[gpu.uuid].lost)

    def probe(self, gpu: GPU) -> Health:
        if self._lost(gpu):
            return query_failed("NVML query", _LOST_ERROR)
        return HEALTHY

    def usage(self, gpu: GPU) -> GPUUsage:
        if self._lost(gpu):
            raise DeviceQueryError(f"{gpu.uuid}: {_LOST_ERROR}")
        fake = self._by_uuid[gpu.uuid]
        return GPUUsage(memory_used=fake.memory_used, utilization=fake.utilization)

    def process_utilization(self, gpu: GPU, since_us: int) -> tuple[ProcessSample, ...]:
        if self._lost(gpu):
            raise DeviceQueryError(f"{gpu.uuid}: {_LOST_ERROR}")
        now_us = max(since_us + 1, int(time.time() * 1e6))
        procs = self._by_uuid[gpu.uuid].processes
        return tuple(ProcessSample(pid, now_us, util) for pid, util in sorted(procs.items()))

    def open_health_events(self, gpus: tuple[GPU, ...]) -> bool:
        self._stop.clear()
        self._subscribed = True
        return True

    def _poll(self) -> None:
        states = self._read_states()
        if states is None:
            return
        with self._lock:
            for g in self._spec.gpus:
                health = states[g.gpu.uuid].health
                if self._reported.get(g.gpu.uuid) != health:
                    self._reported[g.gpu.uuid] = health
                    self._pending.append(HealthEvent(g.gpu.uuid, health))

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        deadline = self._monotonic() + timeout_s
        while True:
            if self._subscribed:
                self._poll()
            with self._lock:
                if self._pending:
                    return self._pending.popleft()
            remaining = deadline - self._monotonic()
            if remaining <= 0 or self._stop.wait(min(self._poll_interval_s, remaining)):
                return None

    def close_health_events(self) -> None:
        self._subscribed = False
        self._stop.set()

    def mig_parent(self, mig_uuid: str) -> str | None:
        return self._mig_parents.get(mig_uuid)
