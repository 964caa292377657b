"""scheduler.observability.tls: the webhook's CA and serving certificate (a client trusting
only the CA verifies the leaf for its names), and the reload of a rotated pair."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import pytest

from scheduler.observability.health import Check, HealthServer
from scheduler.observability.tls import CertReloader, TLSError, issue_serving, load_server_context


def _write(path: Path, pair: tuple[bytes, bytes, bytes]) -> None:
    for name, data in zip(("ca.crt", "tls.crt", "tls.key"), pair, strict=True):
        (path / name).write_bytes(data)


def _issuer_seen(port: int, cafile: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(cafile))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except ssl.SSLCertVerificationError:
        return False
    finally:
        conn.close()


def test_the_leaf_verifies_against_the_ca_only(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _write(first, issue_serving(["svc.ns.svc", "127.0.0.1"]))
    _write(second, issue_serving(["svc.ns.svc", "127.0.0.1"]))
    ctx = load_server_context(str(first / "tls.crt"), str(first / "tls.key"))
    srv = HealthServer("127.0.0.1", 0, live=[Check("ok", lambda: None)], tls=ctx)
    srv.start()
    try:
        assert _issuer_seen(srv.port, first / "ca.crt")
        assert not _issuer_seen(srv.port, second / "ca.crt")
        # A rotation: the new pair is served to new connections, a broken one is refused.
        reloader = CertReloader(ctx, str(first / "tls.crt"), str(first / "tls.key"))
        assert reloader.check() is None
        (first / "tls.key").write_bytes((second / "tls.key").read_bytes())
        problem = reloader.check()  # new key, old certificate: not loaded
        assert problem is not None and "\n" not in problem
        assert _issuer_seen(srv.port, first / "ca.crt")
        (first / "tls.crt").write_bytes((second / "tls.crt").read_bytes())
        assert reloader.check() is None
        assert _issuer_seen(srv.port, second / "ca.crt")
        assert not _issuer_seen(srv.port, first / "ca.crt")
    finally:
        srv.stop()


def test_a_certificate_needs_a_host() -> None:
    with pytest.raises(TLSError):
        issue_serving([])
