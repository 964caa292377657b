"""``koord-scheduler simulate`` on the interconnect demo (config/examples/demo-topology.yaml):
NVLink-aware node and card choice, partition tables with a bandwidth spec, a gang kept on one
node, and the Honor policy's reason."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from apis.allocation import decode_allocations
from scheduler.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "examples" / "demo-topology.yaml"
CONFIG = ROOT / "config" / "examples" / "demo-topology-config.yaml"
ANNOTATION = "scheduling.koordinator.sh/device-allocated"

EXPECTED = {
    "ml/pair-job": ("gpu-a100-nvl-1", [4, 5]),  # the node with a free NVLink pair
    "ml/bandwidth-strict": ("gpu-h100-0", [2, 3]),  # 450G partition, next to busy card 1
    "ml/train-0": ("gpu-h100-1", [0, 1]),  # the gang's 4-card block
    "ml/train-1": ("gpu-h100-1", [2, 3]),
}


@pytest.fixture(scope="module")
def pods() -> dict[str, dict[str, object]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", str(DEMO), "--config", str(CONFIG), "-o", "json"]) == 0
    items = json.loads(out.getvalue())["items"]
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in items}


@pytest.mark.parametrize(("key", "expected"), EXPECTED.items(), ids=list(EXPECTED))
def test_placement_and_cards(pods: dict[str, dict], key: str, expected: tuple) -> None:
    node, minors = expected
    pod = pods[key]
    assert pod["spec"]["nodeName"] == node
    allocations = decode_allocations(pod["metadata"]["annotations"][ANNOTATION])
    assert [a.minor for a in allocations["gpu"]] == minors


def test_three_gpus_on_honor_nodes_is_unsupported(pods: dict[str, dict]) -> None:
    pod = pods["ml/three-gpus"]
    assert "nodeName" not in pod["spec"]
    assert pod["status"]["conditions"][0]["message"] == (
        "0/4 nodes are available: 2 node(s) Unsupported number of GPU requests, "
        "2 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    )
