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
