"""``koord-scheduler simulate`` end to end: exit codes and one-line errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main

NODE = """apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "4", memory: 8Gi, pods: "10"}}
"""
POD = """apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  schedulerName: koord-scheduler
  containers: [{name: c, resources: {requests: {cpu: "%s"}}}]
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            NODE + "---\nkind: [unclosed\n",
            "document 2: malformed YAML at line 7, column 1",
            id="malformed-yaml",
        ),
        pytest.param(
            NODE + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
            "document 2: unsupported object apiVersion='apps/v1' kind='Deployment'",
            id="unknown-kind",
        ),
        pytest.param(
            NODE + "---\n" + POD % "2x",
            'document 2 (Pod p1): spec.containers[0].resources.requests.cpu: invalid quantity "2x"',
            id="invalid-quantity",
        ),
        pytest.param(
            NODE + "---\n" + POD % "1" + "---\n" + POD % "2",
            "document 3 (Pod p1): duplicate Pod 'default/p1' (first defined in document 2)",
            id="duplicate-name",
        ),
        pytest.param(
            NODE + "---\n- just\n- a list\n",
            "document 2: expected a Kubernetes object, got a list",
            id="not-an-object",
        ),
        pytest.param(
            "apiVersion: scheduling.koordinator.sh/v1alpha1\nkind: Device\nmetadata: {name: x}\n"
            "spec: {devices: [{type: gpu, minor: 0, resources: {koordinator.sh/gpu-core: '1'}}]}\n",
            "document 1 (Device x): no Node named 'x'",
            id="device-without-node",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    assert main(["simulate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"koord-scheduler: error: {path}: ")
    assert expected in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "/nonexistent/scenario.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(NODE)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
        "profiles:\n- schedulerName: koord-scheduler\n  plugins:\n    filter:\n"
        "      enabled: [{name: NoSuchPlugin}]\n"
    )
    assert main(["simulate", str(scenario), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown plugin 'NoSuchPlugin'" in err


def test_real_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: [")
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "simulate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("koord-scheduler: error: ")


def test_an_out_path_that_is_a_file_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` naming an existing file: one line, exit 2, before any replay runs (the
    error used to come after the whole replay, with its results lost)."""
    taken = tmp_path / "results"
    taken.write_text("")
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"  # never read: refused first
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--out", str(taken)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"koord-scheduler: error: --out {taken}: exists and is not a folder\n"
    )


@pytest.mark.parametrize(
    ("stdin", "code", "out", "err"),
    [
        pytest.param(NODE + "---\n" + POD % "1", 0, "default/p1", "", id="scenario"),
        pytest.param(
            NODE + "---\n" + POD % "2x",
            2,
            "",
            "koord-scheduler: error: <stdin>: document 2 (Pod p1): "
            'spec.containers[0].resources.requests.cpu: invalid quantity "2x"\n',
            id="bad-pod-names-stdin",
        ),
        pytest.param(
            b"\xff\xfe", 2, "", "koord-scheduler: error: <stdin>: not UTF-8 text\n", id="not-utf8"
        ),
    ],
)
def test_simulate_dash_reads_the_scenario_from_stdin(
    stdin: str | bytes,
    code: int,
    out: str,
    err: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    data = stdin.encode() if isinstance(stdin, str) else stdin
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    assert main(["simulate", "-"]) == code
    got_out, got_err = capsys.readouterr()
    assert out in got_out and got_err == err


# -- what the API server would refuse is refused, with one line naming the field ----------------

GPU_NODE = """apiVersion: v1
kind: Node
metadata: {name: g1}
status:
  allocatable: {cpu: "8", memory: 32Gi, pods: "10", nvidia.com/gpu: "2",
                koordinator.sh/gpu-core: "200", koordinator.sh/gpu-memory-ratio: "200",
                koordinator.sh/gpu-memory: 32Gi}
"""
GPU_DEVICE = """apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Device
metadata: {name: g1}
spec:
  devices:
  - {type: gpu, minor: 0, health: true, resources: {koordinator.sh/gpu-core: "100",
     koordinator.sh/gpu-memory-ratio: "100", koordinator.sh/gpu-memory: 16Gi}}
  - {type: gpu, minor: %s, health: true, resources: {koordinator.sh/gpu-core: "%s",
     koordinator.sh/gpu-memory-ratio: "100", koordinator.sh/gpu-memory: 16Gi}}
"""
GPU_POD = """apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  schedulerName: koord-scheduler
  containers: [{name: c, resources: %s}]
"""
_PFX = "document 3 (Pod p1): spec.containers[0].resources."


def _gpu(resources: str) -> str:
    return GPU_NODE + "---\n" + GPU_DEVICE % (1, 100) + "---\n" + GPU_POD % resources


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            _gpu("{limits: {nvidia.com/gpu: '0.5'}}"),
            _PFX + "limits.nvidia.com/gpu: must be an integer, got '0.5' (an extended resource)",
            id="half-an-nvidia-gpu",
        ),
        pytest.param(
            _gpu(
                "{requests: {koordinator.sh/gpu-core: 0.5}, limits: {koordinator.sh/gpu-core: 0.5}}"
            ),
            _PFX + "requests.koordinator.sh/gpu-core: must be an integer, got 0.5 "
            "(an extended resource)",
            id="fractional-gpu-core",
        ),
        pytest.param(
            _gpu(
                "{requests: {koordinator.sh/gpu-core: '50'}, "
                "limits: {koordinator.sh/gpu-core: '100'}}"
            ),
            _PFX + "requests.koordinator.sh/gpu-core: must be equal to koordinator.sh/gpu-core "
            "limit of '100', got '50' (extended resources are not overcommitted)",
            id="extended-request-below-limit",
        ),
        pytest.param(
            _gpu("{requests: {koordinator.sh/gpu-core: '50'}}"),
            _PFX + "requests.koordinator.sh/gpu-core: '50' has no limit: an extended resource "
            "needs resources.limits.koordinator.sh/gpu-core equal to its request "
            "(or a limit alone)",
            id="extended-request-without-limit",
        ),
        pytest.param(
            _gpu("{requests: {cpu: '2'}, limits: {cpu: '1'}}"),
            _PFX + "requests.cpu: must be less than or equal to cpu limit of '1'",
            id="cpu-request-over-limit",
        ),
        pytest.param(
            NODE + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p1}\n"
            "spec: {schedulerName: koord-scheduler, containerz: [{name: c}]}\n",
            "document 2 (Pod p1): spec.containerz: unknown field (known: ",
            id="misspelled-field",
        ),
        pytest.param(
            NODE + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p1, labelz: {a: b}}\n"
            "spec: {containers: [{name: c}]}\n",
            "document 2 (Pod p1): metadata.labelz: unknown field (known: ",
            id="misspelled-metadata-field",
        ),
        pytest.param(
            NODE + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p1}\n"
            "spec: {schedulerName: koord-scheduler, containers: []}\n",
            "document 2 (Pod p1): spec.containers: required: a pod has at least one container",
            id="no-containers",
        ),
        pytest.param(
            NODE + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p1}\n"
            "spec: {containers: [{image: x}]}\n",
            "document 2 (Pod p1): spec.containers[0].name: required (every container has a name)",
            id="container-without-name",
        ),
        pytest.param(
            GPU_NODE + "---\n" + GPU_DEVICE % (0, 100),
            "document 2 (Device g1): spec.devices[1].minor: duplicate gpu minor 0 "
            "(also spec.devices[0])",
            id="device-duplicate-minor",
        ),
        pytest.param(
            GPU_NODE + "---\n" + GPU_DEVICE % (1, -100),
            "document 2 (Device g1): spec.devices[1].resources.koordinator.sh/gpu-core: "
            "must be non-negative, got '-100'",
            id="device-negative-capacity",
        ),
        pytest.param(
            NODE.replace('pods: "10"}', "pods: \"10\", example.com/fpga: '1.5'}"),
            "document 1 (Node n1): status.allocatable.example.com/fpga: must be an integer, "
            "got '1.5' (an extended resource)",
            id="node-fractional-extended",
        ),
        pytest.param(
            NODE + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p1}\n"
            "spec:\n  containers: [{name: c}]\n  nodeName: n1\n  nodeName: n2\n",
            "document 2: duplicate key 'nodeName' at line 12, column 3",
            id="duplicate-yaml-key",
        ),
    ],
)
def test_what_the_api_server_refuses_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    assert main(["simulate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    line = f"koord-scheduler: error: {path}: {message}"
    if message.endswith("(known: "):
        assert err.startswith(line), err
    else:
        assert err == line + "\n"


def test_an_extended_limit_alone_is_also_the_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(_gpu("{limits: {nvidia.com/gpu: '1'}}"))
    assert main(["simulate", str(path)]) == 0
    assert "default/p1  g1" in capsys.readouterr().out


def _running(name: str, core: int, minor: int = 0) -> str:
    shares = {"koordinator.sh/gpu-core": str(core), "koordinator.sh/gpu-memory-ratio": str(core)}
    alloc = json.dumps({"gpu": [{"minor": minor, "resources": shares}]}, separators=(",", ":"))
    res = f"{{koordinator.sh/gpu-core: '{core}', koordinator.sh/gpu-memory-ratio: '{core}'}}"
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{scheduling.koordinator.sh/device-allocated: '{alloc}'}}
spec:
  schedulerName: koord-scheduler
  nodeName: g1
  containers: [{{name: c, resources: {{requests: {res}, limits: {res}}}}}]
status: {{phase: Running}}
"""


def test_a_pod_for_another_scheduler_is_listed_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: such a pod was reported "Unschedulable" (with "pod was not scheduled")."""
    other = (
        (GPU_POD % "{requests: {cpu: '1'}}")
        .replace("name: p1", "name: p2")
        .replace("schedulerName: koord-scheduler", "schedulerName: default-scheduler")
    )
    path = tmp_path / "scenario.yaml"
    path.write_text(_gpu("{requests: {cpu: '1'}}") + "---\n" + other)
    assert main(["simulate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Unschedulable" not in out and "UNSCHEDULABLE" not in out
    assert "PLACEMENTS (1 pods to schedule, in file order)" in out
    assert (
        "NOT FOR THIS SCHEDULER (spec.schedulerName names no profile of this configuration)\n"
        "default/p2: schedulerName 'default-scheduler' (profiles: koord-scheduler)\n"
    ) in out
    assert "pods: 1 scheduled, 0 unschedulable (of 1 pending); 0 already running; " in out
    assert "1 not for this scheduler" in out


def test_cards_overcommitted_by_running_pods_are_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: running pods whose annotations allocate more than a card holds were not
    flagged. A real cluster can be in that state, so it is a warning, not an error."""
    path = tmp_path / "scenario.yaml"
    path.write_text(
        GPU_NODE + "---\n" + GPU_DEVICE % (1, 100)
        + "---\n" + _running("a", 80) + "---\n" + _running("b", 60)
    )  # fmt: skip
    assert main(["simulate", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "WARNINGS (the input as given)\n"
        "node g1 gpu 0: running pods allocate koordinator.sh/gpu-core 140 of 100 "
        "(default/a, default/b)\n"
        "node g1 gpu 0: running pods allocate koordinator.sh/gpu-memory 24051816857 of "
        "17179869184 (default/a, default/b)\n"  # the ratio's share of the card's 16Gi
        "node g1 gpu 0: running pods allocate koordinator.sh/gpu-memory-ratio 140 of 100 "
        "(default/a, default/b)\n"
    ) in out
