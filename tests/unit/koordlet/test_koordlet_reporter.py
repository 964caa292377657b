"""koordlet.reporting.reporter (pure): golden Device CRs, published checkpoint entries, node totals,
labels, and what to write given what the API server holds."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from apis.checkpoint import PodDeviceEntry, decode_devices_checkpoints
from apis.device import Device, DeviceInfo
from apis.quantity import Quantity
from apis.topology import GPULink, GPUTopology
from koordlet.devices.library import GPU, HEALTHY, Health
from koordlet.reporting.reporter import (
    DEFAULT_GPU_RESOURCES,
    GPUResourceNames,
    Inventory,
    NodePods,
    desired_device,
    device_labels,
    merge_device,
    node_extended_resources,
    node_label_patch,
    node_resource_patch,
    published_entries,
    rfc3339,
)

T0 = "2024-05-01T10:00:00Z"
T1 = "2024-05-01T11:00:00Z"
GIB = 1024**3
XID79 = Health(False, "Xid79", "Xid error detected on device, error code: 79")
CORE, MEM, RATIO = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
)
ANN = "node.koordinator.sh/devices-checkpoints"


def _gpu(minor: int, **kw: Any) -> GPU:
    base: dict[str, Any] = {
        "uuid": f"GPU-{minor}",
        "minor": minor,
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total": 80 * GIB,
        "bus_id": f"0000:{minor + 7:02x}:00.0",
        "numa_node": minor // 2,
        "pcie_root": f"pci0000:{minor // 2:02x}",
        "index": 7 - minor,
    }
    base.update(kw)
    return GPU(**base)


INVENTORY = Inventory(
    gpus=(_gpu(1), _gpu(0, numa_node=None)),  # out of order; card 0 without NUMA info
    health={"GPU-1": XID79},
    driver_version="535.129.03",
)

GOLDEN: dict[str, Any] = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Device",
    "metadata": {
        "name": "node-1",
        "labels": {
            "node.koordinator.sh/gpu-vendor": "nvidia",
            "node.koordinator.sh/gpu-model": "A100-SXM4-80GB",
            "node.koordinator.sh/gpu-driver-version": "535.129.03",
        },
        "annotations": {
            ANN: '[{"podUID":"pod-a","containerName":"cuda","resourceName":"nvidia.com/gpu",'
            '"deviceIDs":["GPU-0"]}]'
        },
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": "node-1",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    },
    "spec": {
        "devices": [
            {
                "type": "gpu",
                "id": "GPU-0",
                "minor": 0,
                "health": True,
                "resources": {CORE: "100", MEM: "80Gi", RATIO: "100"},
                "conditions": [
                    {
                        "type": "Healthy",
                        "status": "True",
                        "lastTransitionTime": T0,
                        "reason": "DeviceHealthy",
                        "message": "device is healthy",
                    }
                ],
            },
            {
                "type": "gpu",
                "id": "GPU-1",
                "minor": 1,
                "health": False,
                "resources": {CORE: "100", MEM: "80Gi", RATIO: "100"},
                "topology": {
                    "socketID": -1,
                    "nodeID": 0,
                    "pcieID": "pci0000:00",
                    "busID": "0000:08:00.0",
                },
                "conditions": [
                    {
                        "type": "Healthy",
                        "status": "False",
                        "lastTransitionTime": T0,
                        "reason": "Xid79",
                        "message": "Xid error detected on device, error code: 79",
                    }
                ],
            },
        ]
    },
}

ENTRIES = (
    PodDeviceEntry("pod-a", "cuda", "nvidia.com/gpu", ("GPU-0",)),
    PodDeviceEntry("pod-koord", "main", "nvidia.com/gpu", ("GPU-1",)),
    PodDeviceEntry("pod-gone", "main", "nvidia.com/gpu", ("GPU-1",)),
    PodDeviceEntry("pod-a", "cuda", "example.com/fpga", ("fpga-0",)),
    PodDeviceEntry("pod-a", "idle", "nvidia.com/gpu", ()),
)
PODS = NodePods(uids=frozenset({"pod-a", "pod-koord"}), allocated=frozenset({"pod-koord"}))


def test_golden_device_cr() -> None:
    device = desired_device("node-1", INVENTORY, ENTRIES, PODS, now=T0, node_uid="uid-1")
    assert device.to_dict() == GOLDEN
    assert Device.from_dict(GOLDEN) == Device.from_dict(device.to_dict())


def test_spec_example_quantity() -> None:
    inv = Inventory(gpus=(_gpu(0, memory_total=15843721216),))
    (info,) = desired_device("n", inv, now=T0).devices
    assert info.to_dict()["resources"][MEM] == "15472384Ki"


def test_node_without_gpus() -> None:
    device = desired_device("node-1", Inventory(), ENTRIES, None, now=T0)
    assert device.to_dict() == {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {
            "name": "node-1",
            "annotations": {ANN: device.annotations[ANN]},
        },
        "spec": {},
    }
    assert device_labels(Inventory()) == {}
    assert node_extended_resources(device) == {}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            None,
            [("pod-a", "cuda"), ("pod-gone", "main"), ("pod-koord", "main")],
            id="pods-unknown-keep-every-gpu-entry",
        ),
        pytest.param(PODS, [("pod-a", "cuda")], id="drop-gone-and-koord-scheduled"),
        pytest.param(NodePods(), [], id="no-pods"),
    ],
)
def test_published_entries(pods: NodePods | None, expected: list[tuple[str, str]]) -> None:
    got = published_entries(ENTRIES, pods)
    assert sorted((e.pod_uid, e.container_name) for e in got) == expected
    device = desired_device("n", Inventory(), ENTRIES, pods, now=T0)
    if expected:
        decoded = decode_devices_checkpoints(device.annotations[ANN])
        assert [(e.pod_uid, e.container_name) for e in decoded] == expected
    else:
        assert ANN not in device.annotations


@pytest.mark.parametrize(
    ("gpus", "driver", "expected"),
    [
        pytest.param(
            (_gpu(0), _gpu(1)),
            "550.54.15",
            {
                "node.koordinator.sh/gpu-vendor": "nvidia",
                "node.koordinator.sh/gpu-model": "A100-SXM4-80GB",
                "node.koordinator.sh/gpu-driver-version": "550.54.15",
            },
            id="same-model",
        ),
        pytest.param(
            (_gpu(0), _gpu(1, name="NVIDIA H100 80GB HBM3")),
            "550.54.15",
            {
                "node.koordinator.sh/gpu-vendor": "nvidia",
                "node.koordinator.sh/gpu-driver-version": "550.54.15",
            },
            id="mixed-models-no-model-label",
        ),
        pytest.param(
            (_gpu(0, name=""),), "", {"node.koordinator.sh/gpu-vendor": "nvidia"}, id="unknown"
        ),
    ],
)
def test_device_labels(gpus: tuple[GPU, ...], driver: str, expected: dict[str, str]) -> None:
    assert device_labels(Inventory(gpus=gpus, driver_version=driver)) == expected


def test_condition_transition_time_kept_while_status_is_the_same() -> None:
    first = desired_device("n", INVENTORY, now=T0)
    again = desired_device("n", INVENTORY, previous=first, now=T1)
    assert again == first
    recovered = Inventory(gpus=INVENTORY.gpus, health={}, driver_version="535.129.03")
    after = desired_device("n", recovered, previous=first, now=T1)
    times = {d.id: d.conditions[0].last_transition_time for d in after.devices}
    assert times == {"GPU-0": T0, "GPU-1": T1}
    assert all(d.health for d in after.devices)


def test_rfc3339() -> None:
    local = datetime(2024, 5, 1, 12, 0, 0, 999, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(local) == T0
    assert rfc3339(datetime(2024, 5, 1, 10, tzinfo=UTC)) == T0


# -- node totals ------------------------------------------------------------------------------


def _info(kind: str, minor: int, health: bool, **res: str) -> DeviceInfo:
    return DeviceInfo(
        type=kind,
        id=f"{kind}-{minor}",
        minor=minor,
        health=health,
        resources={k: Quantity.parse(v) for k, v in res.items()},
    )


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(
            desired_device("n", INVENTORY, now=T0).devices,
            {CORE: "100", MEM: "80Gi", RATIO: "100"},
            id="one-of-two-healthy",
        ),
        pytest.param(
            desired_device(
                "n", Inventory(gpus=(_gpu(0), _gpu(1, memory_total=40 * GIB))), now=T0
            ).devices,
            {CORE: "200", MEM: "120Gi", RATIO: "200"},
            id="sum-of-memory",
        ),
        pytest.param(
            desired_device(
                "n", Inventory(gpus=(_gpu(0),), health={"GPU-0": XID79}), now=T0
            ).devices,
            {CORE: "0", MEM: "0", RATIO: "0"},
            id="all-unhealthy-advertise-zero",
        ),
        pytest.param(
            (
                _info("rdma", 0, True, **{"koordinator.sh/rdma": "100"}),
                _info("rdma", 1, True, **{"koordinator.sh/rdma": "100"}),
                _info("fpga", 0, False, **{"koordinator.sh/fpga": "100"}),
            ),
            {"koordinator.sh/rdma": "200", "koordinator.sh/fpga": "0"},
            id="rdma-and-fpga",
        ),
    ],
)
def test_node_extended_resources(devices: tuple[DeviceInfo, ...], expected: dict[str, str]) -> None:
    got = node_extended_resources(Device(name="n", devices=devices))
    assert {k: v.canonical() for k, v in got.items()} == expected


def test_node_label_patch() -> None:
    current = {"kubernetes.io/hostname": "n", "node.koordinator.sh/gpu-vendor": "nvidia"}
    desired = {"node.koordinator.sh/gpu-vendor": "nvidia", "node.koordinator.sh/gpu-model": "T4"}
    assert node_label_patch(current, desired) == {"node.koordinator.sh/gpu-model": "T4"}
    assert node_label_patch({**current, **desired}, desired) == {}


@pytest.mark.parametrize(
    ("capacity", "allocatable", "desired", "expected"),
    [
        pytest.param(
            {"cpu": "8"},
            {"cpu": "8"},
            {CORE: "200", MEM: "160Gi"},
            ({CORE: "200", MEM: "160Gi"}, {CORE: "200", MEM: "160Gi"}),
            id="advertise",
        ),
        pytest.param(
            {CORE: "200", MEM: "171798691840"},
            {CORE: "200", MEM: "160Gi"},
            {CORE: "200", MEM: "160Gi"},
            ({}, {}),
            id="numerically-equal",
        ),
        pytest.param(
            {CORE: "200", "koordinator.sh/rdma": "100", "cpu": "8"},
            {CORE: "100"},
            {CORE: "200"},
            ({"koordinator.sh/rdma": None}, {CORE: "200"}),
            id="remove-stale-managed-only",
        ),
        pytest.param(
            {CORE: "garbage"}, {}, {CORE: "100"}, ({CORE: "100"}, {CORE: "100"}), id="garbage"
        ),
    ],
)
def test_node_resource_patch(
    capacity: dict[str, str],
    allocatable: dict[str, str],
    desired: dict[str, str],
    expected: tuple[dict[str, str | None], dict[str, str | None]],
) -> None:
    want = {k: Quantity.parse(v) for k, v in desired.items()}
    assert node_resource_patch(capacity, allocatable, want) == expected


# -- merging with what the API server holds -----------------------------------------------------


def _stored(**meta: Any) -> Device:
    doc = desired_device("node-1", INVENTORY, ENTRIES, PODS, now=T0, node_uid="uid-1").to_dict()
    doc["metadata"].update(resourceVersion="42", uid="dev-uid", **meta)
    doc["status"] = {}
    return Device.from_dict(doc)


def test_merge_unchanged_is_none() -> None:
    current = _stored()
    desired = desired_device(
        "node-1", INVENTORY, ENTRIES, PODS, previous=current, now=T1, node_uid="uid-1"
    )
    assert merge_device(current, desired) is None


def test_merge_keeps_foreign_fields_and_replaces_ours() -> None:
    current = _stored(
        labels={"team": "ml", "node.koordinator.sh/gpu-model": "old"},
        annotations={"note": "keep", ANN: "[]"},
        ownerReferences=[{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "stale"}],
    )
    healed = Inventory(gpus=INVENTORY.gpus, driver_version="535.129.03")
    desired = desired_device("node-1", healed, (), PODS, previous=current, now=T1, node_uid="uid-1")
    merged = merge_device(current, desired)
    assert merged is not None
    assert merged.resource_version == "42" and merged.uid == "dev-uid"
    assert merged.labels == {"team": "ml", **device_labels(healed)}
    assert merged.annotations == {"note": "keep"}
    assert [r["uid"] for r in merged.owner_references] == ["uid-1"]
    assert [d.health for d in merged.devices] == [True, True]
    assert merged.status == {}


def test_merge_keeps_other_owner_references() -> None:
    other = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "ds"}
    current = _stored(ownerReferences=[other])
    desired = desired_device(
        "node-1", INVENTORY, ENTRIES, PODS, previous=current, now=T1, node_uid="uid-1"
    )
    merged = merge_device(current, desired)
    assert merged is not None
    assert [r["uid"] for r in merged.owner_references] == ["ds", "uid-1"]


def test_healthy_default() -> None:
    assert Inventory().health_of("anything") == HEALTHY


# -- the gpu-topology annotation ----------------------------------------------------------------

TOPO = "scheduling.koordinator.sh/gpu-topology"
PAIR = GPUTopology(
    (GPULink((0, 1), "NVLink", 12, bandwidth=Quantity.parse("300G"), common_ancestor="Single"),)
)


def test_topology_is_published_on_the_device() -> None:
    inventory = dataclasses.replace(INVENTORY, topology=PAIR)
    device = desired_device("node-1", inventory, ENTRIES, PODS, now=T0)
    assert device.annotations[TOPO] == (
        '{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvlinks":12,"bandwidth":"300G",'
        '"commonAncestor":"Single"}]}'
    )
    assert Device.from_dict(device.to_dict()).gpu_topology() == PAIR
    assert TOPO not in desired_device("node-1", INVENTORY, ENTRIES, PODS, now=T0).annotations


def test_topology_merge_writes_once_and_drops_a_stale_annotation() -> None:
    inventory = dataclasses.replace(INVENTORY, topology=PAIR)
    current = _stored(annotations={"note": "keep", TOPO: '{"links":[]}'})
    desired = desired_device(
        "node-1", inventory, ENTRIES, PODS, previous=current, now=T1, node_uid="uid-1"
    )
    merged = merge_device(current, desired)
    assert merged is not None and merged.annotations[TOPO] == PAIR.encode()
    assert merged.annotations["note"] == "keep"
    again = desired_device(
        "node-1", inventory, ENTRIES, PODS, previous=merged, now=T1, node_uid="uid-1"
    )
    assert merge_device(merged, again) is None  # same topology: no write
    # The library no longer reports a topology: the agent's annotation goes, others stay.
    gone = merge_device(merged, desired_device("node-1", INVENTORY, ENTRIES, PODS, now=T1))
    assert gone is not None and TOPO not in gone.annotations and gone.annotations["note"] == "keep"


# -- the gpu-partitions annotation --------------------------------------------------------------

PARTITIONS = "scheduling.koordinator.sh/gpu-partitions"


def test_partition_table_is_published_next_to_the_topology() -> None:
    device = desired_device(
        "node-1", dataclasses.replace(INVENTORY, topology=PAIR), ENTRIES, PODS, now=T0
    )
    minors = sorted(g.minor for g in INVENTORY.gpus)
    table = Device.from_dict(device.to_dict()).gpu_partitions()
    assert table is not None and (0, 1) in [p.minors for p in table.of_size(2)]
    assert [p.minors for p in table.of_size(1)] == [(m,) for m in minors]
    assert "node.koordinator.sh/gpu-partition-policy" not in device.labels
    # No NVLink: no table; a table written before goes with the merge.
    plain = desired_device("node-1", INVENTORY, ENTRIES, PODS, now=T1)
    assert PARTITIONS not in plain.annotations
    gone = merge_device(device, plain)
    assert gone is not None and PARTITIONS not in gone.annotations


OTHER_GPU_ENTRIES = (
    PodDeviceEntry("ts", "c", "nvidia.com/gpu.shared", ("GPU-1",)),
    PodDeviceEntry("mig", "c", "nvidia.com/mig-1g.10gb", ("GPU-2",)),
    PodDeviceEntry("share", "c", "aliyun.com/gpu-mem", ("GPU-3",)),
    PodDeviceEntry("nic", "c", "rdma/hca", ("mlx5_0",)),
)


def test_gpus_of_every_gpu_device_plugin_are_published_by_default() -> None:
    # NVIDIA time-slicing with renamed resources, the MIG mixed strategy, gpushare's plugin:
    # the kubelet gave these pods whole or shared cards; unpublished, they look free
    got = published_entries(OTHER_GPU_ENTRIES, None)
    assert sorted(e.pod_uid for e in got) == ["mig", "share", "ts"]


def test_the_gpu_resource_names_are_configurable() -> None:
    only_mig = GPUResourceNames.parse(" nvidia.com/mig-* , ")
    assert only_mig.patterns == ("nvidia.com/mig-*",)
    got = published_entries(OTHER_GPU_ENTRIES, None, only_mig)
    assert [e.pod_uid for e in got] == ["mig"]
    device = desired_device("n", Inventory(), OTHER_GPU_ENTRIES, None, gpu_resources=only_mig)
    assert [e.pod_uid for e in decode_devices_checkpoints(device.annotations[ANN])] == ["mig"]
    with pytest.raises(ValueError, match="no GPU resource name"):
        GPUResourceNames.parse(" , ")
    assert "nvidia.com/gpu" in DEFAULT_GPU_RESOURCES
    assert "koordinator.sh/gpu-memory-ratio" in DEFAULT_GPU_RESOURCES
    assert "rdma/hca" not in DEFAULT_GPU_RESOURCES
