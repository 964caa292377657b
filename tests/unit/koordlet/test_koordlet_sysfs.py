"""koordlet.devices.sysfs: bus id normalization, NUMA node and PCIe root from a temporary tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.devices.sysfs import normalize_bus_id, numa_node, pcie_root
from tests.unit.koordlet.fake_nvml import Card, make_sysfs


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml-8-digit-domain"),
        pytest.param("0000:3B:00.0", "0000:3b:00.0", id="nvml-legacy"),
        pytest.param("0000:3b:00.0", "0000:3b:00.0", id="sysfs-form"),
        pytest.param("3b:00.0", "0000:3b:00.0", id="no-domain"),
        pytest.param("00010000:01:00.1", "10000:01:00.1", id="vmd-domain"),
        pytest.param(" 0000:af:1f.7\n", "0000:af:1f.7", id="blanks"),
        pytest.param("", "", id="empty"),
        pytest.param("GPU-1234", "", id="not-pci"),
        pytest.param("0000:3b:00.8", "", id="bad-function"),
    ],
)
def test_normalize_bus_id(given: str, expected: str) -> None:
    assert normalize_bus_id(given) == expected


def _card(bus: str, numa: int, root: str) -> Card:
    return Card(uuid="GPU-x", minor=0, bus_id=f"00000000:{bus}:00.0", numa=numa, root=root)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    cards = [
        _card("3B", 0, "pci0000:3a"),
        _card("86", 1, "pci0000:85"),
        _card("AF", -1, "pci0000:ae"),
    ]
    root = make_sysfs(tmp_path / "sys", cards, numa_override={"0000:af:00.0": "-1"})
    (root / "bus/pci/devices/0000:d8:00.0").mkdir()  # a device with no numa_node, no pci root
    garbage = root / "devices/pci0000:c0/0000:c1:00.0"
    garbage.mkdir(parents=True)
    (garbage / "numa_node").write_text("not a number\n")
    (root / "bus/pci/devices/0000:c1:00.0").symlink_to(garbage)
    return root


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        pytest.param("0000:3b:00.0", 0, id="node-0"),
        pytest.param("0000:86:00.0", 1, id="node-1"),
        pytest.param("0000:af:00.0", 0, id="minus-1-reads-as-0"),
        pytest.param("0000:d8:00.0", None, id="no-file"),
        pytest.param("0000:c1:00.0", None, id="garbage"),
        pytest.param("0000:01:00.0", None, id="no-device"),
        pytest.param("", None, id="no-bus-id"),
    ],
)
def test_numa_node(sysfs: Path, bus_id: str, expected: int | None) -> None:
    assert numa_node(sysfs, bus_id) == expected


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        pytest.param("0000:3b:00.0", "pci0000:3a", id="behind-a-bridge"),
        pytest.param("0000:86:00.0", "pci0000:85", id="second-socket"),
        pytest.param("0000:c1:00.0", "pci0000:c0", id="absolute-link"),
        pytest.param("0000:d8:00.0", "", id="no-pci-component"),
        pytest.param("0000:01:00.0", "", id="no-device"),
        pytest.param("", "", id="no-bus-id"),
    ],
)
def test_pcie_root(sysfs: Path, bus_id: str, expected: str) -> None:
    assert pcie_root(sysfs, bus_id) == expected
