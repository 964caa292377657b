"""PCI topology of a device from sysfs: bus id normalization, NUMA node, PCIe root complex.

Role: the filesystem half of GPU discovery, under an injectable sysfs root so that tests run
on a temporary tree.

Invariants (following Koordinator's ``koordlet/util/helper`` and the kernel's sysfs layout):

- Bus ids are sysfs names: lower case, a 4-digit domain (more when the domain needs it),
  ``dddd:bb:dd.f``. NVML's 8-digit-domain form ``00000000:3B:00.0`` normalizes to
  ``0000:3b:00.0``.
- The NUMA node is ``<sysfs>/bus/pci/devices/<bus id>/numa_node``; the kernel's ``-1`` ("no
  NUMA affinity") reads as node 0, as Koordinator reports it; a missing or unreadable file
  reads as None (unknown).
- The PCIe root is the ``pciDDDD:BB`` component of the device's resolved sysfs path
  (``/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0`` -> ``pci0000:3a``), "" when unknown.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_SYSFS_ROOT", "normalize_bus_id", "numa_node", "pcie_root"]

DEFAULT_SYSFS_ROOT: Final = "/sys"

_BUS_ID: Final = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})\.(?P<fn>[0-7])$"
)
_PCIE_ROOT: Final = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")


def normalize_bus_id(bus_id: str) -> str:
    """A PCI address in sysfs form; "" when ``bus_id`` is not a PCI address."""
    m = _BUS_ID.match(bus_id.strip().lower())
    if m is None:
        return ""
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{m['bus']}:{m['dev']}.{m['fn']}"


def _device_dir(sysfs_root: str | os.PathLike[str], bus_id: str) -> Path:
    return Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id


def numa_node(sysfs_root: str | os.PathLike[str], bus_id: str) -> int | None:
    """The device's NUMA node (``-1`` reads as 0), or None when sysfs does not say."""
    if not bus_id:
        return None
    try:
        text = (_device_dir(sysfs_root, bus_id) / "numa_node").read_text()
        node = int(text.strip())
    except (OSError, ValueError):
        return None
    return 0 if node == -1 else node


def pcie_root(sysfs_root: str | os.PathLike[str], bus_id: str) -> str:
    """The ``pciDDDD:BB`` root complex above the device, or "" when unknown."""
    if not bus_id:
        return ""
    path = _device_dir(sysfs_root, bus_id)
    if not path.exists():
        return ""
    try:
        resolved = Path(os.path.realpath(path))
    except OSError:
        return ""
    for part in resolved.parts:
        if _PCIE_ROOT.match(part):
            return part
    return ""
