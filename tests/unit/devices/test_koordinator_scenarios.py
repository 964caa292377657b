"""Koordinator's own deviceshare scenarios, one test each, through DeviceShare's Filter,
both Filter forms and Reserve: the same allocation (cards, per-card resources, the VFs
chosen) or the same refusal.

Facts from ``TestAutopilotAllocator``, ``TestAutopilotAllocatorWithExclusivePolicyAndRequiredScope``
and ``TestAllocateByTopology`` (koordinator-sh/koordinator, ``pkg/scheduler/plugins/
deviceshare``), extracted into ``koordinator/scenarios.json`` by ``koordinator/extract.py``:
each case's Device CR, what it asks (GPUs, RDMA, host network, exclusive policy, required
scope), the pod already on the node (``assigned``) and the expected ``DeviceAllocations``.
Each suite's pod is built as its Go harness builds it (hints, joint allocation). Card ids,
which this project adds to every entry, are left out of the comparison.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apis.allocation import (
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    decode_allocations,
    encode_allocations,
)
from apis.device import Device
from apis.hints import ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
from apis.quantity import Quantity
from tests.unit.devices.helpers import bound, gpu_pod, info, plugin_of, prefilter

FIXTURE = json.loads((Path(__file__).parent / "koordinator" / "scenarios.json").read_text())
NODE = "test-node-1"
SKIPPED = {
    # A Filter-phase shortcut (secondary devices of a well-planned node are checked at
    # Reserve only): the expectation is a Filter-phase partial result, not an allocation.
    "allocate 8 GPU and 4 VF; secondary device well planned",
}
CASES = [c for c in FIXTURE["cases"] if c["name"] not in SKIPPED]


def _vf_selector(vf_type: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "type", "operator": "In",
                                  "values": ["general", vf_type]}]}


def pod_annotations(case: dict[str, Any]) -> dict[str, str]:
    """The hints and joint rule each Go harness sets for its cases."""
    suite, gpus = case["suite"], case["gpuWanted"]
    rdma: dict[str, Any] = {"selector": {"matchLabels": {"type": "fakeW"}}}
    hints: dict[str, Any] = {"rdma": rdma}
    joint: dict[str, Any] | None = None
    same_pcie = {"requiredScope": "SamePCIe"} if suite != "autopilot" else {}
    if case["hostNetwork"]:
        rdma["allocateStrategy"] = "ApplyForAll"
        joint = {"deviceTypes": ["gpu", "rdma"], **same_pcie}
    elif gpus > 0:
        rdma["vfSelector"] = _vf_selector("fakeG")
        joint = {"deviceTypes": ["gpu", "rdma"], **same_pcie}
        if suite == "exclusive-scope":
            hints["gpu"] = {"exclusivePolicy": case["exclusivePolicy"]}
        if suite == "by-topology":
            hints["gpu"] = {"requiredTopologyScope": case["requiredTopologyScope"]}
    else:
        rdma["vfSelector"] = _vf_selector("fakeC")
    if suite != "autopilot" and not case["hostNetwork"]:
        rdma["exclusivePolicy"] = case["exclusivePolicy"]
    out = {ANNOTATION_DEVICE_ALLOCATE_HINT: json.dumps(hints)}
    if joint is not None:
        out[ANNOTATION_DEVICE_JOINT_ALLOCATE] = json.dumps(joint)
    return out


def pod_requests(case: dict[str, Any]) -> dict[str, Any]:
    requests: dict[str, Any] = {"koordinator.sh/rdma": 100 * case["rdmaWanted"] or 1}
    if case["gpuWanted"]:
        requests["nvidia.com/gpu"] = case["gpuWanted"]
    return requests


def allocation_text(allocations: dict[str, list[dict[str, Any]]]) -> str:
    """The Go test's ``json.Marshal(assignedDevices)``."""
    return encode_allocations({
        t: [DeviceAllocation(
            a["minor"], {k: Quantity.parse(v) for k, v in a["resources"].items()},
            extension=AllocationExtension(vfs=tuple(
                AllocatedVF(vf.get("minor", 0), vf["busID"]) for vf in a["vfs"]
            )) if a.get("vfs") else None,
        ) for a in items]
        for t, items in allocations.items()
    })


def comparable(text: str) -> dict[str, list[tuple[int, dict[str, int], list[tuple[int, str]]]]]:
    out = {}
    for t, items in decode_allocations(text).items():
        out[t] = sorted(
            (a.minor, {k: a.resource_value(k) for k in a.resources},
             [(vf.minor, vf.bus_id) for vf in (a.extension.vfs if a.extension else ())])
            for a in items
        )
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{c['suite']}: {c['name']}" for c in CASES])
def test_koordinator_scenario(case: dict[str, Any]) -> None:
    device = Device.from_dict(FIXTURE["devices"][case["device"]])
    assert device.name == NODE
    assigned = []
    if case["assigned"]:
        assigned.append(bound(gpu_pod("assigned-pod", {"nvidia.com/gpu": 1}), NODE,
                              allocation_text(case["assigned"])))
    plugin, snapshot = plugin_of([device], assigned)
    pod = gpu_pod("p", pod_requests(case), pod_annotations(case)).build()
    state, status = prefilter(plugin, pod)
    assert status is None
    status = plugin.filter(state, pod, info(snapshot, NODE))
    mask = plugin.filter_nodes(state, pod, snapshot)
    assert bool(mask[snapshot.index[NODE]]) == (status is None)
    if case["wantErr"]:
        assert status is not None
        return
    assert status is None, status.reasons
    assert plugin.reserve(state, pod, NODE) is None
    got = plugin.entry(state)
    assert got is not None
    assert comparable(got.annotation) == comparable(allocation_text(case["want"]))
