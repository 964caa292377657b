"""Gangs kept on one node (network-topology-spec MustGather at NodeTopologyLayer), in the real
scheduler on the in-memory cluster with DeviceShare: the node is chosen for the whole gang's
cards, and the members' cards together are the best-connected set there."""

from __future__ import annotations

import json
import random

import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, decode_allocations
from apis.core import Pod
from apis.device import Device
from apis.gang import GangSpecError, gang_of
from apis.partition import POLICY_HONOR
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.plugins.deviceshare import new_deviceshare
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from tests.builders import make_node, make_pod
from tests.unit.devices.helpers import (
    GI,
    gpu_alloc,
    gpu_pod,
    hopper_table,
    nvswitch_topology,
    pairs_topology,
    topology_node,
)

OURS = "koord-scheduler"
G = "gang.scheduling.koordinator.sh"
SAME_NODE = json.dumps(
    {"gatherStrategy": [{"layer": "NodeTopologyLayer", "strategy": "MustGather"}]}
)
CS, DS = {"name": "Coscheduling"}, {"name": "DeviceShare"}
CONFIG = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": OURS,
            "plugins": {
                "queueSort": {"enabled": [CS], "disabled": [{"name": "*"}]},
                "preFilter": {"enabled": [DS, CS]},
                "filter": {"enabled": [DS, CS]},
                "preScore": {"enabled": [DS, CS]},
                "score": {"enabled": [DS, CS]},
                "reserve": {"enabled": [DS, CS]},
                "permit": {"enabled": [CS]},
                "preBind": {"enabled": [DS]},
            },
        }
    ],
}


def _cluster(devices: list[Device], used: dict[str, list[int]]) -> tuple[InMemoryCluster,
                                                                          Scheduler]:
    cluster = InMemoryCluster()
    for d in devices:
        n = len(d.devices)
        cluster.apply_node(
            make_node(d.name).cpu("64").memory("512Gi").gpu_resources(n, nvidia=True).obj()
        )
        cluster.apply_device(d.to_dict())
    for node, minors in used.items():
        for m in minors:
            pod = (
                gpu_pod(f"{node}-used-{m}", {"nvidia.com/gpu": 1})
                .node(node)
                .annotation(ANNOTATION_DEVICE_ALLOCATED, gpu_alloc(m, 100, 80 * GI, 100))
            )
            cluster.apply_pod(pod.obj())
    sched = Scheduler(
        parse_config(CONFIG),
        cluster,
        in_tree_registry() | {"DeviceShare": new_deviceshare},
        default_plugins(),
        clock=SimulatedClock(),
        rng=random.Random(0),
        bind_workers=4,
    )
    return cluster, sched


def _member(name: str, gang: str, members: int, gpus: int, same_node: bool = True
            ) -> dict[str, object]:
    b = (
        make_pod(name)
        .req(cpu="1")
        .req({"nvidia.com/gpu": str(gpus)})
        .uid(f"uid-{name}")
        .scheduler(OURS)
        .annotation(f"{G}/name", gang)
        .annotation(f"{G}/min-available", str(members))
    )
    if same_node:
        b = b.annotation(f"{G}/network-topology-spec", SAME_NODE)
    return b.obj()


def _placed(cluster: InMemoryCluster, prefix: str) -> dict[str, tuple[str, list[int]]]:
    out: dict[str, tuple[str, list[int]]] = {}
    for p in cluster.pods.values():
        if p.name.startswith(prefix) and p.node_name:
            allocs = decode_allocations(p.annotations[ANNOTATION_DEVICE_ALLOCATED])
            out[p.name] = (p.node_name, sorted(a.minor for a in allocs["gpu"]))
    return out


def _run(cluster: InMemoryCluster, sched: Scheduler) -> None:
    try:
        sched.run_until_idle(timeout=30)
        sched.wait_for_writes()
    finally:
        sched.close()


def test_gang_goes_where_its_cards_are_best_connected() -> None:
    # a100: 6 free cards in NVLink pairs (0,1), (6,7) and halves 3, 5: emptier, and each
    # member alone would get a whole NVLink pair there, but any 4 of them cross sockets.
    # h100: 4 free cards on NVSwitch. small: 3 free NVSwitch cards, too few for the gang.
    cluster, sched = _cluster(
        [
            topology_node("a100", 8, pairs_topology(8)),
            topology_node("h100", 8, nvswitch_topology(8)),
            topology_node("small", 4, nvswitch_topology(4)),
        ],
        {"a100": [2, 4], "h100": [0, 1, 2, 3], "small": [0]},
    )
    for i in range(2):
        cluster.apply_pod(_member(f"w{i}", "train", 2, 2))
    _run(cluster, sched)
    placed = _placed(cluster, "w")
    assert len(placed) == 2 and {node for node, _ in placed.values()} == {"h100"}
    assert sorted(c for _, cards in placed.values() for c in cards) == [4, 5, 6, 7]


def test_members_share_the_planned_set_on_the_first_members_node() -> None:
    # One node with a Hopper partition table, honored: cards 1 and 4 used, so only the pairs
    # (2,3) and (6,7) are free partitions of 2, and no block of 4 is free. A gang of two
    # 1-GPU members is planned as a pair partition and both land in it.
    cluster, sched = _cluster(
        [topology_node("h", 8, nvswitch_topology(8), hopper_table(), POLICY_HONOR)],
        {"h": [1, 4]},
    )
    for i in range(2):
        cluster.apply_pod(_member(f"m{i}", "pair", 2, 1))
    _run(cluster, sched)
    placed = _placed(cluster, "m")
    assert len(placed) == 2
    assert sorted(c for _, cards in placed.values() for c in cards) == [2, 3]


def test_a_gang_that_fits_no_single_node_is_unschedulable() -> None:
    # Each node has 2 free cards; the gang needs 4 on one node.
    cluster, sched = _cluster(
        [topology_node("x", 4, nvswitch_topology(4)), topology_node("y", 4, nvswitch_topology(4))],
        {"x": [0, 1], "y": [0, 1]},
    )
    for i in range(2):
        cluster.apply_pod(_member(f"w{i}", "train", 2, 2))
    try:
        sched.run_until_idle(timeout=30)
    finally:
        sched.close()
    assert _placed(cluster, "w") == {}
    assert "gang default/train needs 4 GPUs on one node" in sched.failures["default/w0"]


def test_without_the_spec_members_may_spread() -> None:
    cluster, sched = _cluster(
        [topology_node("x", 4, nvswitch_topology(4)), topology_node("y", 4, nvswitch_topology(4))],
        {"x": [0, 1], "y": [0, 1]},
    )
    for i in range(2):
        cluster.apply_pod(_member(f"w{i}", "train", 2, 2, same_node=False))
    _run(cluster, sched)
    assert sorted(node for node, _ in _placed(cluster, "w").values()) == ["x", "y"]


def _spec_pod(spec: str) -> Pod:
    return (
        make_pod("p")
        .annotation(f"{G}/name", "g")
        .annotation(f"{G}/min-available", "1")
        .annotation(f"{G}/network-topology-spec", spec)
        .build()
    )


@pytest.mark.parametrize(
    ("spec", "same_node"),
    [
        pytest.param(SAME_NODE, True, id="must-gather-node"),
        pytest.param('{"gatherStrategy":[{"layer":"NodeTopologyLayer",'
                     '"strategy":"PreferGather"}]}', False, id="prefer-gather-node"),
        pytest.param('{"gatherStrategy":[{"layer":"BlockLayer","strategy":"MustGather"}]}',
                     False, id="other-layer"),
        pytest.param("{}", False, id="empty"),
    ],
)
def test_network_topology_spec(spec: str, same_node: bool) -> None:
    got = gang_of(_spec_pod(spec))
    assert got is not None and got.same_node is same_node


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("nope", id="not-json"),
        pytest.param("[]", id="not-object"),
        pytest.param('{"gatherStrategy":{}}', id="not-list"),
        pytest.param('{"gatherStrategy":[{"strategy":"MustGather"}]}', id="no-layer"),
        pytest.param('{"gatherStrategy":[{"layer":"NodeTopologyLayer","strategy":"Must"}]}',
                     id="bad-strategy"),
    ],
)
def test_network_topology_spec_errors(spec: str) -> None:
    with pytest.raises(GangSpecError, match="network-topology-spec"):
        gang_of(_spec_pod(spec))
