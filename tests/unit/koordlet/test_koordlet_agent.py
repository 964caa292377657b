"""koordlet.agent: the assembled agent over the fake library and an in-memory NodeAPI."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from apis.checkpoint import kubelet_checkpoint_json
from apis.device import Device
from koordlet.agent import Agent, NodeInventory, report_once
from koordlet.devices.fake import FakeLibrary, parse_fake_spec
from koordlet.devices.library import HEALTHY, REASON_QUERY_FAILED
from koordlet.kubelet.checkpoint import checkpoint_path
from tests.unit.koordlet.koordlet_fakes import FakeNodeAPI

T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)


def _wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def fake(tmp_path: Path) -> FakeLibrary:
    spec = parse_fake_spec(
        {
            "driverVersion": "535.129.03",
            "healthFile": "health.yaml",
            "gpus": [
                {"uuid": f"GPU-{i}", "minor": i, "name": "NVIDIA L4", "memory": "24Gi"}
                for i in range(2)
            ],
        },
        tmp_path,
    )
    return FakeLibrary(spec, poll_interval_s=0.01)


class Recorder:
    def __init__(self) -> None:
        self.started: list[str] = []

    def service(self, name: str) -> Service:
        return Service(self, name)


class Service:
    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def start(self) -> None:
        self.rec.started.append(f"start {self.name}")

    def stop(self) -> None:
        self.rec.started.append(f"stop {self.name}")


@pytest.fixture
def agent(fake: FakeLibrary, tmp_path: Path) -> Iterator[tuple[Agent, FakeNodeAPI, Recorder]]:
    api = FakeNodeAPI()
    api.add_node("node-1", uid="uid-1")
    rec = Recorder()
    agent = Agent(
        node_name="node-1",
        library=fake,
        api=api,
        registry=CollectorRegistry(),
        sync_interval_s=3600,  # only the first pass and triggers run
        kubelet_root=tmp_path / "kubelet",
        metrics_address=("127.0.0.1", 0),
        clock=lambda: T0,
        services=[rec.service("hooks")],
    )
    try:
        yield agent, api, rec
    finally:
        agent.stop()


def test_agent_syncs_at_start_and_on_health_change(
    agent: tuple[Agent, FakeNodeAPI, Recorder], tmp_path: Path
) -> None:
    a, api, rec = agent
    a.start()
    _wait_for(lambda: "node-1" in api.devices)
    assert [d.health for d in api.device("node-1").devices] == [True, True]
    assert a.watcher is not None and a.healthy()
    assert rec.started == ["start hooks"]

    (tmp_path / "health.yaml").write_text(yaml.safe_dump({"GPU-1": {"reason": "Xid79"}}))
    _wait_for(lambda: not api.device("node-1").devices[1].health)  # long before 3600 s
    # The same pass patches the Node right after the Device: wait for it, don't race it.
    _wait_for(lambda: api.nodes["node-1"].allocatable["koordinator.sh/gpu-core"] == "100")

    port = a.metrics_server.port if a.metrics_server else 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
        assert r.status == 200  # the node is reported
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'koordlet_gpu_healthy{minor="1",model="L4",node="node-1",uuid="GPU-1"} 0.0' in text
    assert 'koordlet_device_sync_total{result="created"} 1.0' in text

    a.stop()
    assert rec.started == ["start hooks", "stop hooks"]
    assert not a.healthy()
    a.stop()  # idempotent


def test_lost_card_found_by_the_next_pass(
    agent: tuple[Agent, FakeNodeAPI, Recorder], tmp_path: Path
) -> None:
    a, api, _ = agent
    a.start()
    _wait_for(lambda: "node-1" in api.devices)
    (tmp_path / "health.yaml").write_text(
        yaml.safe_dump({"GPU-0": {"healthy": True, "lost": True}})
    )
    a.syncer.trigger()
    _wait_for(lambda: not api.device("node-1").devices[0].health)
    cond = api.device("node-1").devices[0].conditions[0]
    assert (cond.reason, cond.message) == (REASON_QUERY_FAILED, "NVML query failed: GPU is lost")


def test_failed_start_stops_what_started(fake: FakeLibrary, tmp_path: Path) -> None:
    class Broken:
        def start(self) -> None:
            raise OSError("socket in use")

        def stop(self) -> None:
            raise AssertionError("never started")

    rec = Recorder()
    api = FakeNodeAPI()
    agent = Agent(
        node_name="n",
        library=fake,
        api=api,
        registry=CollectorRegistry(),
        kubelet_root=tmp_path,
        services=[rec.service("first"), Broken()],
    )
    with pytest.raises(OSError, match="socket in use"):
        agent.start()
    assert rec.started == ["start first", "stop first"]
    assert not agent.syncer.running


def test_inventory_of_a_node_without_the_library() -> None:
    class Absent(FakeLibrary):
        def init(self) -> bool:
            return False

    inventory = NodeInventory(
        Absent(parse_fake_spec({"gpus": [{"uuid": "G", "minor": 0}]}, Path()))
    )
    inventory.open()
    assert inventory.gpus == ()
    assert inventory.snapshot().gpus == ()
    inventory.close()


def test_report_once_includes_checkpoint_entries(fake: FakeLibrary, tmp_path: Path) -> None:
    path = checkpoint_path(tmp_path / "kubelet")
    path.parent.mkdir(parents=True)
    path.write_text(
        kubelet_checkpoint_json(
            {
                "PodDeviceEntries": [
                    {
                        "PodUID": "p1",
                        "ContainerName": "c",
                        "ResourceName": "nvidia.com/gpu",
                        "DeviceIDs": {"-1": ["GPU-1"]},
                    }
                ]
            }
        )
    )
    (tmp_path / "health.yaml").write_text(yaml.safe_dump({"GPU-0": {"reason": "Xid48"}}))
    device = report_once("node-1", fake, tmp_path / "kubelet", clock=lambda: T0)
    assert isinstance(device, Device) and device.name == "node-1"
    assert [d.health for d in device.devices] == [False, True]
    assert device.devices[1].conditions[0].last_transition_time == "2024-05-01T10:00:00Z"
    assert json.loads(device.annotations["node.koordinator.sh/devices-checkpoints"]) == [
        {
            "podUID": "p1",
            "containerName": "c",
            "resourceName": "nvidia.com/gpu",
            "deviceIDs": ["GPU-1"],
        }
    ]
    assert device.devices[1].conditions[0].reason == HEALTHY.reason


# -- kubelet-allocated GPUs reach the Device CR at once ------------------------------------------

from koordlet.reporting.reporter import NodePods  # noqa: E402

CHECKPOINTS = "node.koordinator.sh/devices-checkpoints"


def _published(api: FakeNodeAPI) -> list[tuple[str, list[str]]]:
    raw = api.device("node-1").annotations.get(CHECKPOINTS)
    return [(e["podUID"], e["deviceIDs"]) for e in json.loads(raw)] if raw else []


def test_hook_reported_devices_are_published_without_waiting_for_the_poll(
    agent: tuple[Agent, FakeNodeAPI, Recorder],
) -> None:
    a, api, _ = agent
    api.pods = NodePods(uids=frozenset({"pod-k"}))
    a.start()
    _wait_for(lambda: "node-1" in api.devices)
    a.kubelet_devices("pod-k", "cuda", ("GPU-1::3",))  # a time-slicing replica id
    _wait_for(lambda: _published(api) == [("pod-k", ["GPU-1"])])  # by card, long before 3600 s


def test_checkpoint_writes_are_published_through_the_watch(
    agent: tuple[Agent, FakeNodeAPI, Recorder], tmp_path: Path
) -> None:
    a, api, _ = agent
    api.pods = NodePods(uids=frozenset({"p1"}))
    path = checkpoint_path(tmp_path / "kubelet")
    path.parent.mkdir(parents=True)
    a.start()
    _wait_for(lambda: a.checkpoint_watcher is not None and a.checkpoint_watcher.watching)
    _wait_for(lambda: "node-1" in api.devices)
    entry = {"PodUID": "p1", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"-1": ["0"]}}  # fmt: skip
    path.write_text(kubelet_checkpoint_json({"PodDeviceEntries": [entry]}))
    _wait_for(lambda: _published(api) == [("p1", ["GPU-0"])])  # NVML index 0 -> its card


def test_denials_are_counted_and_posted_as_events(fake: FakeLibrary, tmp_path: Path) -> None:
    class Events:
        def __init__(self) -> None:
            self.posted: list[dict[str, object]] = []

        def create_event(self, event: dict[str, object]) -> None:
            self.posted.append(event)

    events, registry = Events(), CollectorRegistry()
    a = Agent(node_name="node-1", library=fake, api=FakeNodeAPI(), registry=registry,
              kubelet_root=tmp_path, event_api=events, watch_checkpoint=False)  # fmt: skip
    assert a.events is not None
    a.events.start()
    try:
        a.deny("ns", "p", "uid-p", "main", "pod-not-found", "pod ns/p does not exist")
        a.deny("ns", "p", "uid-p", "main", "rdma-unavailable", "VF 0000:18:00.9 not on node")
        a.deny("ns", "p", "uid-p", "main", "gpu-not-allocated", "NVIDIA_VISIBLE_DEVICES='1'")
        _wait_for(lambda: len(events.posted) == 3)
    finally:
        a.events.stop()
    assert events.posted[0]["type"] == "Warning"
    assert events.posted[0]["reason"] == "GPUAllocationNotServed"
    assert "container 'main' started without GPUs (pod-not-found)" in str(events.posted[0])
    assert events.posted[1]["reason"] == "RDMAAllocationNotServed"
    rdma = "container 'main' started without RDMA devices (rdma-unavailable)"
    assert rdma in str(events.posted[1])
    assert events.posted[2]["reason"] == "GPUNotAllocated"
    assert "asked for GPUs it was not given" in str(events.posted[2])
    value = registry.get_sample_value(
        "koordlet_runtime_hook_denied_total", {"reason": "pod-not-found"}
    )
    assert value == 1.0


def test_a_pod_over_committing_a_running_pod_card_is_refused_failed_and_counted(
    fake: FakeLibrary, tmp_path: Path
) -> None:
    from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
    from koordlet.pods.record import PodRecord
    from koordlet.reporting.reporter import NodePods

    whole = (
        '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100",'
        '"koordinator.sh/gpu-memory-ratio":"100","koordinator.sh/gpu-memory":"24Gi"}}]}'
    )
    half = whole.replace('"100"', '"50"').replace("24Gi", "12Gi")

    class Cluster:
        def __init__(self) -> None:
            self.posted: list[dict[str, object]] = []
            self.failed: list[tuple[str, ...]] = []

        def create_event(self, event: dict[str, object]) -> None:
            self.posted.append(event)

        def fail_pod(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
            self.failed.append((namespace, name, uid, reason, message))

    api, cluster, registry = FakeNodeAPI(), Cluster(), CollectorRegistry()
    api.add_node("node-1")
    running = PodRecord("uid-a", "ns", "a", annotations={ANNOTATION_DEVICE_ALLOCATED: whole},
                        started=True)  # before the agent  # fmt: skip
    api.pods = NodePods(uids=frozenset({"uid-a"}), allocated=frozenset({"uid-a"}),
                        records={"uid-a": running})  # fmt: skip
    a = Agent(node_name="node-1", library=fake, api=api, registry=registry, sync_interval_s=3600,
              kubelet_root=tmp_path, event_api=cluster, status_api=cluster,
              watch_checkpoint=False)  # fmt: skip
    a.start()
    try:
        _wait_for(lambda: a.admission.ready)
        assert a.admission.decide("uid-b", "ns", "b", half).outcome == "device-overcommit"
        assert a.admission.decide("uid-c", "ns", "c", half.replace('"minor":0', '"minor":1')
                                  ).outcome == "admitted"  # fmt: skip
        _wait_for(lambda: len(cluster.failed) == 1 and len(cluster.posted) == 1)
    finally:
        a.stop()
    ns, name, uid, reason, message = cluster.failed[0]
    assert (ns, name, uid, reason) == ("ns", "b", "uid-b", "DeviceOvercommit")
    assert "GPU 0 would be over-committed" in message and "ns/a" in message
    event = cluster.posted[0]
    assert (event["reason"], event["type"]) == ("DeviceOvercommit", "Warning")
    assert event["message"] == message
    assert registry.get_sample_value("koordlet_gpu_admission_refused_total") == 1.0


def test_with_a_sysfs_root_admission_counts_the_nodes_rdma_vfs(
    fake: FakeLibrary, tmp_path: Path
) -> None:
    """The agent admits RDMA VFs only where it serves them (``--sysfs-root``), read from sysfs
    at each decision: a VF a running pod holds is refused to the next pod."""
    from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
    from koordlet.pods.record import PodRecord
    from koordlet.reporting.reporter import NodePods
    from tests.fake_sysfs import FakeSysfs

    def vf(bus_id: str) -> str:
        entry = {"minor": 0, "resources": {"koordinator.sh/rdma": "1"}, "id": "0000:18:00.0",
                 "extension": {"vfs": [{"busID": bus_id}]}}
        return json.dumps({"rdma": [entry]})

    FakeSysfs(tmp_path / "sys").nic("0000:18:00.0", 0, vfs=2)  # VFs 0000:18:00.2 and .3
    running = PodRecord("uid-a", "ns", "a", started=True,
                        annotations={ANNOTATION_DEVICE_ALLOCATED: vf("0000:18:00.2")})
    served = ("device-overcommit", "device-overcommit", "admitted")
    for sysfs_root, want in ((tmp_path / "sys", served), (None, ("admitted",) * 3)):
        api = FakeNodeAPI()
        api.add_node("node-1")
        api.pods = NodePods(uids=frozenset({"uid-a"}), allocated=frozenset({"uid-a"}),
                            records={"uid-a": running})
        a = Agent(node_name="node-1", library=fake, api=api, registry=CollectorRegistry(),
                  sync_interval_s=3600, kubelet_root=tmp_path, watch_checkpoint=False,
                  sysfs_root=sysfs_root)
        a.start()
        try:
            _wait_for(lambda: a.admission.ready)  # noqa: B023 (called before the loop moves on)
            numvfs = tmp_path / "sys/bus/pci/devices/0000:18:00.0/sriov_numvfs"
            got = [a.admission.decide("uid-b", "ns", "b", vf("0000:18:00.2")).outcome]
            numvfs.write_text("0")  # SR-IOV off: the NIC has no VF .3 (read at each decision)
            got.append(a.admission.decide("uid-d", "ns", "d", vf("0000:18:00.3")).outcome)
            numvfs.write_text("2")
            got.append(a.admission.decide("uid-c", "ns", "c", vf("0000:18:00.3")).outcome)
        finally:
            a.stop()
        assert tuple(got) == want, sysfs_root


def test_pod_list_listeners_see_every_list_and_cannot_stop_the_loop(
    agent: tuple[Agent, FakeNodeAPI, Recorder],
) -> None:
    a, api, _ = agent
    api.pods = NodePods(uids=frozenset({"uid-a", "uid-b"}))
    seen: list[frozenset[str]] = []

    def broken(uids: frozenset[str], listed_at: float) -> None:
        raise RuntimeError("a listener bug")

    a.on_pods_listed(broken)  # the hook server's CDI cleanup is one (koordlet run)
    a.on_pods_listed(lambda uids, listed_at: seen.append(uids))
    a.start()
    _wait_for(lambda: seen == [frozenset({"uid-a", "uid-b"})])
    assert a.healthy()
