"""``koord-scheduler simulate`` on the RDMA demo (config/examples/demo-rdma.yaml): GPUs and
SR-IOV VFs chosen together as Koordinator's DeviceShare chooses them, VFs in the annotation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from apis.allocation import decode_allocations

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "examples" / "demo-rdma.yaml"
ANNOTATION = "scheduling.koordinator.sh/device-allocated"

# pod -> (GPU minors, [(NIC minor, VF bus id)]), as the demo's header explains them.
EXPECTED = {
    "ml/train-1gpu-vf": ([4], [(3, "0000:51:00.3")]),
    "ml/train-4gpu-numa": ([0, 1, 2, 3], [(1, "0000:1f:00.2"), (2, "0000:90:00.2")]),
    "ml/train-pinned-vf": ([], [(4, "0000:b9:00.4")]),
}


@pytest.fixture(scope="module")
def pods() -> dict[str, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "simulate", str(DEMO), "-o", "json"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )
    items = json.loads(proc.stdout)["items"]
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in items}


@pytest.mark.parametrize(("key", "expected"), EXPECTED.items(), ids=list(EXPECTED))
def test_gpus_and_vfs(pods: dict[str, dict], key: str, expected: tuple) -> None:
    pod = pods[key]
    assert pod["spec"]["nodeName"] == "gpu-h800-rdma-0"
    got = decode_allocations(pod["metadata"]["annotations"][ANNOTATION])
    assert [a.minor for a in got.get("gpu", [])] == expected[0]
    vfs = [(a.minor, vf.bus_id) for a in got["rdma"]
           for vf in (a.extension.vfs if a.extension else ())]
    assert vfs == expected[1]


def test_hami_core_without_the_node_label_is_a_scheduler_error(pods: dict[str, dict]) -> None:
    pod = pods["ml/hami-half"]
    assert "nodeName" not in pod["spec"]
    assert pod["status"]["conditions"] == [{
        "type": "PodScheduled", "status": "False", "reason": "SchedulerError",
        "message": "GPUIsolationProviderHAMICore not found on the node",
    }]
