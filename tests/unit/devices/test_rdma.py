"""RDMA NICs and their SR-IOV VFs in the allocator and the ledger, the wire form of VF
allocations, Koordinator's topology binpack without hints, and the HAMi-core check."""

from __future__ import annotations

import json
from typing import Any

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    decode_allocations,
    encode_allocations,
    read_allocations,
)
from apis.device import Device
from apis.hints import ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
from apis.quantity import Quantity
from scheduler.devices.request import CardUse, held_uses
from scheduler.framework.events import Change
from scheduler.framework.status import Code
from scheduler.plugins.deviceshare.plugin import ERR_HAMI_CORE
from tests.builders import make_node
from tests.unit.devices.helpers import (
    bound,
    device,
    gpu,
    gpu_alloc,
    gpu_pod,
    info,
    nic,
    plugin_of,
    prefilter,
    vf_bus,
)
from tests.unit.devices.test_koordinator_scenarios import FIXTURE

# Go 1.19's json.Marshal of Koordinator's DeviceAllocations (struct mirrors of
# apis/extension/device_share.go: VirtualFunction{Minor int `minor,omitempty`; BusID string
# `busID,omitempty`}; resources as Quantity strings), run on the dev VM on 2026-11-27.
GO_MARSHALLED = (
    '{"gpu":[{"minor":4,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory"'
    ':"83201216Ki","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-ac53dc25"}],"rdma":[{"mino'
    'r":1,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:1f:00.0","extension":{"vfs":[{"busI'
    'D":"0000:1f:00.2"}]}},{"minor":3,"resources":{"koordinator.sh/rdma":"1"},"extension":{"vfs"'
    ':[{"minor":1,"busID":"0000:51:00.3"}]}},{"minor":0,"resources":{"koordinator.sh/rdma":"1"},'
    '"extension":{"vfs":[{"minor":-1,"busID":"0000:20:00.0"}]}}]}'
)
VF_HINT = {ANNOTATION_DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{}}}'}


def _rdma(minor: int, vf_minor: int, bus: str, id: str = "") -> DeviceAllocation:
    return DeviceAllocation.from_ints(minor, {"koordinator.sh/rdma": 1}, id,
                                      AllocationExtension(vfs=(AllocatedVF(vf_minor, bus),)))


def test_vf_allocations_encode_as_go_json_marshal() -> None:
    gpu4 = DeviceAllocation(4, {"koordinator.sh/gpu-core": Quantity.parse("100"),
                                "koordinator.sh/gpu-memory-ratio": Quantity.parse("100"),
                                "koordinator.sh/gpu-memory": Quantity.parse("83201216Ki")},
                            "GPU-ac53dc25")
    allocs = {"gpu": [gpu4], "rdma": [
        _rdma(1, 0, "0000:1f:00.2", "0000:1f:00.0"), _rdma(3, 1, "0000:51:00.3"),
        _rdma(0, -1, "0000:20:00.0"),
    ]}
    assert encode_allocations(allocs) == GO_MARSHALLED


def test_koordinator_vf_annotation_decodes_and_holds_its_vfs() -> None:
    decoded = decode_allocations(GO_MARSHALLED)
    ext = decoded["rdma"][0].extension
    assert ext is not None and ext.vfs == (AllocatedVF(0, "0000:1f:00.2"),)
    assert encode_allocations(decoded) == GO_MARSHALLED  # and back, byte for byte
    uses = {u.minor: u for u in held_uses(read_allocations(GO_MARSHALLED), None)
            if u.device_type == "rdma"}
    assert uses[3].vfs == ((1, "0000:51:00.3"),)
    assert uses[0].vfs == ((-1, "0000:20:00.0"),)


def _nic_node(vfs: int = 3) -> Device:
    return device("n", gpu(0, pcie="0"), nic("rdma", 0, pcie="0", vfs=vfs))


def _vf_of(annotation: str) -> list[tuple[int, str]]:
    return [(vf.minor, vf.bus_id) for a in decode_allocations(annotation)["rdma"]
            for vf in (a.extension.vfs if a.extension else ())]


def test_reserve_writes_the_vf_and_the_next_pod_gets_the_next_vf() -> None:
    plugin, _ = plugin_of([_nic_node()])
    first, second = (gpu_pod(n, {"koordinator.sh/rdma": 1}, VF_HINT).build() for n in "ab")
    s1, _ = prefilter(plugin, first)
    assert plugin.reserve(s1, first, "n") is None
    entry = plugin.entry(s1)
    assert entry is not None
    assert entry.annotation == (
        '{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"rdma-0",'
        '"extension":{"vfs":[{"busID":"0000:10:00.1"}]}}]}'
    )
    s2, _ = prefilter(plugin, second)
    assert plugin.reserve(s2, second, "n") is None
    second_entry = plugin.entry(s2)
    assert second_entry is not None
    assert _vf_of(second_entry.annotation) == [(1, vf_bus(0, 1))]
    plugin.unreserve(s1, first, "n")  # the first VF is free again
    s3, _ = prefilter(plugin, first)
    assert plugin.reserve(s3, first, "n") is None
    third = plugin.entry(s3)
    assert third is not None and _vf_of(third.annotation) == [(0, vf_bus(0, 0))]


def test_vfs_held_by_bound_pods_are_skipped_until_they_go() -> None:
    held = encode_allocations({"rdma": [_rdma(0, 0, vf_bus(0, 0))]})
    holder = bound(gpu_pod("holder", {"koordinator.sh/rdma": 1}), "n", held)
    plugin, snapshot = plugin_of([_nic_node(vfs=1)], [holder])
    pod = gpu_pod("p", {"koordinator.sh/rdma": 1}, VF_HINT).build()
    state, _ = prefilter(plugin, pod)
    status = plugin.filter(state, pod, info(snapshot, "n"))
    assert status is not None and status.reasons == ("Insufficient rdma devices",)
    plugin.ledger.apply_change(Change("Pod", holder, None))
    state, _ = prefilter(plugin, pod)
    assert plugin.filter(state, pod, info(snapshot, "n")) is None


def test_a_best_ranked_nic_without_a_free_vf_is_passed_over() -> None:
    """NIC 0 ranks first (least allocated) but its only VF is held: the pod gets NIC 1's VF —
    the search goes on past a card without a free VF, it does not stop there."""
    two_nics = device("n", nic("rdma", 0, vfs=1), nic("rdma", 1, vfs=1))
    vf_holder = bound(gpu_pod("holder", {}), "n",
                      encode_allocations({"rdma": [_rdma(0, 0, vf_bus(0, 0))]}))
    busy = bound(gpu_pod("busy", {}), "n",
                 '{"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"50"}}]}')
    plugin, snapshot = plugin_of([two_nics], [vf_holder, busy])
    pod = gpu_pod("p", {"koordinator.sh/rdma": 1}, VF_HINT).build()
    state, _ = prefilter(plugin, pod)
    assert plugin.filter(state, pod, info(snapshot, "n")) is None
    assert plugin.reserve(state, pod, "n") is None
    entry = plugin.entry(state)
    assert entry is not None
    assert [(a.minor, a.extension.vfs if a.extension else ())
            for a in decode_allocations(entry.annotation)["rdma"]] == \
        [(1, (AllocatedVF(0, vf_bus(1, 0)),))]
    # without the busy pod NIC 1 ranks no better, and the answer is the same
    without_busy, _ = plugin_of([two_nics], [vf_holder])
    state, _ = prefilter(without_busy, pod)
    assert without_busy.reserve(state, pod, "n") is None
    got = without_busy.entry(state)
    assert got is not None and _vf_of(got.annotation) == [(0, vf_bus(1, 0))]


def test_no_vf_groups_is_unresolvable() -> None:
    plugin, snapshot = plugin_of([_nic_node(vfs=0)])
    pod = gpu_pod("p", {"koordinator.sh/rdma": 1}, VF_HINT).build()
    state, _ = prefilter(plugin, pod)
    status = plugin.filter(state, pod, info(snapshot, "n"))
    assert status is not None and status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.reasons == ("Insufficient rdma VirtualFunctions",)


def test_designated_vf_is_the_one_given_and_filter_checks_it() -> None:
    designated = encode_allocations({"rdma": [_rdma(0, 2, vf_bus(0, 2))]})
    pod = gpu_pod("p", {"koordinator.sh/rdma": 1},
                  {**VF_HINT, ANNOTATION_DEVICE_ALLOCATED: designated}).build()
    plugin, snapshot = plugin_of([_nic_node()])
    state, _ = prefilter(plugin, pod)
    assert plugin.filter(state, pod, info(snapshot, "n")) is None
    assert plugin.reserve(state, pod, "n") is None
    entry = plugin.entry(state)
    assert entry is not None and _vf_of(entry.annotation) == [(2, vf_bus(0, 2))]
    # Someone else holds it now: the designated allocation no longer fits.
    holder = bound(gpu_pod("holder", {"koordinator.sh/rdma": 1}), "n",
                   encode_allocations({"rdma": [_rdma(0, 2, vf_bus(0, 2))]}))
    plugin, snapshot = plugin_of([_nic_node()], [holder])
    state, _ = prefilter(plugin, pod)
    status = plugin.filter(state, pod, info(snapshot, "n"))
    assert status is not None and status.reasons == ("Insufficient rdma devices",)
    assert not plugin.filter_nodes(state, pod, snapshot)[snapshot.index["n"]]


def test_a_pending_pods_malformed_allocation_is_one_clear_error() -> None:
    plugin, _ = plugin_of([_nic_node()])
    pod = gpu_pod("p", {"koordinator.sh/rdma": 1},
                  {ANNOTATION_DEVICE_ALLOCATED: '{"rdma":[{"minor":"x"}]}'}).build()
    _, status = prefilter(plugin, pod)
    assert status is not None and status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.reasons == (
        "invalid scheduling.koordinator.sh/device-allocated annotation: rdma[0].minor: "
        "expected an integer, got string",
    )


def _koordinator_node_with_gpu5_used() -> tuple[Any, Any]:
    cr = Device.from_dict(FIXTURE["devices"]["device-1"])
    used = bound(gpu_pod("used", {"nvidia.com/gpu": 1}), "test-node-1",
                 gpu_alloc(5, 100, 85198045184, 100))
    return plugin_of([cr], [used])


def test_topology_binpack_without_any_hint() -> None:
    """TestAllocateByTopology's node (GPU 5 used, on NUMA 1 / PCIe 2) without hints or a
    joint rule: GPU 4, beside the used one, as Koordinator's GPU allocator places it."""
    for hints in ({}, {ANNOTATION_DEVICE_ALLOCATE_HINT: '{"gpu":{"exclusivePolicy":"PCIeLevel"}}'}):
        plugin, _ = _koordinator_node_with_gpu5_used()
        pod = gpu_pod("p", {"nvidia.com/gpu": 1}, hints).build()
        state, _ = prefilter(plugin, pod)
        assert plugin.reserve(state, pod, "test-node-1") is None
        entry = plugin.entry(state)
        assert entry is not None
        assert [a.minor for a in decode_allocations(entry.annotation)["gpu"]] == [4]


def test_joint_gpu_and_vf_follow_the_binpacked_gpu() -> None:
    """The same node, one GPU and one VF jointly: GPU 4 and NIC 3 (its PCIe switch)."""
    plugin, _ = _koordinator_node_with_gpu5_used()
    pod = gpu_pod("p", {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 1}, {
        ANNOTATION_DEVICE_ALLOCATE_HINT: json.dumps({"rdma": {"vfSelector": {}}}),
        ANNOTATION_DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"]}',
    }).build()
    state, _ = prefilter(plugin, pod)
    assert plugin.reserve(state, pod, "test-node-1") is None
    entry = plugin.entry(state)
    assert entry is not None
    got = decode_allocations(entry.annotation)
    assert [a.minor for a in got["gpu"]] == [4]
    assert [a.minor for a in got["rdma"]] == [3] and _vf_of(entry.annotation) == [
        (0, "0000:51:00.2")]


def _hami_cluster(node_label: str | None) -> tuple[Any, Any]:
    plugin, snapshot = plugin_of([device("n", gpu(0))])
    node = make_node("n").cpu("64")
    if node_label is not None:
        node.label("koordinator.sh/gpu-isolation-provider", node_label)
    snapshot.set_node(node.build())
    return plugin, snapshot


def test_hami_core_pod_on_a_node_without_hami_core_is_an_error() -> None:
    pod = (gpu_pod("p", {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50})
           .label("koordinator.sh/gpu-isolation-provider", "HAMi-core").build())
    plugin, snapshot = _hami_cluster(None)
    state, _ = prefilter(plugin, pod)
    status = plugin.filter(state, pod, info(snapshot, "n"))
    assert status is not None and status.code == Code.ERROR
    assert status.message == ERR_HAMI_CORE
    assert not plugin.filter_nodes(state, pod, snapshot)[snapshot.index["n"]]
    plugin, snapshot = _hami_cluster("HAMi-core")
    state, _ = prefilter(plugin, pod)
    assert plugin.filter(state, pod, info(snapshot, "n")) is None
    assert plugin.filter_nodes(state, pod, snapshot)[snapshot.index["n"]]


def test_isolation_check_leaves_whole_gpus_and_gemini_alone() -> None:
    plugin, snapshot = _hami_cluster(None)
    for label, requests in (("HAMi-core", {"nvidia.com/gpu": 1}),
                            ("Gemini", {"koordinator.sh/gpu-core": 50,
                                        "koordinator.sh/gpu-memory-ratio": 50})):
        pod = gpu_pod("p", requests).label("koordinator.sh/gpu-isolation-provider",
                                           label).build()
        state, _ = prefilter(plugin, pod)
        assert plugin.filter(state, pod, info(snapshot, "n")) is None, label


def test_card_use_equality_includes_vfs() -> None:
    a = CardUse.of("rdma", 0, {"koordinator.sh/rdma": 1}, ((0, "x"),))
    b = CardUse.of("rdma", 0, {"koordinator.sh/rdma": 1}, ((1, "y"),))
    assert a != b and a.sort_key() != b.sort_key()
