"""``koord-scheduler webhook certs|serve`` (scheduler.commands.webhook): the one-shot
certificates, one-line user errors, and a served process that stops gracefully on SIGTERM."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scheduler.cli import main, webhook_main

ROOT = Path(__file__).resolve().parents[3]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_certs_writes_the_pair_and_prints_the_ca_bundle(tmp_path: Path) -> None:
    code, out, _ = _run(["webhook", "certs", "--out", str(tmp_path / "c"), "--host", "10.0.0.9"])
    assert code == 0
    ca = (tmp_path / "c" / "ca.crt").read_bytes()
    assert base64.b64decode(out.strip()) == ca
    assert (tmp_path / "c" / "tls.key").stat().st_mode & 0o777 == 0o600
    ctx = ssl.create_default_context(cafile=str(tmp_path / "c" / "ca.crt"))
    assert ctx.cert_store_stats()["x509_ca"] == 1
    from cryptography import x509

    leaf = x509.load_pem_x509_certificate((tmp_path / "c" / "tls.crt").read_bytes())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "koord-webhook.koordinator-system.svc" in names.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["webhook", "serve"], "the following arguments are required: --tls-cert-file"),
        (
            [
                "webhook",
                "serve",
                "--tls-cert-file",
                "/nonexistent/tls.crt",
                "--tls-private-key-file",
                "/nonexistent/tls.key",
            ],
            "--tls-cert-file /nonexistent",
        ),
        (
            [
                "webhook",
                "serve",
                "--tls-cert-file",
                "x",
                "--tls-private-key-file",
                "y",
                "--shutdown-grace",
                "soon",
            ],
            "invalid duration 'soon'",
        ),
        (
            [
                "webhook",
                "serve",
                "--tls-cert-file",
                "x",
                "--tls-private-key-file",
                "y",
                "--max-request-bytes",
                "10",
            ],
            "--max-request-bytes must be at least 1024",
        ),
        (["webhook", "certs", "--out", "/proc/forbidden/x"], "--out /proc/forbidden/x: "),
        (["webhook", "certs", "--out", "x", "--days", "0"], "--days must be at least 1"),
        (["webhook"], "the following arguments are required: VERB"),
    ],
    ids=["no-cert", "missing-cert", "bad-duration", "tiny-body", "bad-out", "days", "no-verb"],
)
def test_user_errors_are_one_line(argv: list[str], message: str) -> None:
    code, _, err = _run(argv)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert err.startswith("koord-scheduler: error: ")


def test_koord_webhook_is_the_webhook_command(tmp_path: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert webhook_main(["certs", "--out", str(tmp_path)]) == 0
    assert base64.b64decode(out.getvalue().strip()) == (tmp_path / "ca.crt").read_bytes()


def _serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    assert _run(["webhook", "certs", "--out", str(tmp_path), "--host", "127.0.0.1"])[0] == 0
    log = tmp_path / "log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scheduler.cli",
                "webhook",
                "serve",
                "--port",
                "0",
                "--bind-address",
                "127.0.0.1",
                f"--tls-cert-file={tmp_path / 'tls.crt'}",
                f"--tls-private-key-file={tmp_path / 'tls.key'}",
                *extra,
            ],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    port = 0
    deadline = time.monotonic() + 30
    while not port and time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text().splitlines():
            doc = json.loads(line) if line.startswith("{") else {}
            if doc.get("event") == "webhook serving":
                port = int(doc["port"])
        time.sleep(0.1)
    assert port, log.read_text()
    return proc, port, log


def _get(port: int, ca: Path, path: str) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_serve_answers_and_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    proc, port, log = _serve(tmp_path, "--shutdown-grace", "2s", "--shutdown-delay", "2s")
    try:
        assert _get(port, tmp_path / "ca.crt", "/readyz") == 200
        proc.send_signal(signal.SIGTERM)
        # During the delay: not ready (endpoints drop it), but still answering reviews.
        deadline = time.monotonic() + 10
        while _get(port, tmp_path / "ca.crt", "/readyz") != 503:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert _get(port, tmp_path / "ca.crt", "/healthz") == 200
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    events = [json.loads(ln)["event"] for ln in log.read_text().splitlines() if ln.startswith("{")]
    assert events[-2:] == ["stopping", "stopped"], events
    assert "Traceback" not in log.read_text()


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    assert _run(["webhook", "certs", "--out", str(tmp_path)])[0] == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = _run(
            [
                "webhook",
                "serve",
                "--bind-address",
                "127.0.0.1",
                "--port",
                str(port),
                f"--tls-cert-file={tmp_path / 'tls.crt'}",
                f"--tls-private-key-file={tmp_path / 'tls.key'}",
            ]
        )
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"koord-scheduler: error: cannot listen on 127.0.0.1:{port}: ")


def test_a_key_that_does_not_match_is_one_line(tmp_path: Path) -> None:
    for d in ("a", "b"):
        assert _run(["webhook", "certs", "--out", str(tmp_path / d)])[0] == 0
    code, _, err = _run(
        [
            "webhook",
            "serve",
            f"--tls-cert-file={tmp_path / 'a' / 'tls.crt'}",
            f"--tls-private-key-file={tmp_path / 'b' / 'tls.key'}",
        ]
    )
    assert code == 2 and err.count("\n") == 1 and "--tls-private-key-file" in err, err
