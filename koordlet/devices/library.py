"""The ``DeviceLibrary`` port: what the node agent needs from a GPU management library.

Role: the contract between the agent (reporter, health watcher, metrics) and a source of GPU
facts: NVML on a real node (``koordlet.devices.nvml``), a YAML description otherwise
(``koordlet.devices.fake``). Also the records that cross that boundary.

Invariants:

- Records are frozen; ``GPU.uuid`` identifies a card everywhere (health, metrics, the CR).
- ``discover()`` never raises for what it cannot read: a card that cannot be identified is
  left out, a topology query that fails leaves those pairs out (``Discovery.topology``).
- ``init()`` returning False means "this node has no such library": the agent then reports
  no devices and keeps running. Every other method is called only after ``init()`` returned
  True and before ``shutdown()``.
- ``probe`` and ``usage`` never raise for a card that cannot be read: ``probe`` reports it as
  unhealthy (reason ``DeviceQueryFailed``), ``usage`` raises ``DeviceQueryError`` (the one
  exception of the port) so that a scrape can skip the card.
- ``mig_parent`` resolves a MIG device UUID (a device plugin's id for a MIG slice) to the
  UUID of its parent card; it never raises (None: no such MIG device, or no MIG support).
- ``wait_health_event`` blocks at most ``timeout_s`` and returns None on a timeout or an
  event that does not change health (for example an application XID); a ``HealthEvent`` with
  ``uuid == ""`` applies to every card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from apis.device import gpu_model_name
from apis.topology import GPUTopology

__all__ = [
    "GPU",
    "HEALTHY",
    "MIG_ENABLED",
    "REASON_HEALTHY",
    "REASON_MIG_ENABLED",
    "REASON_QUERY_FAILED",
    "DeviceLibrary",
    "DeviceQueryError",
    "Discovery",
    "GPUUsage",
    "Health",
    "HealthEvent",
    "ProcessSample",
    "query_failed",
]

REASON_HEALTHY: Final = "DeviceHealthy"
REASON_QUERY_FAILED: Final = "DeviceQueryFailed"
REASON_MIG_ENABLED: Final = "MIGEnabled"
"""A card in MIG mode: split into MIG devices (served by NVIDIA's device plugin), never
offered whole; reported unhealthy so that the scheduler gives it zero capacity."""


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU card as discovered: identity, size and place on the PCI tree."""

    uuid: str
    minor: int
    name: str = ""
    memory_total: int = 0
    bus_id: str = ""
    numa_node: int | None = None
    pcie_root: str = ""
    index: int = 0

    @property
    def model(self) -> str:
        """The label value of the model (SPEC section 4), e.g. ``A100-SXM4-80GB``."""
        return gpu_model_name(self.name)


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """Live numbers of one card, read at scrape time."""

    memory_used: int
    utilization: float | None
    """Fraction of the last sample period the card was busy (0.0 to 1.0); None if unknown."""


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One NVML per-process utilization sample of a card."""

    pid: int
    timestamp_us: int
    """When the driver took it (microseconds, the driver's clock; pass the newest back)."""
    sm_util: float
    """Fraction of the sample period the process's kernels kept the SMs busy (0.0 to 1.0)."""


@dataclass(frozen=True, slots=True)
class Health:
    """A card's health; ``reason`` and ``message`` go to the Device CR's Healthy condition."""

    healthy: bool
    reason: str
    message: str


HEALTHY: Final = Health(True, REASON_HEALTHY, "device is healthy")


MIG_ENABLED: Final = Health(
    False,
    REASON_MIG_ENABLED,
    "MIG mode is enabled: the card is split into MIG devices and is not scheduled as a whole "
    "(its MIG devices are served by NVIDIA's device plugin, nvidia.com/mig-<profile>)",
)


def query_failed(what: str, error: object) -> Health:
    """The health of a card that a library query failed on."""
    return Health(False, REASON_QUERY_FAILED, f"{what} failed: {error}")


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A health change reported by the library; ``uuid == ""`` means every card."""

    uuid: str
    health: Health


@dataclass(frozen=True, slots=True)
class Discovery:
    """What ``discover()`` found: the driver, the cards, cards already found unhealthy, and
    how the cards are connected (NVLink, NVSwitch, PCIe levels; keyed by minor, static for the
    agent's life; empty when the library cannot tell)."""

    driver_version: str = ""
    gpus: tuple[GPU, ...] = ()
    health: Mapping[str, Health] = field(default_factory=dict)
    topology: GPUTopology = field(default_factory=GPUTopology)


class DeviceQueryError(Exception):
    """A card could not be read (lost handle, driver error)."""


class DeviceLibrary(Protocol):
    """The GPU management library as the agent uses it (see the module docstring)."""

    def init(self) -> bool:
        """Open the library; False when it is absent on this node (logged once)."""
        ...

    def shutdown(self) -> None:
        """Close the library; idempotent."""
        ...

    def discover(self) -> Discovery:
        """Driver version and every card that can be identified (uuid and minor)."""
        ...

    def probe(self, gpu: GPU) -> Health:
        """Whether the card can still be read: HEALTHY, or a ``DeviceQueryFailed`` health."""
        ...

    def usage(self, gpu: GPU) -> GPUUsage:
        """Used memory and utilization now; raises ``DeviceQueryError``."""
        ...

    def process_utilization(self, gpu: GPU, since_us: int) -> tuple[ProcessSample, ...]:
        """Per-process samples newer than ``since_us`` (() when none or unsupported, logged
        once); raises ``DeviceQueryError`` when the card cannot be read."""
        ...

    def open_health_events(self, gpus: tuple[GPU, ...]) -> bool:
        """Subscribe to health events of ``gpus``; False when unsupported (logged)."""
        ...

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        """The next health event, or None after ``timeout_s`` or for an ignored event."""
        ...

    def close_health_events(self) -> None:
        """Drop the subscription; idempotent."""
        ...

    def mig_parent(self, mig_uuid: str) -> str | None:
        """The UUID of the GPU a MIG device (``MIG-...``) lives on; None when unknown."""
        ...
