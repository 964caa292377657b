"""``koord-scheduler run`` / ``inspect`` user errors: one line on stderr, exit 2, no traceback;
and scheduler.observability.logs' JSON lines."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import structlog

from scheduler.cli import main
from scheduler.observability import logs


@pytest.fixture(autouse=True)
def _reset_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_run_without_a_cluster_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["run", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("koord-scheduler: error: no --kubeconfig")


def test_run_with_a_broken_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    assert main(["run", "--kubeconfig", str(bad), "--port", "0"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"koord-scheduler: error: {bad}:")
    )


def test_run_with_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("apiVersion: nope\n")
    assert main(["run", "--config", str(cfg), "--master", "http://127.0.0.1:1"]) == 2
    assert "apiVersion" in capsys.readouterr().err


def test_inspect_unreachable_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--master", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("koord-scheduler: error: http://127.0.0.1:1:")


def test_json_log_lines_carry_pod_node_and_cycle() -> None:
    out = io.StringIO()
    logs.configure("json", "info", out, stdlib=False)
    log = structlog.get_logger("koord-scheduler")
    log.info("scheduled", pod="ns/p", node="n1", cycle=7)
    log.debug("hidden")
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["event"] == "scheduled" and doc["level"] == "info"
    assert (doc["pod"], doc["node"], doc["cycle"]) == ("ns/p", "n1", 7)
    assert doc["logger"] == "koord-scheduler" and doc["timestamp"].endswith("Z")


def test_console_format_and_bad_arguments() -> None:
    out = io.StringIO()
    logs.configure("console", "debug", out, stdlib=False)
    structlog.get_logger("x").debug("hello", pod="ns/p")
    assert "hello" in out.getvalue() and "pod=ns/p" in out.getvalue()
    with pytest.raises(ValueError):
        logs.configure("xml")
    with pytest.raises(ValueError):
        logs.configure("json", "loud")


# -- kube-scheduler's flag names and forms (run and extender share them) ----------------------

CFG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaseDuration: 60s, renewDeadline: 40s, retryPeriod: 5s, resourceName: from-file}
"""


def _run_args(argv: list[str], tmp_path: Path) -> object:
    from scheduler.cli import build_parser

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CFG)
    return build_parser().parse_args([a.replace("CFG", str(cfg)) for a in argv])


@pytest.mark.parametrize("command", ["run", "extender"])
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], {"leader_elect": True, "lease_duration": 15.0}, id="defaults"),
        pytest.param(["--leader-elect"], {"leader_elect": True}, id="bare-leader-elect"),
        pytest.param(["--leader-elect=false"], {"leader_elect": False}, id="leader-elect=false"),
        pytest.param(["--leader-elect", "false"], {"leader_elect": False}, id="leader-elect-false"),
        pytest.param(
            [
                "--leader-elect-lease-duration=30s",
                "--leader-elect-renew-deadline=20s",
                "--leader-elect-retry-period=500ms",
                "--leader-elect-resource-name=koord",
                "--leader-elect-resource-namespace=koordinator-system",
            ],
            {
                "lease_duration": 30.0,
                "renew_deadline": 20.0,
                "retry_period": 0.5,
                "resource_name": "koord",
                "resource_namespace": "koordinator-system",
            },
            id="every-leader-flag",
        ),
        pytest.param(
            ["--config", "CFG"],
            {"lease_duration": 60.0, "renew_deadline": 40.0, "resource_name": "from-file"},
            id="file-only",
        ),
        pytest.param(
            ["--config", "CFG", "--leader-elect-renew-deadline", "50s"],
            {"lease_duration": 60.0, "renew_deadline": 50.0, "retry_period": 5.0},
            id="flag-overrides-file",
        ),
        pytest.param(
            ["--leader-elect=false", "--leader-elect-renew-deadline=1h"],
            {"leader_elect": False, "renew_deadline": 3600.0},
            id="not-validated-when-off",
        ),
    ],
)
def test_leader_election_flags_override_the_file(
    command: str, argv: list[str], expected: dict[str, object], tmp_path: Path
) -> None:
    from scheduler.commands.run import run_config

    config = run_config(_run_args([command, *argv], tmp_path))  # type: ignore[arg-type]
    got = {key: getattr(config.leader_election, key) for key in expected}
    assert got == expected


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        pytest.param([], "info", id="default"),
        pytest.param(["-v", "2"], "info", id="v2"),
        pytest.param(["--v=3"], "info", id="v3"),
        pytest.param(["-v4"], "debug", id="v4"),
        pytest.param(["--v", "10"], "debug", id="v10"),
        pytest.param(["--log-level", "warning"], "warning", id="log-level"),
    ],
)
def test_verbosity_maps_onto_log_levels(argv: list[str], level: str, tmp_path: Path) -> None:
    from scheduler.cli import log_level_of

    assert log_level_of(_run_args(["run", *argv], tmp_path)) == level  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["run", "--leader-elect=maybe"],
            "argument --leader-elect: expected true or false, got 'maybe'",
            id="bad-bool",
        ),
        pytest.param(
            ["run", "--leader-elect-lease-duration", "15"],
            "argument --leader-elect-lease-duration: invalid duration '15' "
            "(examples: 15s, 500ms, 1m30s)",
            id="bare-number-duration",
        ),
        pytest.param(
            ["run", "--leader-elect-lease-duration=5s"],
            "--leader-elect-lease-duration: must be greater than "
            "leaderElection.renewDeadline (10s), got 5s",
            id="lease-below-file-renew",
        ),
        pytest.param(
            ["run", "--leader-elect-renew-deadline=1s", "--leader-elect-retry-period=2s"],
            "--leader-elect-renew-deadline: must be greater than "
            "--leader-elect-retry-period (2s), got 1s",
            id="renew-below-retry",
        ),
        pytest.param(
            ["extender", "--leader-elect-retry-period=0s"],
            "--leader-elect-retry-period: must be greater than 0, got 0s",
            id="zero-retry",
        ),
        pytest.param(
            ["run", "--leader-elect-resource-name="],
            "--leader-elect-resource-name: must not be empty when leaderElect is true",
            id="empty-name",
        ),
        pytest.param(
            ["run", "-v", "x"],
            "argument -v/--v: expected a non-negative integer, got 'x'",
            id="v-not-int",
        ),
        pytest.param(
            ["run", "--v=-1"],
            "argument -v/--v: expected a non-negative integer, got '-1'",
            id="v-negative",
        ),
        pytest.param(
            ["run", "-v", "4", "--log-level", "info"],
            "--log-level and -v both set the log level: give one of them",
            id="v-and-log-level",
        ),
        pytest.param(
            ["run", "--leader-elect", "--nope"],
            "unrecognized arguments: --nope",
            id="unknown-flag",
        ),
    ],
)
def test_flag_errors_are_one_line_exit_2(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(argv) == 2
    assert capsys.readouterr().err == f"koord-scheduler: error: {message}\n"


def test_serving_flags_default_to_the_secure_port_only() -> None:
    from scheduler.cli import build_parser

    for command in ("run", "extender"):
        args = build_parser().parse_args([command])
        assert (args.port, args.secure_port) == (0, 10259)
        assert args.authorization_always_allow_paths == "/healthz,/readyz,/livez"
        assert args.tls_cert_file is None and args.tls_private_key_file is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert-file", "c.crt"], "--tls-cert-file and --tls-private-key-file go together"),
        (["--tls-private-key-file", "k.key"], "go together"),
        (["--secure-port", "70000"], "--secure-port: 70000 is not a port (0-65535)"),
        (["--port", "-1"], "--port: -1 is not a port (0-65535)"),
        (["--port", "10259"], "--port and --secure-port cannot both be 10259"),
        (["--authorization-always-allow-paths", "/healthz,metrics"],
         "--authorization-always-allow-paths: 'metrics' does not start with /"),
        (["--tls-cert-file", "absent.crt", "--tls-private-key-file", "absent.key"],
         "--tls-cert-file absent.crt, --tls-private-key-file absent.key:"),
    ],
)  # fmt: skip
def test_bad_serving_flags_are_one_line_before_any_connection(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # --master points nowhere: the flags are refused before the scheduler connects.
    assert main(["run", "--master", "http://127.0.0.1:1", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("koord-scheduler: error: "), err
    assert message in err[0]


@pytest.mark.parametrize("command", ["run", "extender"])
def test_write_config_to_writes_the_effective_configuration_and_exits(
    command: str, tmp_path: Path
) -> None:
    """kube-scheduler's ``--write-config-to``: no cluster is needed, flags are applied, and
    the file loads back as a valid configuration."""
    from scheduler.config import load_config

    out = tmp_path / "effective.yaml"
    argv = [command, "--write-config-to", str(out), "--leader-elect-lease-duration", "1m30s"]
    assert main(argv) == 0
    written = load_config(out)
    assert written.leader_election.lease_duration == 90.0
    assert "DeviceShare" in [r.name for r in written.profiles[0].plugins.filter.enabled]


def test_a_bind_address_no_certificate_can_name_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The self-signed certificate names --bind-address; a host name x509 cannot carry (not
    an A-label) is a user error before anything connects, not a traceback."""
    assert main(["run", "--bind-address", "bäd", "--master", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("koord-scheduler: error: self-signed certificate for ['bäd'"), err


def test_a_stop_that_overruns_its_budget_ends_the_process() -> None:
    """``run``'s graceful stop is bounded (SHUTDOWN_BUDGET, under kubelet's 30 s): a step stuck
    past the budget — here the main thread itself — ends the process with a log line and exit
    status 3, as kubelet's SIGKILL would have, but on our terms."""
    import subprocess
    import sys
    import time

    code = (
        "import time\n"
        "from scheduler.commands.run import _watchdog\n"
        "_watchdog(0.5)\n"
        "time.sleep(30)\n"
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 3
    assert time.monotonic() - start < 15
    assert "graceful stop overran its budget" in done.stdout + done.stderr
