"""The secure port of scheduler.observability.health: TLS with a generated self-signed
certificate (scheduler.observability.tls) and delegated access control (``Access``) with the
callables it is given, kube's always-allow paths and answers."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.observability.health import ANONYMOUS, Access, Check, HealthServer, User
from scheduler.observability.tls import TLSError, load_server_context, self_signed, server_context

READER = User("reader", ("team",))
CERT_PEM, KEY_PEM = self_signed(["localhost", "127.0.0.1"])


def authenticate(token: str) -> User | None:
    if token == "boom":
        raise RuntimeError("token review failed")
    return {"good": READER, "other": User("other")}.get(token)


def authorize(user: User, verb: str, path: str) -> tuple[bool, str]:
    if user.name == "boom":
        raise RuntimeError("subject access review failed")
    return user == READER and verb == "get", ""


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        self.calls.append((user.name, verb, path))
        return authorize(user, verb, path)


@pytest.fixture
def secure() -> Iterator[tuple[HealthServer, Recorder]]:
    rec = Recorder()
    srv = HealthServer(
        "127.0.0.1",
        0,
        live=[Check("ping", lambda: None)],
        ready=[Check("ping", lambda: None)],
        metrics=lambda out: out.write(b"x 1.0\n"),
        tls=server_context(CERT_PEM, KEY_PEM),
        access=Access(authenticate, rec),
    )
    srv.start()
    yield srv, rec
    srv.stop()


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=CERT_PEM.decode())
    return ctx


def get(srv: HealthServer, path: str, token: str | None = None, auth: str | None = None
        ) -> tuple[int, str, str]:  # fmt: skip
    conn = http.client.HTTPSConnection("localhost", srv.port, context=client_context(), timeout=5)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if auth is not None:
        headers["Authorization"] = auth
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers["Content-Type"], resp.read().decode()
    finally:
        conn.close()


def test_the_secure_port_speaks_tls_with_the_generated_certificate(
    secure: tuple[HealthServer, Recorder],
) -> None:
    srv, _ = secure
    # Verified against the generated certificate, hostname included.
    assert get(srv, "/healthz")[::2] == (200, "ok\n")
    with (
        socket.create_connection(("127.0.0.1", srv.port), timeout=5) as raw,
        client_context().wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        cert = tls.getpeercert()
    assert ("DNS", "localhost") in cert["subjectAltName"]
    assert ("IP Address", "127.0.0.1") in cert["subjectAltName"]
    # Plain HTTP on the TLS port gets no HTTP answer.
    plain = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        plain.request("GET", "/healthz")
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.getresponse().read()
    finally:
        plain.close()
    # And the server still answers afterwards (a failed handshake harms nobody else).
    assert get(srv, "/livez")[0] == 200


def test_a_stalled_handshake_does_not_block_other_clients(
    secure: tuple[HealthServer, Recorder],
) -> None:
    srv, _ = secure
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5):
        assert get(srv, "/healthz")[0] == 200  # while the first connection says nothing


def test_probe_paths_are_open_without_a_token(secure: tuple[HealthServer, Recorder]) -> None:
    srv, rec = secure
    for path in ("/healthz", "/livez", "/readyz", "/readyz?verbose", "/healthz/"):
        assert get(srv, path)[0] == 200, path
    assert get(srv, "/healthz", token="nonsense")[0] == 200  # never asks the API server
    assert rec.calls == []


def test_metrics_need_an_authorized_token(secure: tuple[HealthServer, Recorder]) -> None:
    srv, rec = secure
    code, ctype, body = get(srv, "/metrics", token="good")
    assert (code, body) == (200, "x 1.0\n")
    assert rec.calls == [("reader", "get", "/metrics")]

    code, ctype, body = get(srv, "/metrics", token="other")
    assert code == 403 and ctype == "application/json"
    assert json.loads(body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'forbidden: User "other" cannot get path "/metrics"',
        "reason": "Forbidden",
        "details": {},
        "code": 403,
    }

    code, ctype, body = get(srv, "/metrics", token="unknown")
    assert code == 401 and ctype == "application/json"
    assert json.loads(body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    assert get(srv, "/metrics", token="boom")[0] == 401  # TokenReview failed: kube says 401


def test_no_token_is_anonymous_and_must_be_authorized(
    secure: tuple[HealthServer, Recorder],
) -> None:
    srv, rec = secure
    code, _, body = get(srv, "/metrics")
    assert code == 403
    assert json.loads(body)["message"] == (
        'forbidden: User "system:anonymous" cannot get path "/metrics"'
    )
    # A non-Bearer Authorization header is no token either (kube's bearer authenticator).
    assert get(srv, "/debug/memory", auth="Basic eDp5")[0] == 403
    assert rec.calls == [
        ("system:anonymous", "get", "/metrics"),
        ("system:anonymous", "get", "/debug/memory"),
    ]
    assert ANONYMOUS.groups == ("system:unauthenticated",)


def test_every_other_path_is_guarded(secure: tuple[HealthServer, Recorder]) -> None:
    srv, _ = secure
    for path in ("/debug/memory", "/debug/explain/ns/p", "/nope", "/metricsx"):
        assert get(srv, path, token="other")[0] == 403, path
    assert get(srv, "/nope", token="good")[0] == 404  # authorized, then routed


def test_an_authorizer_failure_is_a_500() -> None:
    def who(token: str) -> User | None:
        return User("boom")

    srv = HealthServer(
        "127.0.0.1", 0, tls=server_context(CERT_PEM, KEY_PEM), access=Access(who, authorize)
    )
    srv.start()
    try:
        code, _, body = get(srv, "/metrics", token="x")
        assert code == 500 and "subject access review failed" in body
    finally:
        srv.stop()


def test_always_allow_paths_exact_and_prefix() -> None:
    access = Access(authenticate, authorize, always_allow=("/healthz", "/debug/*"))
    assert access.always_allows("/healthz")
    assert access.always_allows("/debug/memory") and access.always_allows("/debug/")
    assert not access.always_allows("/readyz")
    assert not access.always_allows("/healthzx")
    assert not Access(authenticate, authorize, always_allow=()).always_allows("/healthz")


def test_certificate_files_load_and_bad_ones_are_one_line(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(CERT_PEM)
    key.write_bytes(KEY_PEM)
    assert isinstance(load_server_context(str(cert), str(key)), ssl.SSLContext)
    with pytest.raises(TLSError, match=r"absent\.crt"):
        load_server_context(str(tmp_path / "absent.crt"), str(key))
    key.write_text("not a key\n")
    with pytest.raises(TLSError) as exc:
        load_server_context(str(cert), str(key))
    assert "\n" not in str(exc.value)
