"""A fake sysfs tree of RDMA NICs for the koordlet discovery and runtime-hook tests.

Lays out what the kernel shows for an SR-IOV capable ConnectX NIC: the PCI device under its
root complex (``devices/pci<dom>:<bus>/...``) linked from ``bus/pci/devices/<bus id>``, its
``class``, ``numa_node``, ``sriov_numvfs``, ``virtfn<i>`` links to its VFs (each with
``physfn``), the RDMA device ``infiniband/mlx5_<n>`` and its verbs node
``infiniband_verbs/uverbs<k>`` (with ``class/infiniband_verbs/uverbs<k>/dev``), port states
under ``class/infiniband/<name>/ports``, and ``class/misc/rdma_cm/dev``.
"""

from __future__ import annotations

import os
from pathlib import Path

UVERBS_MAJOR = 231
RDMA_CM = (10, 58)


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._uverbs = 0
        self._write(root / "class" / "misc" / "rdma_cm" / "dev", f"{RDMA_CM[0]}:{RDMA_CM[1]}")

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def _pci(self, bus_id: str, root_complex: str, cls: str, numa: int) -> Path:
        real = self.root / "devices" / root_complex / bus_id
        real.mkdir(parents=True, exist_ok=True)
        self._write(real / "class", cls)
        self._write(real / "numa_node", str(numa))
        link = self.root / "bus" / "pci" / "devices" / bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(real, link.parent))
        return real

    def _rdma(self, dev: Path, ib_name: str) -> str:
        (dev / "infiniband" / ib_name).mkdir(parents=True, exist_ok=True)
        uverbs = f"uverbs{self._uverbs}"
        (dev / "infiniband_verbs" / uverbs).mkdir(parents=True, exist_ok=True)
        self._write(self.root / "class" / "infiniband_verbs" / uverbs / "dev",
                    f"{UVERBS_MAJOR}:{192 + self._uverbs}")
        self._uverbs += 1
        return uverbs

    def nic(self, bus_id: str, ib_index: int, *, numa: int = 0,
            root_complex: str = "pci0000:17", vfs: int = 0, state: str = "4: ACTIVE",
            ib_prefix: str = "mlx5") -> dict[str, str]:
        """A PF with ``vfs`` VFs; returns bus id -> its uverbs name (PF and VFs)."""
        dev = self._pci(bus_id, root_complex, "0x020000", numa)
        ib_name = f"{ib_prefix}_{ib_index}"
        out = {bus_id: self._rdma(dev, ib_name)}
        self._write(self.root / "class" / "infiniband" / ib_name / "ports" / "1" / "state", state)
        self._write(dev / "sriov_numvfs", str(vfs))
        domain, bus, rest = bus_id.split(":")
        for i in range(vfs):
            vf_bus = f"{domain}:{bus}:{int(rest.split('.')[0], 16):02x}.{i + 2}"
            vf = self._pci(vf_bus, root_complex, "0x020000", numa)
            (vf / "physfn").symlink_to(os.path.relpath(dev, vf))
            (dev / f"virtfn{i}").symlink_to(os.path.relpath(vf, dev))
            out[vf_bus] = self._rdma(vf, f"{ib_prefix}_{100 + ib_index * 10 + i}")
        return out

    def gpu(self, bus_id: str, numa: int = 0) -> None:
        self._pci(bus_id, "pci0000:3a", "0x030200", numa)
