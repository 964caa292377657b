"""``koord-scheduler simulate`` end to end: exit codes and one-line errors on bad input."""

from __future__ import annotations

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
