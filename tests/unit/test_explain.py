"""``koord-scheduler explain`` (scheduler/observability/explain.py through the CLI's ``--file``
path): per-node filter verdicts, per-card free against need, the preemption what-if, the closest
candidates, table and JSON, and one-line user errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler import cli

GIB = 1024**3
ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def _node(name: str, gpus: int, taint: bool = False) -> dict[str, Any]:
    alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    if gpus:
        alloc |= {
            "koordinator.sh/gpu-core": str(100 * gpus),
            "koordinator.sh/gpu-memory-ratio": str(100 * gpus),
            "koordinator.sh/gpu-memory": str(16 * GIB * gpus),
        }
    spec = {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]} if taint else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"capacity": alloc, "allocatable": alloc},
    }


def _device(name: str, gpus: int, unhealthy: tuple[int, ...] = ()) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {
            "devices": [
                {
                    "type": "gpu",
                    "id": f"GPU-{name}-{m}",
                    "minor": m,
                    "health": m not in unhealthy,
                    "resources": {
                        "koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": "16Gi",
                        "koordinator.sh/gpu-memory-ratio": "100",
                    },
                }
                for m in range(gpus)
            ]
        },
    }


def _pod(name: str, core: int, priority: int = 0, node: str = "", minor: int = 0) -> dict[str, Any]:
    limits = {"koordinator.sh/gpu-core": str(core), "koordinator.sh/gpu-memory-ratio": str(core)}
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    spec: dict[str, Any] = {
        "schedulerName": "koord-scheduler",
        "priority": priority,
        "containers": [
            {"name": "c", "image": "x", "resources": {"limits": limits, "requests": limits}}
        ],
    }
    if node:
        spec["nodeName"] = node
        alloc = {"gpu": [{"minor": minor, "resources": {
            "koordinator.sh/gpu-core": str(core),
            "koordinator.sh/gpu-memory-ratio": str(core),
            "koordinator.sh/gpu-memory": str(core * 16 * GIB // 100)}}]}  # fmt: skip
        meta["annotations"] = {ALLOCATED: json.dumps(alloc)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    docs = [
        _node("busy", 2), _device("busy", 2),  # 170 of 200 gpu-core held by low-priority pods
        _node("sick", 2), _device("sick", 2, unhealthy=(0,)),  # card 1 held by a high-priority pod
        _node("tainted", 2, taint=True), _device("tainted", 2),
        _node("cpu", 0),
        _pod("low-a", 100, priority=1, node="busy", minor=0),
        _pod("low-b", 60, priority=1, node="busy", minor=1),
        _pod("vip", 100, priority=1000, node="sick", minor=1),
        _pod("pending", 80, priority=100),
        _pod("other", 10, priority=0, node="busy", minor=1),
    ]  # fmt: skip
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _explain(
    cluster: Path, *extra: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = cli.main(["explain", "ml/pending", "--file", str(cluster), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_per_node_per_card_and_preemption(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _explain(cluster, "-o", "json", capsys=capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["pod"], doc["priority"], doc["cards_needed"], doc["need_core"]) == (
        "ml/pending",
        100,
        1,
        80,
    )
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert set(nodes) == {"busy", "sick", "tainted", "cpu"}
    assert not any(n["fits"] for n in nodes.values())
    cases = {  # node: (filter, free core per card, fits after preemption, victims)
        # the scheduler's minimal victims: low-b's 60 frees card 1 (30 + 60 >= 80)
        "busy": ("NodeResourcesFit", [0, 30], True, ["ml/low-b"]),
        "sick": ("DeviceShare", [100, 0], False, []),
        "tainted": ("TaintToleration", [100, 100], False, []),
        "cpu": ("NodeResourcesFit", [], False, []),
    }
    for name, (plugin, free, after, victims) in cases.items():
        n = nodes[name]
        assert n["plugin"] == plugin, (name, n)
        assert [c["free_core"] for c in n["cards"]] == free, name
        assert n["fits_after_preemption"] is after, name
        assert n["victims"] == victims, name
    sick = nodes["sick"]["cards"]
    assert [(c["healthy"], c["fits"]) for c in sick] == [(False, False), (True, False)]
    assert doc["closest"][0] == "busy"
    assert (doc["preempt_node"], doc["preempt_victims"]) == ("busy", ["ml/low-b"])


def test_table(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _explain(cluster, capsys=capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "pod ml/pending (profile koord-scheduler, priority 100)"
    busy = next(ln for ln in lines if ln.startswith("busy "))
    assert "NodeResourcesFit" in busy and "yes, evicting ml/low-b" in busy
    assert "(unhealthy)" in next(ln for ln in lines if ln.startswith("sick "))
    assert lines[-1].startswith("closest candidates: busy")


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ("ml/nope", "pod ml/nope not found"),
        ("ml/vip", "pod ml/vip is already bound to node sick"),
        ("pending", "expected NAMESPACE/POD, got 'pending'"),
    ],
    ids=["missing", "bound", "no-namespace"],
)
def test_user_errors_are_one_line(
    cluster: Path, capsys: pytest.CaptureFixture[str], pod: str, message: str
) -> None:
    assert cli.main(["explain", pod, "--file", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert err == f"koord-scheduler: error: {message}\n"


def test_closest_candidates_leave_out_cordoned_nodes_and_other_gpu_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod asking for one GPU model (a nodeSelector on ``node.koordinator.sh/gpu-model``):
    a node of another model and a cordoned node are never "closest" — no eviction makes the
    pod fit there — though their cards are the emptiest."""
    def labelled(name: str, model: str, cordoned: bool = False) -> dict[str, Any]:
        node = _node(name, 2)
        node["metadata"]["labels"]["node.koordinator.sh/gpu-model"] = model
        if cordoned:
            node["spec"]["unschedulable"] = True
        return node

    pending = _pod("pending", 80, priority=100)
    pending["spec"]["nodeSelector"] = {"node.koordinator.sh/gpu-model": "A100"}
    docs = [
        labelled("a100-busy", "A100"), _device("a100-busy", 2),
        labelled("a100-cordoned", "A100", cordoned=True), _device("a100-cordoned", 2),
        labelled("t4-idle", "T4"), _device("t4-idle", 2),
        _pod("low-a", 100, priority=1, node="a100-busy", minor=0),
        _pod("low-b", 100, priority=1, node="a100-busy", minor=1),
        pending,
    ]  # fmt: skip
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, out, err = _explain(path, "-o", "json", capsys=capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["closest"] == ["a100-busy"], doc["closest"]
