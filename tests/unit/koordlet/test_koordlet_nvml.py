"""koordlet.devices.nvml: discovery, live queries and XID health through a fake at the
pynvml function level (the real adapter code runs), plus the real library on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from koordlet.devices.health import HealthTracker
from koordlet.devices.library import (
    GPU,
    HEALTHY,
    REASON_MIG_ENABLED,
    REASON_QUERY_FAILED,
    DeviceQueryError,
    GPUUsage,
    Health,
    HealthEvent,
)
from koordlet.devices.nvml import NvmlLibrary
from tests.unit.koordlet.fake_nvml import (
    A100_BYTES,
    DRIVER,
    FakeNvmlHost,
    Port,
    make_sysfs,
    v100_cube_mesh_cards,
)
from tests.unit.koordlet.topology_boxes import BOXES, render


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


def test_a_card_in_mig_mode_is_never_offered_whole(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    host.cards[1].mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    host.cards[2].mig_mode = None  # NOT_SUPPORTED: a card without MIG
    found = lib.discover()
    assert len(found.gpus) == 8  # still listed (its MIG devices are the kubelet's)
    assert set(found.health) == {host.cards[1].uuid}
    health = found.health[host.cards[1].uuid]
    assert not health.healthy and health.reason == REASON_MIG_ENABLED
    assert "MIG" in health.message
    # a periodic probe that reads the card fine does not make it whole again
    tracker = HealthTracker([g.uuid for g in found.gpus], found.health)
    gpu = next(g for g in found.gpus if g.uuid == host.cards[1].uuid)
    tracker.apply_probe(gpu.uuid, lib.probe(gpu))
    assert tracker.snapshot()[gpu.uuid] == health


def test_a_card_whose_mig_mode_cannot_be_read_is_not_offered(
    lib: NvmlLibrary, host: FakeNvmlHost
) -> None:
    host.cards[0].failing.add("nvmlDeviceGetMigMode")
    health = lib.discover().health[host.cards[0].uuid]
    assert not health.healthy and "nvmlDeviceGetMigMode" in health.message


def test_memory_not_supported_is_not_a_fault(
    host: FakeNvmlHost, sysfs_root: Path, tmp_path: Path
) -> None:
    # unified-memory parts answer NVML_ERROR_NOT_SUPPORTED for the memory info: the card is
    # healthy and is published with the node's system memory (what its allocations draw from)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:        1 kB\n")
    nvml = NvmlLibrary(sysfs_root=sysfs_root, meminfo_path=meminfo)
    assert nvml.init()
    host.cards[3].memory_supported = False
    found = nvml.discover()
    assert found.health == {}
    gpu = next(g for g in found.gpus if g.uuid == host.cards[3].uuid)
    assert gpu.memory_total == 131072000 * 1024
    assert nvml.probe(gpu).healthy


def test_memory_not_supported_without_system_memory_is_unhealthy(
    host: FakeNvmlHost, sysfs_root: Path, tmp_path: Path
) -> None:
    nvml = NvmlLibrary(sysfs_root=sysfs_root, meminfo_path=tmp_path / "missing")
    assert nvml.init()
    host.cards[3].memory_supported = False
    health = nvml.discover().health[host.cards[3].uuid]
    assert not health.healthy and "memory" in health.message


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


# -- topology -----------------------------------------------------------------------------------


def _box_lib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, box: str
) -> tuple[FakeNvmlHost, NvmlLibrary]:
    host = FakeNvmlHost(BOXES[box].cards()).install(monkeypatch)
    nvml = NvmlLibrary(sysfs_root=make_sysfs(tmp_path / "sys", host.cards))
    assert nvml.init()
    return host, nvml


@pytest.mark.parametrize("box", sorted(BOXES))
def test_topology_of_each_reference_box(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, box: str
) -> None:
    _, nvml = _box_lib(monkeypatch, tmp_path, box)
    expected = BOXES[box]
    found = nvml.discover()
    assert len(found.gpus) == expected.count and found.health == {}
    links, pcie, bandwidth = render(found.topology, expected.count)
    assert links == expected.links
    assert pcie == expected.pcie
    assert bandwidth == expected.bandwidth


def test_switches_are_recognised_by_pci_id_on_drivers_without_remote_type(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host, nvml = _box_lib(monkeypatch, tmp_path, "h100-nvswitch")
    host.remote_type_supported = False
    links, _, _ = render(nvml.discover().topology, 8)
    assert links == BOXES["h100-nvswitch"].links


def test_no_nvlink_is_one_log_line_and_pcie_pairs_remain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, nvml = _box_lib(monkeypatch, tmp_path, "t4-pcie")
    with capture_logs() as logs:
        topology = nvml.discover().topology
    lines = [e for e in logs if "NVLink" in e["event"]]
    assert lines == [
        {"event": "NVLink not supported: PCIe only", "log_level": "info", "minors": [0, 1, 2, 3]}
    ]
    assert len(topology.links) == 6 and not any(link.is_nvlink for link in topology.links)


def test_unreadable_common_ancestors_leave_only_the_nvlink_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host, nvml = _box_lib(monkeypatch, tmp_path, "a100-nvlink-pairs")
    host.ancestor_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    with capture_logs() as logs:
        topology = nvml.discover().topology
    assert [link.minors for link in topology.links] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(link.common_ancestor == "" for link in topology.links)
    assert [e["event"] for e in logs if "ancestor" in e["event"]] == [
        "gpu common ancestors not supported"
    ]
    host.ancestor_error, host.ancestor_level = None, 77  # a level this agent does not know
    with capture_logs() as logs:
        assert len(nvml.discover().topology.links) == 4
    assert any(e["event"] == "some gpu common ancestors could not be read" for e in logs)


def test_a_card_whose_ports_fail_still_shows_its_links_from_the_peer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host, nvml = _box_lib(monkeypatch, tmp_path, "a100-nvlink-pairs")
    host.cards[1].failing.add("nvmlDeviceGetNvLinkRemotePciInfo")  # minor 0
    with capture_logs() as logs:
        links, _, _ = render(nvml.discover().topology, 8)
    assert links == BOXES["a100-nvlink-pairs"].links
    warned = [e for e in logs if e["event"] == "some NVLink ports could not be read"]
    assert [e["minor"] for e in warned] == [0] and len(warned[0]["errors"]) == 12


def test_a_lost_card_drops_out_of_the_topology_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host, nvml = _box_lib(monkeypatch, tmp_path, "h100-nvswitch")
    host.cards[7].failing.add("nvmlDeviceGetNvLinkState")
    host.cards[7].failing.add("nvmlDeviceGetTopologyCommonAncestor")
    found = nvml.discover()
    assert len(found.gpus) == 8
    assert found.topology.minors == frozenset(range(7))
    assert found.topology.link(0, 7) is None
    link = found.topology.link(0, 6)
    assert link is not None and (link.nvlinks, link.nvswitch) == (18, True)


def test_inactive_and_cpu_ports_are_not_gpu_links(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cards = v100_cube_mesh_cards()
    cards[0].ports[-1] = Port("00000000:04:00.0", "npu")  # an NVLink to a POWER9 CPU
    host = FakeNvmlHost(cards).install(monkeypatch)
    nvml = NvmlLibrary(sysfs_root=make_sysfs(tmp_path / "sys", host.cards))
    assert nvml.init()
    links, _, _ = render(nvml.discover().topology, 4)
    assert links == BOXES["v100-cube-mesh"].links


def test_a_binding_surprise_costs_the_topology_not_the_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, nvml = _box_lib(monkeypatch, tmp_path, "h100-nvswitch")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", lambda h, p: object())
    with capture_logs() as logs:
        found = nvml.discover()
    assert len(found.gpus) == 8 and not found.topology
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "gpu topology discovery failed: no topology reported"
    ]
# -- per-process utilization (fair-share monitoring) -------------------------------------------


def test_process_utilization_reads_new_samples_only(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    from koordlet.devices.library import ProcessSample

    gpu = _gpu(lib, 0)
    card = next(c for c in host.cards if c.minor == 0)
    card.process_samples = [(100, 1_000, 40), (200, 1_500, 55), (100, 2_000, 100)]
    assert lib.process_utilization(gpu, 0) == (
        ProcessSample(100, 1_000, 0.40),
        ProcessSample(200, 1_500, 0.55),
        ProcessSample(100, 2_000, 1.0),
    )
    assert lib.process_utilization(gpu, 1_500) == (ProcessSample(100, 2_000, 1.0),)
    assert lib.process_utilization(gpu, 2_000) == ()  # NVML: NOT_FOUND, nothing newer


def test_process_utilization_unsupported_is_empty_and_logged_once(
    lib: NvmlLibrary, host: FakeNvmlHost
) -> None:
    gpu = _gpu(lib, 1)
    next(c for c in host.cards if c.minor == 1).process_util_supported = False
    with capture_logs() as logs:
        assert lib.process_utilization(gpu, 0) == ()
        assert lib.process_utilization(gpu, 0) == ()
    assert [e["event"] for e in logs] == ["per-process utilization not supported"]


def test_process_utilization_of_a_lost_card_raises(lib: NvmlLibrary, host: FakeNvmlHost) -> None:
    gpu = _gpu(lib, 2)
    next(c for c in host.cards if c.minor == 2).lost = True
    with pytest.raises(DeviceQueryError, match=gpu.uuid):
        lib.process_utilization(gpu, 0)
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
