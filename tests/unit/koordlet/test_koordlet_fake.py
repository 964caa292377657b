"""koordlet.devices.fake: the YAML file, validation errors, and the health file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

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


def test_mig_devices_resolve_to_their_card(tmp_path: Path) -> None:
    spec = parse_fake_spec(
        {"gpus": [_gpu_doc(0), _gpu_doc(1, uuid="GPU-1", migDevices=["MIG-a", "MIG-b"])]},
        tmp_path,
    )
    lib = FakeLibrary(spec)
    assert (lib.mig_parent("MIG-b"), lib.mig_parent("MIG-zz")) == ("GPU-1", None)
