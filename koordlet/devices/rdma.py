"""RDMA NICs and their SR-IOV virtual functions from sysfs, and their Device CR entries.

Role: the node side of RDMA, as Koordinator's koordlet does it
(``metricsadvisor/devices/rdma/collector_rdma_linux.go``, ``util/system/rdma.go``,
``util/system/sriov.go``, ``statesinformer/impl/states_device_linux.go: buildRDMADevice``),
under an injectable sysfs root so that tests run on a temporary tree:

- a NIC is a PCI device (``<root>/bus/pci/devices/<bus id>``) of class network (``class``
  ``0x02....``) that is not itself a VF (no ``physfn``) and has an RDMA device
  (``infiniband/<name>``; several: the lowest name, the PF's, is the NIC's);
- its minor is ``N`` of that name ``mlx<k>_<N>``; a NIC whose name does not read so, or whose
  NUMA node sysfs does not give, is skipped (Koordinator logs and skips it too);
- healthy when it has ports and every ``<root>/class/infiniband/<name>/ports/*/state`` says
  ``ACTIVE``;
- its VFs (when ``sriov_numvfs`` > 0): the ``virtfn<i>`` links, resolved to bus ids.

The CR entry (``rdma_device_info``): ``id`` and ``topology.busID`` the NIC's bus id,
``koordinator.sh/rdma: 100``, ``topology {socketID: -1, nodeID, pcieID}``, and one VF group
without labels listing every VF with ``minor: -1``, sorted by bus id.

Invariants: discovery never raises for what it finds on disk (unreadable entries are skipped);
the result is sorted by minor.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from apis.device import DeviceInfo, DeviceTopology, VirtualFunction, VirtualFunctionGroup
from apis.quantity import DECIMAL_SI, Quantity
from apis.resources import DEVICE_RDMA, RDMA
from koordlet.devices import sysfs

__all__ = ["NIC", "discover_rdma", "rdma_device_info"]

_IB_NAME: Final = re.compile(r"^mlx\d+_(\d+)$")
_NET_CLASS: Final = 0x02
_ACTIVE: Final = "ACTIVE"


@dataclass(frozen=True, slots=True)
class NIC:
    """An RDMA NIC (the PF) as discovered."""

    bus_id: str
    minor: int
    healthy: bool
    numa_node: int
    pcie_root: str
    vfs: tuple[str, ...] = ()
    """The bus ids of its SR-IOV VFs (``virtfn0``, ``virtfn1``... order)."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _is_network(dev: Path) -> bool:
    text = _read(dev / "class")
    try:
        return text is not None and int(text, 16) >> 16 == _NET_CLASS
    except ValueError:
        return False


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _healthy(root: Path, ib_name: str) -> bool:
    ports = root / "class" / "infiniband" / ib_name / "ports"
    names = _listdir(ports)
    if not names:
        return False
    return all(_ACTIVE in (_read(ports / p / "state") or "") for p in names)


def _vfs(dev: Path) -> tuple[str, ...]:
    try:
        configured = int(_read(dev / "sriov_numvfs") or "0")
    except ValueError:
        configured = 0
    if configured <= 0:
        return ()
    links = []
    for name in _listdir(dev):
        number = name.removeprefix("virtfn")
        if name.startswith("virtfn") and number.isdigit() and (dev / name).is_symlink():
            links.append((int(number), Path(os.path.realpath(dev / name)).name))
    return tuple(bus for _, bus in sorted(links))


def discover_rdma(sysfs_root: str | os.PathLike[str] = sysfs.DEFAULT_SYSFS_ROOT) -> tuple[NIC, ...]:
    """The node's RDMA NICs (see the module docstring), sorted by minor."""
    root = Path(sysfs_root)
    devices = root / "bus" / "pci" / "devices"
    nics: list[NIC] = []
    for bus_id in _listdir(devices):
        dev = devices / bus_id
        if not _is_network(dev) or (dev / "physfn").exists():
            continue
        ib_names = _listdir(dev / "infiniband")
        if not ib_names:
            continue
        m = _IB_NAME.match(ib_names[0])
        numa = sysfs.numa_node(root, bus_id)
        if m is None or numa is None:
            continue
        nics.append(NIC(
            bus_id=bus_id,
            minor=int(m.group(1)),
            healthy=_healthy(root, ib_names[0]),
            numa_node=numa,
            pcie_root=sysfs.pcie_root(root, bus_id),
            vfs=_vfs(dev),
        ))
    nics.sort(key=lambda n: (n.minor, n.bus_id))
    return tuple(nics)


def rdma_device_info(nic: NIC) -> DeviceInfo:
    """The NIC's ``spec.devices`` entry, as Koordinator's ``buildRDMADevice`` writes it."""
    groups: tuple[VirtualFunctionGroup, ...] = ()
    if nic.vfs:
        vfs = tuple(VirtualFunction(minor=-1, bus_id=b) for b in sorted(nic.vfs))
        groups = (VirtualFunctionGroup(vfs=vfs),)
    return DeviceInfo(
        type=DEVICE_RDMA,
        id=nic.bus_id,
        minor=nic.minor,
        health=nic.healthy,
        resources={RDMA: Quantity.of(100, DECIMAL_SI)},
        topology=DeviceTopology(
            socket_id=-1, node_id=nic.numa_node, pcie_id=nic.pcie_root, bus_id=nic.bus_id
        ),
        vf_groups=groups,
    )
