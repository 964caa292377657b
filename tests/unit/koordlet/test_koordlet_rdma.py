"""RDMA NIC discovery from a fake sysfs tree and the Device CR entries it yields (Koordinator's
koordlet: rdma collector, sriov helpers, ``buildRDMADevice``)."""

from __future__ import annotations

from pathlib import Path

from apis.device import Device
from koordlet.devices.rdma import NIC, discover_rdma, rdma_device_info
from koordlet.reporting.reporter import Inventory, desired_device, node_extended_resources
from tests.fake_sysfs import FakeSysfs


def _tree(tmp_path: Path) -> FakeSysfs:
    fs = FakeSysfs(tmp_path)
    fs.nic("0000:18:00.0", 0, numa=1, root_complex="pci0000:17", vfs=2)
    fs.nic("0000:5e:00.0", 1, numa=-1, root_complex="pci0000:5d", state="1: DOWN")
    fs.gpu("0000:3b:00.0")
    fs.nic("0000:af:00.0", 2, ib_prefix="bnxt_re")  # not an mlx<k>_<n> name: skipped
    return fs


def test_discovers_pfs_with_vfs_numa_pcie_and_health(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert discover_rdma(tmp_path) == (
        NIC("0000:18:00.0", 0, True, 1, "pci0000:17", ("0000:18:00.2", "0000:18:00.3")),
        NIC("0000:5e:00.0", 1, False, 0, "pci0000:5d", ()),
    )


def test_no_sysfs_no_nics(tmp_path: Path) -> None:
    assert discover_rdma(tmp_path / "absent") == ()


def test_device_cr_entry_is_koordinators(tmp_path: Path) -> None:
    _tree(tmp_path)
    entry = rdma_device_info(discover_rdma(tmp_path)[0]).to_dict()
    assert entry == {
        "type": "rdma",
        "id": "0000:18:00.0",
        "minor": 0,
        "health": True,
        "resources": {"koordinator.sh/rdma": "100"},
        "topology": {"socketID": -1, "nodeID": 1, "pcieID": "pci0000:17",
                     "busID": "0000:18:00.0"},
        "vfGroups": [{"vfs": [{"minor": -1, "busID": "0000:18:00.2"},
                              {"minor": -1, "busID": "0000:18:00.3"}]}],
    }


def test_reported_in_the_device_cr_after_the_gpus_and_advertised(tmp_path: Path) -> None:
    _tree(tmp_path)
    device = desired_device("n", Inventory(nics=discover_rdma(tmp_path)), now="t")
    assert [(d.type, d.minor) for d in device.devices] == [("rdma", 0), ("rdma", 1)]
    assert Device.from_dict(device.to_dict()) == device  # round trip through the wire form
    # Only healthy NICs count towards the Node's koordinator.sh/rdma.
    assert {k: q.canonical() for k, q in node_extended_resources(device).items()} == {
        "koordinator.sh/rdma": "100"}
