"""Koordinator's deviceshare scenarios black-box through ``koord-scheduler simulate``: each
case (``tests/unit/devices/koordinator/scenarios.json``) as a scenario file — its Node (the
totals koordlet would advertise), its Device CR, the pod already there, the pending pod with
the hints of its Go harness — and the placement's ``device-allocated`` compared with
Koordinator's expected allocation (card ids left out), or no placement where it expects an
error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cli import main
from tests.unit.devices.test_koordinator_scenarios import (
    CASES,
    FIXTURE,
    NODE,
    allocation_text,
    comparable,
    pod_annotations,
    pod_requests,
)

ANNOTATION = "scheduling.koordinator.sh/device-allocated"


def _node(device: dict[str, Any]) -> dict[str, Any]:
    devices = device["spec"]["devices"]
    gpus = sum(1 for d in devices if d["type"] == "gpu")
    nics = sum(1 for d in devices if d["type"] == "rdma")
    res = {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": str(gpus),
           "koordinator.sh/gpu-core": str(100 * gpus),
           "koordinator.sh/gpu-memory-ratio": str(100 * gpus),
           "koordinator.sh/gpu-memory": f"{83201216 * gpus}Ki",
           "koordinator.sh/rdma": str(100 * nics)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "status": {"capacity": res, "allocatable": res}}


def _pod(name: str, requests: dict[str, Any], annotations: dict[str, str],
         node: str | None = None) -> dict[str, Any]:
    amounts = {k: str(v) for k, v in requests.items()}
    container = {"name": "main", "image": "x",
                 "resources": {"requests": amounts, "limits": amounts}}
    spec: dict[str, Any] = {"schedulerName": "koord-scheduler", "containers": [container]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": spec}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['suite']}: {c['name']}" for c in CASES])
def test_through_simulate(case: dict[str, Any], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    device = FIXTURE["devices"][case["device"]]
    docs = [_node(device), {"apiVersion": "scheduling.koordinator.sh/v1alpha1", **device,
                            "kind": "Device"}]
    if case["assigned"]:
        docs.append(_pod("assigned-pod", {"nvidia.com/gpu": 1},
                         {ANNOTATION: allocation_text(case["assigned"])}, NODE))
    docs.append(_pod("p", pod_requests(case), pod_annotations(case)))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump_all(docs))
    assert main(["simulate", str(scenario), "-o", "json"]) == 0
    pods = {p["metadata"]["name"]: p for p in json.loads(capsys.readouterr().out)["items"]}
    placed = pods["p"]
    if case["wantErr"]:
        assert "nodeName" not in placed["spec"]
        return
    assert placed["spec"].get("nodeName") == NODE, placed.get("status")
    got = placed["metadata"]["annotations"][ANNOTATION]
    assert comparable(got) == comparable(allocation_text(case["want"]))
