"""koordlet.devices.fake: the YAML file, validation errors, and the health file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.topology import connectivity, ring_bandwidth
from koordlet.devices.fake import FakeLibrary, FakeSpecError, load_fake_spec, parse_fake_spec
from koordlet.devices.library import (
    GPU,
    HEALTHY,
    REASON_QUERY_FAILED,
    DeviceQueryError,
    GPUUsage,
    Health,
    HealthEvent,
)
from tests.unit.koordlet.topology_boxes import BOXES, render

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config" / "examples" / "fake-gpus.yaml"


def _gpu_doc(minor: int, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"uuid": f"GPU-{minor}", "minor": minor}
    doc.update(extra)
    return doc


def _write(tmp_path: Path, doc: object, name: str = "gpus.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_example_file_describes_four_a100s() -> None:
    spec = load_fake_spec(EXAMPLE)
    assert spec.driver_version == "535.129.03"
    assert [g.gpu.minor for g in spec.gpus] == [0, 1, 2, 3]
    assert {g.gpu.model for g in spec.gpus} == {"A100-SXM4-80GB"}
    assert {g.gpu.memory_total for g in spec.gpus} == {80 * 1024**3}
    assert [(g.gpu.numa_node, g.gpu.pcie_root) for g in spec.gpus] == [
        (0, "pci0000:00"),
        (0, "pci0000:00"),
        (1, "pci0000:80"),
        (1, "pci0000:80"),
    ]
    assert spec.health_file is None


def test_full_card_description(tmp_path: Path) -> None:
    doc = {
        "driverVersion": 535.1,
        "healthFile": "health.yaml",
        "gpus": [
            _gpu_doc(
                1,
                name="NVIDIA H100 80GB HBM3",
                memory="81559Mi",
                busID="0000:1B:00.0",
                numaNode=0,
                pcieRoot="pci0000:16",
                memoryUsed=1024,
                utilization=0.5,
            ),
            _gpu_doc(0, memory=17179869184),
        ],
    }
    spec = parse_fake_spec(doc, tmp_path)
    assert spec.driver_version == "535.1"
    assert spec.health_file == tmp_path / "health.yaml"
    assert [g.gpu for g in spec.gpus] == [
        GPU(uuid="GPU-0", minor=0, memory_total=16 * 1024**3, index=1),
        GPU(
            uuid="GPU-1",
            minor=1,
            name="NVIDIA H100 80GB HBM3",
            memory_total=81559 * 1024**2,
            bus_id="0000:1b:00.0",
            numa_node=0,
            pcie_root="pci0000:16",
            index=0,
        ),
    ]
    assert (spec.gpus[1].memory_used, spec.gpus[1].utilization) == (1024, 0.5)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param([1, 2], "<root>: expected a mapping", id="not-a-mapping"),
        pytest.param({"gpus": {"a": 1}}, "gpus: expected a list", id="gpus-not-list"),
        pytest.param({"gpus": ["x"]}, "gpus[0]: expected a mapping", id="gpu-not-mapping"),
        pytest.param({"gpus": [{"minor": 0}]}, "gpus[0].uuid: required", id="no-uuid"),
        pytest.param({"gpus": [{"uuid": "GPU-1"}]}, "gpus[0].minor: required", id="no-minor"),
        pytest.param(
            {"gpus": [{"uuid": "GPU-0", "minor": "zero"}]},
            "gpus[0].minor: expected an integer",
            id="str-minor",
        ),
        pytest.param(
            {"gpus": [_gpu_doc(-1)]}, "gpus[0].minor: must not be negative", id="neg-minor"
        ),
        pytest.param(
            {"gpus": [_gpu_doc(0, memory="12Zi")]},
            'gpus[0].memory: invalid quantity "12Zi"',
            id="bad-memory",
        ),
        pytest.param(
            {"gpus": [_gpu_doc(0, memory="-1Gi")]},
            "gpus[0].memory: must not be negative",
            id="neg-memory",
        ),
        pytest.param(
            {"gpus": [_gpu_doc(0, utilization=1.5)]},
            "gpus[0].utilization: expected a number from 0 to 1",
            id="bad-utilization",
        ),
        pytest.param(
            {"gpus": [_gpu_doc(0, migDevices="MIG-1")]},
            "gpus[0].migDevices: expected a list of MIG device UUIDs",
            id="mig-devices-not-a-list",
        ),
        pytest.param(
            {"gpus": [_gpu_doc(0), _gpu_doc(0, uuid="GPU-x")]},
            "gpus[1].minor: duplicate 0",
            id="duplicate-minor",
        ),
        pytest.param(
            {"gpus": [_gpu_doc(0), _gpu_doc(1, uuid="GPU-0")]},
            "gpus[1].uuid: duplicate 'GPU-0'",
            id="duplicate-uuid",
        ),
    ],
)
def test_invalid_files_name_the_field(tmp_path: Path, doc: object, message: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(FakeSpecError) as err:
        load_fake_spec(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param("gpus: [", "invalid YAML", id="bad-yaml"),
    ],
)
def test_unreadable_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "gpus.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(FakeSpecError, match=message):
        load_fake_spec(path)


def test_empty_file_is_a_node_without_gpus(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("")
    assert load_fake_spec(path).gpus == ()


# -- the library and its health file ----------------------------------------------------------


@pytest.fixture
def lib(tmp_path: Path) -> FakeLibrary:
    doc = {
        "driverVersion": "550.54.15",
        "healthFile": "health.yaml",
        "gpus": [
            _gpu_doc(0, memory="16Gi", memoryUsed="1Gi", utilization=0.25),
            _gpu_doc(1, memory="16Gi"),
        ],
    }
    return FakeLibrary.from_file(_write(tmp_path, doc), poll_interval_s=0.01)


def _health(tmp_path: Path, doc: object) -> None:
    (tmp_path / "health.yaml").write_text(yaml.safe_dump(doc))


def test_discovery_and_usage(lib: FakeLibrary) -> None:
    assert lib.init()
    found = lib.discover()
    assert found.driver_version == "550.54.15"
    assert [g.uuid for g in found.gpus] == ["GPU-0", "GPU-1"]
    assert found.health == {}
    assert lib.usage(found.gpus[0]) == GPUUsage(memory_used=1024**3, utilization=0.25)
    assert lib.usage(found.gpus[1]) == GPUUsage(memory_used=0, utilization=None)
    assert lib.probe(found.gpus[0]) == HEALTHY


def test_health_file_read_at_discovery(lib: FakeLibrary, tmp_path: Path) -> None:
    _health(tmp_path, {"GPU-1": {"reason": "Xid79", "message": "fell off the bus"}})
    assert lib.discover().health == {"GPU-1": Health(False, "Xid79", "fell off the bus")}


def test_health_file_changes_become_events(lib: FakeLibrary, tmp_path: Path) -> None:
    gpus = lib.discover().gpus
    assert lib.open_health_events(gpus)
    assert lib.wait_health_event(0.02) is None
    _health(tmp_path, {"1": {"healthy": False, "reason": "Xid48"}, "GPU-0": None})
    events = [lib.wait_health_event(0.5), lib.wait_health_event(0.5)]
    assert events == [
        HealthEvent("GPU-0", Health(False, "FakeUnhealthy", "marked unhealthy in the health file")),
        HealthEvent("GPU-1", Health(False, "Xid48", "marked unhealthy in the health file")),
    ]
    assert lib.wait_health_event(0.02) is None
    (tmp_path / "health.yaml").unlink()
    assert lib.wait_health_event(0.5) == HealthEvent("GPU-0", HEALTHY)
    assert lib.wait_health_event(0.5) == HealthEvent("GPU-1", HEALTHY)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("{GPU-0: [", id="bad-yaml"),
        pytest.param("[1, 2]", id="not-a-mapping"),
        pytest.param("{GPU-9: {healthy: false}}", id="unknown-card"),
        pytest.param("{GPU-0: 3}", id="bad-entry"),
    ],
)
def test_bad_health_file_is_ignored(lib: FakeLibrary, tmp_path: Path, content: str) -> None:
    assert lib.open_health_events(lib.discover().gpus)
    (tmp_path / "health.yaml").write_text(content)
    assert lib.wait_health_event(0.05) is None


def test_lost_card(lib: FakeLibrary, tmp_path: Path) -> None:
    gpu = lib.discover().gpus[0]
    _health(tmp_path, {"GPU-0": {"healthy": True, "lost": True}})
    assert lib.probe(gpu) == Health(False, REASON_QUERY_FAILED, "NVML query failed: GPU is lost")
    with pytest.raises(DeviceQueryError):
        lib.usage(gpu)


def test_close_wakes_a_waiter(lib: FakeLibrary) -> None:
    assert lib.open_health_events(lib.discover().gpus)
    lib.close_health_events()
    assert lib.wait_health_event(5.0) is None  # returns at once: stopped
    lib.shutdown()


# -- topology -----------------------------------------------------------------------------------


@pytest.mark.parametrize("box", sorted(BOXES))
def test_example_boxes_describe_the_reference_topologies(box: str) -> None:
    expected = BOXES[box]
    found = FakeLibrary.from_file(REPO / "config" / "examples" / expected.example).discover()
    assert len(found.gpus) == expected.count
    links, pcie, bandwidth = render(found.topology, expected.count)
    assert links == expected.links
    assert pcie == expected.pcie
    assert bandwidth == expected.bandwidth


def test_example_boxes_match_the_fake_nvml_hosts() -> None:
    """The YAML examples and the pynvml-level fakes describe the same cards."""
    for box in BOXES.values():
        spec = load_fake_spec(REPO / "config" / "examples" / box.example)
        cards = sorted(box.cards(), key=lambda c: c.minor)
        assert [(g.gpu.uuid, g.gpu.minor, g.gpu.bus_id, g.gpu.name) for g in spec.gpus] == [
            (c.uuid, c.minor, c.sysfs_bus_id, c.name) for c in cards
        ]


def test_the_original_example_has_pcie_levels_only() -> None:
    topology = FakeLibrary.from_file(EXAMPLE).discover().topology
    assert [(link.minors, link.link_type, link.common_ancestor) for link in topology.links] == [
        ((0, 1), "PCIe", "HostBridge"),
        ((0, 2), "PCIe", "System"),
        ((0, 3), "PCIe", "System"),
        ((1, 2), "PCIe", "System"),
        ((1, 3), "PCIe", "System"),
        ((2, 3), "PCIe", "HostBridge"),
    ]


def test_unknown_numa_leaves_the_pair_unknown() -> None:
    spec = parse_fake_spec(
        {"gpus": [_gpu_doc(0, numaNode=0), _gpu_doc(1), _gpu_doc(2, numaNode=0)]}, Path(".")
    )
    assert [link.minors for link in spec.topology().links] == [(0, 2)]


def test_asymmetric_and_unversioned_links() -> None:
    spec = parse_fake_spec(
        {
            "gpus": [
                _gpu_doc(0, nvlink={"peers": {1: 2}}),
                _gpu_doc(1),
                _gpu_doc(2, nvlink={"switches": {"sw": 1}, "version": 3}),
                _gpu_doc(3, nvlink={"switches": {"other": 6}, "version": 3}),
            ]
        },
        Path("."),
    )
    t = spec.topology()
    link = t.link(1, 0)
    assert link is not None and (link.nvlinks, link.bandwidth) == (2, None)
    assert t.link(2, 3) is None  # two switches that share no card: not assumed connected


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        (_gpu_doc(0, pcieSwitches="sw0"), "gpus[0].pcieSwitches: expected a list of names"),
        (_gpu_doc(0, pcieSwitches=[""]), "gpus[0].pcieSwitches: expected a list of names"),
        (_gpu_doc(0, nvlink=[1]), "gpus[0].nvlink: expected a mapping"),
        (_gpu_doc(0, nvlink={"peers": [1]}), "gpus[0].nvlink.peers: expected a mapping"),
        (_gpu_doc(0, nvlink={"peers": {"x": 1}}), "gpus[0].nvlink.peers: expected a GPU minor"),
        (_gpu_doc(0, nvlink={"peers": {1: 0}}), "gpus[0].nvlink.peers[1]: expected a positive"),
        (_gpu_doc(0, nvlink={"peers": {0: 1}}), "gpus[0].nvlink.peers: a card cannot link to it"),
        (_gpu_doc(0, nvlink={"peers": {7: 1}}), "gpus[0].nvlink.peers: no gpu with minor 7"),
        (
            _gpu_doc(0, nvlink={"switches": {"sw": True}}),
            "gpus[0].nvlink.switches['sw']: expected a positive",
        ),
        (_gpu_doc(0, nvlink={"version": 0}), "gpus[0].nvlink.version: must be positive"),
        (_gpu_doc(0, nvlink={"version": "4"}), "gpus[0].nvlink.version: expected an integer"),
    ],
    ids=[
        "switches-string",
        "switches-empty-name",
        "nvlink-list",
        "peers-list",
        "peer-not-minor",
        "zero-links",
        "self-link",
        "unknown-peer",
        "bool-links",
        "zero-version",
        "string-version",
    ],
)
def test_topology_validation_errors(gpu: dict[str, Any], message: str) -> None:
    with pytest.raises(FakeSpecError) as err:
        parse_fake_spec({"gpus": [gpu, _gpu_doc(1)]}, Path("."), "f.yaml")
    assert str(err.value).startswith(f"f.yaml: {message}")


@pytest.mark.parametrize(
    ("box", "minors", "expected"),
    [
        ("h100-nvswitch", (0, 7), (100, 100)),
        ("h100-nvswitch", (0, 1, 2, 3, 4, 5, 6, 7), (100, 100)),
        ("a100-nvlink-pairs", (0, 1), (90, 90)),
        ("a100-nvlink-pairs", (0, 2), (20, 20)),
        ("a100-nvlink-pairs", (0, 1, 2, 3), (20, 43)),
        ("a100-nvlink-pairs", (0, 1, 4, 5), (10, 36)),
        ("a100-nvlink-pairs", (0, 2, 3, 4), (10, 26)),
        ("a100-nvlink-pairs", (0, 2, 4, 6), (10, 13)),
        ("v100-cube-mesh", (0, 3), (73, 73)),
        ("v100-cube-mesh", (0, 1), (71, 71)),
        ("v100-cube-mesh", (0, 1, 2, 3), (71, 72)),
        ("t4-pcie", (0, 1), (50, 50)),
        ("t4-pcie", (2, 3), (30, 30)),
        ("t4-pcie", (0, 2), (10, 10)),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_connectivity_on_the_example_boxes(
    box: str, minors: tuple[int, ...], expected: tuple[int, int]
) -> None:
    """The figures of docs/device-topology.md."""
    topology = FakeLibrary.from_file(REPO / "config" / "examples" / BOXES[box].example).discover()
    got = connectivity(topology.topology, minors)
    assert (got.bottleneck, got.average) == expected


@pytest.mark.parametrize(
    ("box", "minors", "expected"),
    [
        ("h100-nvswitch", (0, 1, 2, 3, 4, 5, 6, 7), "450G"),
        ("a100-nvlink-pairs", (0, 1), "300G"),
        ("a100-nvlink-pairs", (0, 1, 2, 3), None),
        ("v100-cube-mesh", (0, 3), "50G"),
        ("v100-cube-mesh", (0, 1, 2, 3), "25G"),
        ("t4-pcie", (0, 1), None),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_ring_bandwidth_on_the_example_boxes(
    box: str, minors: tuple[int, ...], expected: str | None
) -> None:
    """The figures of docs/device-topology.md."""
    found = FakeLibrary.from_file(REPO / "config" / "examples" / BOXES[box].example).discover()
    got = ring_bandwidth(found.topology, minors)
    assert (None if got is None else got.canonical()) == expected
def test_process_samples(tmp_path: Path) -> None:
    doc = {"gpus": [_gpu_doc(0, processes={4242: 0.5, 7: 1}), _gpu_doc(1)]}
    lib = FakeLibrary.from_file(_write(tmp_path, doc))
    assert lib.init()
    g0, g1 = lib.discover().gpus
    samples = lib.process_utilization(g0, 0)
    assert [(s.pid, s.sm_util) for s in samples] == [(7, 1.0), (4242, 0.5)]
    assert all(s.timestamp_us > 0 for s in samples)
    assert lib.process_utilization(g1, 0) == ()


@pytest.mark.parametrize(
    "processes",
    [
        pytest.param([1], id="list"),
        pytest.param({0: 0.5}, id="pid-0"),
        pytest.param({5: 1.5}, id="over-1"),
        pytest.param({5: True}, id="bool"),
    ],
)
def test_bad_process_samples(tmp_path: Path, processes: object) -> None:
    with pytest.raises(FakeSpecError, match=r"gpus\[0\]\.processes"):
        load_fake_spec(_write(tmp_path, {"gpus": [_gpu_doc(0, processes=processes)]}))
def test_mig_devices_resolve_to_their_card(tmp_path: Path) -> None:
    spec = parse_fake_spec(
        {"gpus": [_gpu_doc(0), _gpu_doc(1, uuid="GPU-1", migDevices=["MIG-a", "MIG-b"])]},
        tmp_path,
    )
    lib = FakeLibrary(spec)
    assert (lib.mig_parent("MIG-b"), lib.mig_parent("MIG-zz")) == ("GPU-1", None)
