"""``koord-scheduler simulate`` on the demo cluster: concrete placements, cards and outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from apis.allocation import decode_allocations
from scheduler.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "examples" / "demo-cluster.yaml"
CONFIG = ROOT / "config" / "scheduler-config.yaml"
ANNOTATION = "scheduling.koordinator.sh/device-allocated"

# pod -> (node, GPU minors): LeastAllocated picks the node; on it, Koordinator's GPU scope tree
# (every card reports PCIe/NUMA topology) packs cards beside those in use, tightest scope first.
EXPECTED = {
    "ml/batch-critical": ("gpu-a100-1", [0]),  # priority 1000 goes first
    "ml/notebook-bob": ("gpu-a100-1", [1]),
    "ml/inference-small": ("gpu-t4-0", [0]),
    "ml/bert-train": ("gpu-a100-1", [2]),
    "ml/llama-train-4gpu": ("gpu-a100-0", [4, 5, 6, 7]),  # one NUMA node, two PCIe switches
    "ml/a100-half": ("gpu-a100-1", [1]),  # shares notebook-bob's card: its switch is in use
    "ml/t4-inference": ("gpu-t4-1", [0]),  # the only pod tolerating the taint
    "web/web-frontend": ("cpu-1", []),
    "ml/embedder-mem-only": ("gpu-v100-0", [1]),
    "ml/dual-gpu-ratio": ("gpu-a100-1", [4, 5]),  # the first free PCIe switch of NUMA 1
}
FAILURES = {
    "ml/h100-only": "0/8 nodes are available: 1 node(s) had untolerated taint(s), "
    "1 node(s) were unschedulable, 6 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/8 nodes are available: 8 Preemption is not helpful for scheduling.",
    "ml/sixteen-gpus": "0/8 nodes are available: 1 node(s) had untolerated taint(s), "
    "1 node(s) were unschedulable, 4 Insufficient memory, 5 Insufficient cpu, "
    "6 Insufficient nvidia.com/gpu. preemption: 0/8 nodes are available: "
    "2 Preemption is not helpful for scheduling, 6 No preemption victims found for incoming pod.",
    "ml/core-only-invalid": "0/8 nodes are available: invalid resource device requests: "
    "[koordinator.sh/gpu-core]. "
    "preemption: 0/8 nodes are available: 8 Preemption is not helpful for scheduling.",
}


@pytest.fixture(scope="module")
def pods() -> dict[str, dict[str, object]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "simulate",
            str(DEMO),
            "-o",
            "json",
            "--config",
            str(CONFIG),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    items = json.loads(proc.stdout)["items"]
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in items}


@pytest.mark.parametrize(("key", "expected"), EXPECTED.items(), ids=list(EXPECTED))
def test_placement_and_cards(pods: dict[str, dict], key: str, expected: tuple) -> None:
    node, minors = expected
    pod = pods[key]
    assert pod["spec"]["nodeName"] == node
    annotation = pod["metadata"].get("annotations", {}).get(ANNOTATION)
    if not minors:
        assert annotation is None
        return
    allocations = decode_allocations(annotation)
    assert [a.minor for a in allocations["gpu"]] == minors
    assert all(a.id.startswith("GPU-") for a in allocations["gpu"])


@pytest.mark.parametrize(("key", "message"), FAILURES.items(), ids=list(FAILURES))
def test_unschedulable_pods_carry_the_condition(
    pods: dict[str, dict], key: str, message: str
) -> None:
    pod = pods[key]
    assert "nodeName" not in pod["spec"]
    assert pod["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]


def test_fractional_annotation_is_koordinator_bytes(pods: dict[str, dict]) -> None:
    assert pods["ml/notebook-bob"]["metadata"]["annotations"][ANNOTATION] == (
        '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50",'
        '"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"},'
        '"id":"GPU-a1000001-0001-4000-8000-000000000000"}]}'
    )


def test_running_pods_are_unchanged(pods: dict[str, dict]) -> None:
    assert pods["ml/llm-finetune"]["spec"]["nodeName"] == "gpu-a100-0"
    assert "conditions" not in pods["ml/llm-finetune"].get("status", {})


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert "ml/llama-train-4gpu   gpu-a100-0  gpu 4,5,6,7  Scheduled" in out
    assert "            3    A100-SXM4-80GB        UNHEALTHY  0/100     0/80Gi      -" in out
    assert "pods: 10 scheduled, 3 unschedulable (of 13 pending); 4 already running" in out
    assert f"ml/core-only-invalid: {FAILURES['ml/core-only-invalid']}" in out


def test_yaml_output_is_a_list_of_pods(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(DEMO), "-o", "yaml"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["kind"] == "List" and len(doc["items"]) == 17


def test_same_seed_same_placements(capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for _ in range(2):
        assert main(["simulate", str(DEMO), "--seed", "7", "-o", "json"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
