"""koordlet.reporting.sync: one reconcile pass against an in-memory NodeAPI, conflicts, the loop."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from apis.checkpoint import PodDeviceEntry
from apis.device import LABEL_GPU_MODEL
from koordlet.devices.library import GPU, Health
from koordlet.reporting.reporter import Inventory, NodePods
from koordlet.reporting.sync import (
    RESULT_CREATED,
    RESULT_ERROR,
    RESULT_UNCHANGED,
    RESULT_UPDATED,
    ApiError,
    DeviceSyncer,
)
from tests.unit.koordlet.koordlet_fakes import FakeNodeAPI

GIB = 1024**3
XID79 = Health(False, "Xid79", "Xid error detected on device, error code: 79")
GPUS = (
    GPU(uuid="GPU-0", minor=0, name="Tesla T4", memory_total=15 * GIB),
    GPU(uuid="GPU-1", minor=1, name="Tesla T4", memory_total=15 * GIB),
)
ENTRY = PodDeviceEntry("pod-old", "main", "nvidia.com/gpu", ("GPU-1",))


class Results:
    def __init__(self) -> None:
        self.results: list[str] = []
        self.done = threading.Event()

    def sync_done(self, result: str) -> None:
        self.results.append(result)
        self.done.set()


class World:
    """The fake API plus mutable inventory and checkpoint the syncer reads."""

    def __init__(self) -> None:
        self.api = FakeNodeAPI()
        self.node = self.api.add_node("node-1", uid="uid-1")
        self.inventory = Inventory(gpus=GPUS, driver_version="535.129.03")
        self.entries: list[PodDeviceEntry] = []
        self.now = datetime(2024, 5, 1, 10, tzinfo=UTC)
        self.observer = Results()
        self.syncer = DeviceSyncer(
            self.api,
            "node-1",
            lambda: self.inventory,
            lambda: self.entries,
            clock=lambda: self.now,
            observer=self.observer,
            max_conflict_retries=2,
        )


@pytest.fixture
def world() -> World:
    return World()


def test_first_pass_creates_and_advertises(world: World) -> None:
    assert world.syncer.sync_once() == RESULT_CREATED
    device = world.api.device("node-1")
    assert [d.id for d in device.devices] == ["GPU-0", "GPU-1"]
    assert device.owner_references[0]["uid"] == "uid-1"
    assert device.labels[LABEL_GPU_MODEL] == "Tesla-T4"
    assert world.node.labels == dict(device.labels)
    ext = {
        "koordinator.sh/gpu-core": "200",
        "koordinator.sh/gpu-memory": "30Gi",
        "koordinator.sh/gpu-memory-ratio": "200",
    }
    assert world.node.capacity == {"cpu": "8", "pods": "110", **ext}
    assert world.node.allocatable == {"cpu": "8", "pods": "110", **ext}
    assert world.api.writes == ["create_device", "patch_node_labels", "patch_node_status"]


def test_second_pass_writes_nothing(world: World) -> None:
    world.syncer.sync_once()
    world.api.writes.clear()
    world.now = datetime(2024, 5, 1, 11, tzinfo=UTC)
    assert world.syncer.sync_once() == RESULT_UNCHANGED
    assert world.api.writes == []
    assert world.observer.results == [RESULT_CREATED, RESULT_UNCHANGED]


def test_health_change_updates_cr_and_totals(world: World) -> None:
    world.syncer.sync_once()
    world.api.writes.clear()
    world.inventory = Inventory(gpus=GPUS, health={"GPU-1": XID79}, driver_version="535.129.03")
    assert world.syncer.sync_once() == RESULT_UPDATED
    device = world.api.device("node-1")
    assert [d.health for d in device.devices] == [True, False]
    assert device.devices[1].conditions[0].reason == "Xid79"
    assert world.node.capacity["koordinator.sh/gpu-core"] == "100"
    assert world.node.allocatable["koordinator.sh/gpu-memory"] == "15Gi"
    assert world.api.writes == ["update_device", "patch_node_status"]


def test_checkpoint_entries_follow_pods(world: World) -> None:
    world.entries = [ENTRY]
    world.api.pods = NodePods(uids=frozenset({"pod-old"}))
    world.syncer.sync_once()
    assert (
        "pod-old"
        in world.api.device("node-1").annotations["node.koordinator.sh/devices-checkpoints"]
    )
    world.api.pods = NodePods()  # the pod is gone
    assert world.syncer.sync_once() == RESULT_UPDATED
    assert world.api.device("node-1").annotations == {}


@pytest.mark.parametrize(
    ("conflicts", "result", "writes"),
    [
        pytest.param(1, RESULT_UPDATED, 1, id="one-conflict-retried"),
        pytest.param(2, RESULT_UPDATED, 1, id="two-conflicts-retried"),
        pytest.param(3, RESULT_ERROR, 0, id="gives-up-after-retries"),
    ],
)
def test_conflict_retried_with_a_fresh_get(
    world: World, conflicts: int, result: str, writes: int
) -> None:
    world.syncer.sync_once()
    world.api.writes.clear()
    world.inventory = Inventory(gpus=GPUS, health={"GPU-0": XID79}, driver_version="535.129.03")
    world.api.conflicts = conflicts
    assert world.syncer.sync_once() == result
    assert world.api.writes.count("update_device") == writes
    if writes:
        device = world.api.device("node-1")
        assert "other-writer" in device.labels  # the other writer's change survived
        assert not device.devices[0].health


def test_create_conflict_becomes_an_update(world: World) -> None:
    world.syncer.sync_once()
    world.api.writes.clear()
    world.inventory = Inventory(gpus=GPUS, health={"GPU-0": XID79})
    world.api.stale_reads = 1  # GET misses, so the syncer creates: 409, then a fresh GET
    assert world.syncer.sync_once() == RESULT_UPDATED
    assert world.api.writes[0] == "update_device"
    assert not world.api.device("node-1").devices[0].health


@pytest.mark.parametrize(
    "method",
    ["get_node", "list_node_pods", "get_device", "update_device", "patch_node_status"],
)
def test_api_errors_are_reported_not_raised(world: World, method: str) -> None:
    world.syncer.sync_once()
    world.inventory = Inventory(gpus=GPUS, health={"GPU-0": XID79})
    world.api.errors[method] = ApiError(503, "unavailable")
    assert world.syncer.sync_once() == RESULT_ERROR
    assert world.observer.results[-1] == RESULT_ERROR


def test_missing_node_is_an_error(world: World) -> None:
    del world.api.nodes["node-1"]
    assert world.syncer.sync_once() == RESULT_ERROR
    assert world.api.writes == []


def test_unexpected_exception_is_an_error(world: World) -> None:
    def broken() -> Inventory:
        raise ValueError("bug")

    syncer = DeviceSyncer(world.api, "node-1", broken, lambda: [])
    assert syncer.sync_once() == RESULT_ERROR
    assert syncer.last_result == RESULT_ERROR and syncer.passes == 1


def test_loop_runs_periodically_and_on_trigger(world: World) -> None:
    done = world.observer.done
    world.syncer.start(interval_s=3600)
    assert done.wait(5.0)  # the first pass runs at once
    assert world.syncer.running
    done.clear()
    world.inventory = Inventory(gpus=GPUS, health={"GPU-1": XID79})
    world.syncer.trigger()
    assert done.wait(5.0)
    deadline = time.monotonic() + 5
    while world.api.device("node-1").devices[1].conditions[0].reason != "Xid79":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(RuntimeError):
        world.syncer.start(1.0)
    world.syncer.stop()
    assert not world.syncer.running
    world.syncer.stop()
