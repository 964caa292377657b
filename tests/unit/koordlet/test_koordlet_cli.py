"""koordlet.cli: `koordlet report --once` end to end in a subprocess, user errors, `run`'s
lifecycle (signals, registration file) without an API server, durations."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog
import yaml

from apis.checkpoint import kubelet_checkpoint_json
from apis.device import Device
from koordlet.cli import main, parse_duration
from runtimehooks.api import api_pb2, api_pb2_grpc
from tests.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config" / "examples" / "fake-gpus.yaml"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()  # main() configures structlog for the process


def _koordlet() -> list[str]:
    script = shutil.which("koordlet", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "koordlet.cli"]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_koordlet(), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_report_once_prints_a_valid_device_cr(output: str) -> None:
    proc = _run(
        "report",
        "--once",
        "--fake-gpus",
        str(EXAMPLE),
        "--node-name",
        "gpu-node-1",
        "--kubelet-root",
        "/nonexistent",
        "-o",
        output,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout) if output == "json" else yaml.safe_load(proc.stdout)
    device = Device.from_dict(doc)
    assert device.name == "gpu-node-1"
    assert [d.minor for d in device.devices] == [0, 1, 2, 3]
    assert all(d.health and d.type == "gpu" for d in device.devices)
    assert {d.resources["koordinator.sh/gpu-memory"].canonical() for d in device.devices} == {
        "80Gi"
    }
    assert [(d.topology.node_id, d.topology.pcie_id) for d in device.devices if d.topology] == [
        (0, "pci0000:00"),
        (0, "pci0000:00"),
        (1, "pci0000:80"),
        (1, "pci0000:80"),
    ]
    assert device.labels == {
        "node.koordinator.sh/gpu-vendor": "nvidia",
        "node.koordinator.sh/gpu-model": "A100-SXM4-80GB",
        "node.koordinator.sh/gpu-driver-version": "535.129.03",
    }
    assert device.to_dict() == doc


@pytest.mark.parametrize(
    ("names", "published"),
    [
        pytest.param(None, True, id="default-list"),
        pytest.param("nvidia.com/gpu,nvidia.com/mig-*", False, id="gpushare-left-out"),
    ],
)
def test_report_publishes_the_configured_gpu_resources(
    tmp_path: Path, names: str | None, published: bool
) -> None:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    gpu = "GPU-a3b5c7d9-2e4f-4a6b-8c0d-1f3e5a7b9c03"
    entry = {"PodUID": "share", "ContainerName": "c", "ResourceName": "aliyun.com/gpu-mem",
             "DeviceIDs": {"-1": [f"{gpu}-_-0"]}, "AllocResp": ""}  # fmt: skip
    (plugins / "kubelet_internal_checkpoint").write_text(
        kubelet_checkpoint_json({"PodDeviceEntries": [entry], "RegisteredDevices": {}})
    )
    flags = ["--gpu-resource-names", names] if names is not None else []
    proc = _run("report", "--once", "--fake-gpus", str(EXAMPLE), "--node-name", "n",
                "--kubelet-root", str(tmp_path), "-o", "json", *flags)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ann = json.loads(proc.stdout)["metadata"].get("annotations", {})
    got = json.loads(ann.get("node.koordinator.sh/devices-checkpoints", "[]"))
    assert [e["deviceIDs"] for e in got] == ([[gpu]] if published else [])


def test_report_once_with_a_checkpoint(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    gpu = "GPU-a3b5c7d9-2e4f-4a6b-8c0d-1f3e5a7b9c03"
    (plugins / "kubelet_internal_checkpoint").write_text(
        kubelet_checkpoint_json(
            {
                "PodDeviceEntries": [
                    {
                        "PodUID": "legacy",
                        "ContainerName": "c",
                        "ResourceName": "nvidia.com/gpu",
                        "DeviceIDs": {"1": [gpu]},
                        "AllocResp": "",
                    }
                ],
                "RegisteredDevices": {"nvidia.com/gpu": [gpu]},
            }
        )
    )
    proc = _run(
        "report",
        "--once",
        "--fake-gpus",
        str(EXAMPLE),
        "--node-name",
        "n",
        "--kubelet-root",
        str(tmp_path),
        "-o",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    ann = json.loads(proc.stdout)["metadata"]["annotations"]
    assert json.loads(ann["node.koordinator.sh/devices-checkpoints"]) == [
        {
            "podUID": "legacy",
            "containerName": "c",
            "resourceName": "nvidia.com/gpu",
            "deviceIDs": [gpu],
        }
    ]


def test_report_without_nvml_is_an_empty_inventory() -> None:
    proc = _run("report", "--once", "--node-name", "cpu-node", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    if doc["spec"].get("devices"):  # a GPU host: real cards
        assert all(d["type"] == "gpu" for d in doc["spec"]["devices"])
    else:
        assert doc["metadata"] == {"name": "cpu-node"}
        lines = [json.loads(line) for line in proc.stderr.splitlines()]
        assert [e["event"] for e in lines] == [
            "NVML library (libnvidia-ml.so.1) not found: no GPUs on this node"
        ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["report", "--once", "--fake-gpus", "/nonexistent.yaml"],
            "--fake-gpus /nonexistent.yaml: cannot read",
            id="missing-fake-file",
        ),
        pytest.param(["run"], "--node-name is required", id="run-without-node"),
        pytest.param(
            ["run", "--node-name", "n", "--sync-interval", "soon"],
            "invalid duration 'soon'",
            id="bad-interval",
        ),
        pytest.param(
            ["run", "--node-name", "n", "--metrics-bind-address", "9316"],
            "invalid bind address",
            id="bad-address",
        ),
        pytest.param(
            [
                "run",
                "--node-name",
                "n",
                "--kubeconfig",
                "/nonexistent",
                "--fake-gpus",
                str(EXAMPLE),
            ],
            "cannot load a kubeconfig (/nonexistent)",
            id="bad-kubeconfig",
        ),
        pytest.param(["frobnicate"], "invalid choice", id="unknown-command"),
        pytest.param(["report", "--once", "-o", "xml"], "invalid choice", id="bad-output"),
    ],
)
def test_user_errors_are_one_line_exit_2(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("koordlet: error: ")
    assert message in err
    assert "Traceback" not in err


def test_a_fake_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"\xff\xfegpus: []\n")
    assert main(["report", "--once", "--fake-gpus", str(bad), "--node-name", "n"]) == 2
    assert capsys.readouterr().err == (
        f"koordlet: error: --fake-gpus {bad}: not UTF-8 text (byte 0)\n"
    )


def test_bad_fake_file_in_a_subprocess_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "gpus.yaml"
    bad.write_text("gpus: [{minor: 0}]")
    proc = _run("report", "--once", "--fake-gpus", str(bad))
    assert proc.returncode == 2
    assert proc.stderr == f"koordlet: error: --fake-gpus {bad}: gpus[0].uuid: required\n"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("1s", 1.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("10us", 1e-5),
        (".5s", 0.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


# Go's flag rules (one parser for every component, apis.duration): bare seconds are refused.
@pytest.mark.parametrize(
    "text", ["", "s", "10x", "-1s", "0s", "0", "1s2", "ms10", "2", "0.5", "90", " 1s"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


# -- run: lifecycle without an API server ----------------------------------------------------------


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def _wait(cond: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _start_koordlet(args: list[str], ready: Path) -> tuple[subprocess.Popen[str], int]:
    """``koordlet run`` with its metrics on a free port, once ``ready`` exists. The port is free
    when picked, not necessarily when the agent binds it (any process on the machine can take
    it meanwhile): the agent then exits saying so, and starts again on another port."""
    err = ""
    for _attempt in range(3):
        port = _free_port()
        proc = subprocess.Popen(
            [*_koordlet(), *args, "--metrics-bind-address", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        _wait(lambda: ready.exists() or proc.poll() is not None)  # noqa: B023 (waited here)
        if proc.poll() is None:
            return proc, port
        err = proc.communicate()[1]
        if "Address already in use" not in err:
            break
    raise AssertionError(err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_stops_cleanly_on_signal(short_dir: Path, sig: signal.Signals) -> None:
    kubeconfig = short_dir / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    hook_dir, sock = short_dir / "hookserver.d", short_dir / "koordlet.sock"
    proc, port = _start_koordlet(
        [
            "run",
            "--node-name",
            "n1",
            "--kubeconfig",
            str(kubeconfig),
            "--fake-gpus",
            str(EXAMPLE),
            "--sync-interval",
            "1s",
            "--hook-dir",
            str(hook_dir),
            "--socket",
            str(sock),
            "--kubelet-root",
            str(short_dir),
        ],
        hook_dir / "koordlet.json",
    )
    try:
        # The hook server registers before the sync loop starts: /healthz is 503 until then.
        _wait(lambda: _healthz(port) == 200 or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()[1]
        assert sock.exists()
        with grpc.insecure_channel(f"unix:{sock}") as channel:  # the hook server is wired...
            req = api_pb2.ContainerResourceHookRequest()
            req.pod_annotations["scheduling.koordinator.sh/device-allocated"] = (
                '{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
            )
            resp = api_pb2_grpc.RuntimeHookServiceStub(channel).PreCreateContainerHook(
                req, timeout=10
            )
        # No API server: the pod cannot be read, so the container gets no GPU (fail closed).
        assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == "void"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()  # ...and timed into the agent's metrics
        # one request, observed once per hook: the GPU, RDMA and Gemini fair-share hooks
        assert (
            'koordlet_runtime_hook_requests_total{result="success",stage="PreCreateContainer"} 3.0'
            in metrics
        )
        assert 'koordlet_runtime_hook_denied_total{reason="pod-lookup-error"} 1.0' in metrics
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    registration = json.loads((hook_dir / "koordlet.json").read_text())
    assert registration["failure-policy"] == "Fail"  # kept: the proxy refuses until we are back
    assert not sock.exists()
    events = [json.loads(line) for line in err.splitlines()]  # every line is a JSON object
    names = [e["event"] for e in events]
    assert "koordlet started" in names and names[-1] == "koordlet stopped"
    assert "device sync failed" in names  # no API server: logged, the agent kept running
    assert all({"level", "timestamp"} <= e.keys() for e in events)


# -- flags shared with koord-scheduler and Koordinator's koordlet ------------------------------


@pytest.mark.parametrize("once", [[], ["--once"]], ids=["default", "once-no-op"])
def test_report_prints_one_report_by_default(
    once: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["report", *once, "--fake-gpus", str(EXAMPLE), "--node-name", "n", "-o", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "Device" and doc["metadata"]["name"] == "n"


@pytest.mark.parametrize(
    ("argv", "attr", "value"),
    [
        pytest.param(["run"], "metrics_bind_address", ":9316", id="default-address"),
        pytest.param(["run", "--addr", ":9400"], "metrics_bind_address", ":9400", id="addr"),
        pytest.param(
            ["run", "--metrics-bind-address=127.0.0.1:0"],
            "metrics_bind_address",
            "127.0.0.1:0",
            id="metrics-bind-address",
        ),
        pytest.param(["run"], "log_level", "info", id="default-level"),
        pytest.param(["run", "--log-level", "debug"], "log_level", "debug", id="log-level"),
        pytest.param(["report", "--log-level=error"], "log_level", "error", id="report-level"),
        pytest.param(["run", "-v", "3"], "log_level", "info", id="v3"),
        pytest.param(["run", "--v=4"], "log_level", "debug", id="v4"),
        pytest.param(["report", "-v6"], "log_level", "debug", id="report-v6"),
    ],
)
def test_flags_and_their_effect(argv: list[str], attr: str, value: str) -> None:
    from koordlet.cli import build_parser, log_level_of

    args = build_parser().parse_args(argv)
    got = log_level_of(args) if attr == "log_level" else getattr(args, attr)
    assert got == value


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["report", "-v", "x"],
            "argument -v/--v: expected a non-negative integer, got 'x'",
            id="v-not-int",
        ),
        pytest.param(
            ["report", "-v", "4", "--log-level", "info"],
            "--log-level and -v both set the log level: give one of them",
            id="v-and-log-level",
        ),
        pytest.param(
            ["run", "--log-level", "loud"],
            "argument --log-level: invalid choice: 'loud' "
            "(choose from 'debug', 'info', 'warning', 'error')",
            id="bad-level",
        ),
        pytest.param(
            ["run", "--node-name", "n", "--addr", "9316"],
            "invalid bind address '9316': expected HOST:PORT",
            id="addr-without-colon",
        ),
    ],
)
def test_flag_errors_are_exact_one_liners(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == f"koordlet: error: {message}\n"


def test_debug_level_logs_debug_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from koordlet.cli import configure_logging

    configure_logging("json", "debug")
    structlog.get_logger("koordlet").debug("probe")
    assert json.loads(capsys.readouterr().err)["event"] == "probe"
