"""koordlet.devices.nvml: discovery, live queries and XID health through a fake at the
pynvml function level (the real adapter code runs), plus the real library on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from koordlet.devices.library import (
    GPU,
    HEALTHY,
    REASON_QUERY_FAILED,
    DeviceQueryError,
    GPUUsage,
    Health,
    HealthEvent,
)
from koordlet.devices.nvml import NvmlLibrary
from tests.unit.koordlet.fake_nvml import A100_BYTES, DRIVER, FakeNvmlHost, make_sysfs


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> FakeNvmlHost:
    return FakeNvmlHost().install(monkeypatch)


@pytest.fixture
def sysfs_root(tmp_path: Path, host: FakeNvmlHost) -> Path:
    return make_sysfs(tmp_path / "sys", host.cards)


@pytest.fixture
def lib(host: FakeNvmlHost, sysfs_root: Path) -> NvmlLibrary:
    nvml = NvmlLibrary(sysfs_root=sysfs_root)
    assert nvml.init()
    return nvml


def _gpu(lib: NvmlLibrary, minor: int) -> GPU:
    return next(g for g in lib.discover().gpus if g.minor == minor)


# -- discovery ----------------------------------------------------------------------------------


def test_discovers_an_eight_gpu_host_sorted_by_minor(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    found = lib.discover()
    assert found.driver_version == DRIVER
    assert found.health == {}
    assert [g.minor for g in found.gpus] == list(range(8))
    assert [g.index for g in found.gpus] == [2, 3, 0, 1, 6, 7, 4, 5]
    first = found.gpus[0]
    assert first == GPU(
        uuid=host.cards[2].uuid,
        minor=0,
        name="NVIDIA A100-SXM4-80GB",
        memory_total=A100_BYTES,
        bus_id="0000:47:00.0",
        numa_node=0,
        pcie_root="pci0000:40",
        index=2,
    )
    assert first.model == "A100-SXM4-80GB"
    assert {g.pcie_root for g in found.gpus} == {
        "pci0000:00",
        "pci0000:40",
        "pci0000:80",
        "pci0000:b0",
    }
    assert [g.numa_node for g in found.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("code", "expected_log"),
    [
        pytest.param(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVML library (libnvidia-ml.so.1) not found: no GPUs on this node",
            id="library-not-found",
        ),
        pytest.param(
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
            "NVML init failed: no GPUs on this node",
            id="driver-not-loaded",
        ),
    ],
)
def test_init_failure_means_no_devices_and_one_log_line(
    host: FakeNvmlHost, tmp_path: Path, code: int, expected_log: str
) -> None:
    host.init_error = code
    with capture_logs() as logs:
        assert NvmlLibrary(sysfs_root=tmp_path).init() is False
    assert [entry["event"] for entry in logs] == [expected_log]


def test_the_fake_raises_nvmls_own_exception_classes(host: FakeNvmlHost) -> None:
    host.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()


def test_card_without_a_handle_is_skipped_with_an_error_log(
    lib: NvmlLibrary, host: FakeNvmlHost
) -> None:
    host.cards[3].lost_handle = True
    with capture_logs() as logs:
        found = lib.discover()
    assert len(found.gpus) == 7
    assert host.cards[3].uuid not in {g.uuid for g in found.gpus}
    skipped = [e for e in logs if e["event"] == "gpu cannot be identified: skipped"]
    assert skipped and skipped[0]["index"] == 3 and skipped[0]["error"] == "GPU is lost"


@pytest.mark.parametrize(
    "failing",
    ["nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo"],
)
def test_card_failing_a_query_is_reported_unhealthy(
    lib: NvmlLibrary, host: FakeNvmlHost, failing: str
) -> None:
    host.cards[0].failing.add(failing)
    found = lib.discover()
    assert len(found.gpus) == 8
    health = found.health[host.cards[0].uuid]
    assert not health.healthy and health.reason == REASON_QUERY_FAILED
    assert failing in health.message
    assert set(found.health) == {host.cards[0].uuid}


def test_bus_id_falls_back_to_the_legacy_field_and_old_pynvml_bytes(
    lib: NvmlLibrary, host: FakeNvmlHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pci = host.nvmlDeviceGetPciInfo

    def legacy_only(handle: Any) -> Any:
        info = real_pci(handle)
        info.busId = b""
        return info

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", legacy_only)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA A100-SXM4-80GB")
    gpu = _gpu(lib, 2)
    assert gpu.bus_id == "0000:07:00.0"
    assert gpu.name == "NVIDIA A100-SXM4-80GB"


def test_missing_sysfs_leaves_topology_unknown(host: FakeNvmlHost, tmp_path: Path) -> None:
    nvml = NvmlLibrary(sysfs_root=tmp_path / "empty")
    assert nvml.init()
    gpu = nvml.discover().gpus[0]
    assert (gpu.bus_id, gpu.numa_node, gpu.pcie_root) == ("0000:47:00.0", None, "")


def test_shutdown_closes_nvml_once(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    lib.shutdown()
    lib.shutdown()
    assert host.calls.count("nvmlShutdown") == 1
    assert host.initialized == 0


# -- live queries ---------------------------------------------------------------------------------


def test_usage_reads_memory_and_utilization(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    gpu = _gpu(lib, 0)  # index 2
    assert lib.usage(gpu) == GPUUsage(memory_used=3 * 1024**3, utilization=0.2)


def test_usage_without_utilization_support(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    host.cards[2].util_supported = False
    assert lib.usage(_gpu(lib, 0)).utilization is None


@pytest.mark.parametrize(
    "stage",
    [
        pytest.param(lambda c: setattr(c, "lost", True), id="gpu-is-lost"),
        pytest.param(lambda c: setattr(c, "lost_handle", True), id="no-handle"),
    ],
)
def test_lost_card_probe_unhealthy_and_usage_raises(
    lib: NvmlLibrary, host: FakeNvmlHost, stage: Any
) -> None:
    gpu = _gpu(lib, 0)
    assert lib.probe(gpu) == HEALTHY
    stage(host.cards[gpu.index])
    health = lib.probe(gpu)
    assert health == Health(False, REASON_QUERY_FAILED, "NVML query failed: GPU is lost")
    with pytest.raises(DeviceQueryError, match="GPU is lost"):
        lib.usage(gpu)


def test_probe_notices_another_card_at_the_same_index(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    gpu = _gpu(lib, 0)
    host.cards[gpu.index].uuid = "GPU-replaced"
    health = lib.probe(gpu)
    assert not health.healthy and "is now GPU-replaced" in health.message


# -- health events --------------------------------------------------------------------------------


def _open(lib: NvmlLibrary) -> tuple[GPU, ...]:
    gpus = lib.discover().gpus
    assert lib.open_health_events(gpus)
    return gpus


def test_registers_xid_critical_events_on_every_card(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    assert sorted(host.registered) == [(i, pynvml.nvmlEventTypeXidCriticalError) for i in range(8)]


def test_critical_xid_makes_the_card_unhealthy(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    host.inject_event(5, 79)
    assert lib.wait_health_event(1.0) == HealthEvent(
        host.cards[5].uuid,
        Health(False, "Xid79", "Xid error detected on device, error code: 79"),
    )


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored(lib: NvmlLibrary, host: FakeNvmlHost, xid: int) -> None:
    _open(lib)
    host.inject_event(0, xid)
    assert lib.wait_health_event(1.0) is None


def test_other_event_types_are_ignored(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    host.inject_event(0, 0, event_type=pynvml.nvmlEventTypePState)
    assert lib.wait_health_event(1.0) is None


def test_wait_timeout_is_no_event(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    assert lib.wait_health_event(0.01) is None


def test_xid_on_an_unreadable_card_affects_every_card(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    host.uuid_error_on_event = True
    host.inject_event(1, 48)
    event = lib.wait_health_event(1.0)
    assert event is not None and event.uuid == "" and event.health.reason == "Xid48"


def test_failing_wait_affects_every_card(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    host.wait_error = pynvml.NVML_ERROR_UNKNOWN
    event = lib.wait_health_event(1.0)
    assert event is not None and event.uuid == ""
    assert event.health == Health(
        False, "HealthCheckFailed", "nvmlEventSetWait failed: Unknown Error"
    )


def test_unsupported_registration_everywhere_means_no_watcher(
    lib: NvmlLibrary, host: FakeNvmlHost
) -> None:
    for card in host.cards:
        card.events_supported = False
    gpus = lib.discover().gpus
    with capture_logs() as logs:
        assert lib.open_health_events(gpus) is False
    assert [e["event"] for e in logs] == ["gpu health events not supported: no health watcher"]
    assert len(host.freed) == 1
    assert lib.wait_health_event(0.01) is None  # no event set: just waits


def test_unsupported_on_some_cards_still_watches_the_others(
    lib: NvmlLibrary, host: FakeNvmlHost
) -> None:
    host.cards[0].events_supported = False
    gpus = lib.discover().gpus
    with capture_logs() as logs:
        assert lib.open_health_events(gpus)
    assert len(host.registered) == 7
    assert logs[0]["event"] == "gpu health events not supported on some gpus"


def test_event_set_creation_failure_means_no_watcher(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    host.event_set_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert lib.open_health_events(lib.discover().gpus) is False


def test_close_frees_the_event_set_once(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    _open(lib)
    lib.close_health_events()
    lib.close_health_events()
    lib.shutdown()
    assert len(host.freed) == 1


# -- the real library on this host ---------------------------------------------------------------


def test_real_nvml_on_this_host() -> None:
    """Without a driver this is the one-log-line "no GPUs" path; on a GPU host, real cards."""
    nvml = NvmlLibrary()
    with capture_logs() as logs:
        ok = nvml.init()
    if not ok:
        assert len(logs) == 1 and "no GPUs on this node" in logs[0]["event"]
        return
    try:
        found = nvml.discover()
        assert found.driver_version
        assert found.gpus, "NVML initialized but found no GPU"
        for gpu in found.gpus:
            assert gpu.uuid.startswith(("GPU-", "MIG-"))
            assert gpu.memory_total > 0
            assert gpu.bus_id.count(":") == 2
            assert nvml.probe(gpu) == HEALTHY
            usage = nvml.usage(gpu)
            assert 0 <= usage.memory_used <= gpu.memory_total
        if nvml.open_health_events(found.gpus):
            event = nvml.wait_health_event(0.05)  # a healthy host: normally nothing
            assert event is None or isinstance(event, HealthEvent)
    finally:
        nvml.shutdown()


# -- MIG devices -> their card ---------------------------------------------------------------------

from tests.unit.koordlet.fake_nvml import FakeMigHost  # noqa: E402


def test_mig_parent_resolves_through_nvml(
    lib: NvmlLibrary, host: FakeNvmlHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeMigHost(host, {"MIG-0f3c-1": 4}).install(monkeypatch)
    assert lib.init()
    assert lib.mig_parent("MIG-0f3c-1") == host.cards[4].uuid
    with capture_logs() as logs:
        assert lib.mig_parent("MIG-unknown") is None  # NVML_ERROR_NOT_FOUND: logged, None
    assert logs[0]["event"] == "MIG device cannot be resolved to its gpu"
