"""scheduler.kube.rest: headers, JSON, error mapping, rate limit, watch stream decoding, and the
HTTPS transport against a real TLS server on loopback (one shared TLS context per transport)."""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduler.kube.credentials import Credentials, kubernetes_credentials, load_credentials
from scheduler.kube.ratelimit import TokenBucket
from scheduler.kube.rest import (
    ApiError,
    RestClient,
    TransportError,
    WatchStream,
    path_segment,
    url_template,
)
from scheduler.kube.transport import RawResponse, Urllib3Transport
from tests.fakes import FakeClock
from tests.unit.kube.kube_fakes import (
    FakeStream,
    FakeTransport,
    event,
    json_response,
    status_response,
)


def test_request_sends_token_json_and_query() -> None:
    t = FakeTransport()
    t.on("POST", "/api/v1/namespaces/ns/pods/p/binding", json_response({"status": "Success"}, 201))
    rest = RestClient(t, token=lambda: "Bearer abc")
    got = rest.request(
        "POST", "/api/v1/namespaces/ns/pods/p/binding", query={"dryRun": "All"}, body={"a": 1}
    )
    assert got == {"status": "Success"}
    (req,) = t.requests
    assert req.headers["Authorization"] == "Bearer abc"
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["Accept"] == "application/json"
    assert req.query == {"dryRun": "All"}
    assert req.body == {"a": 1}


def test_get_has_no_content_type_and_no_token_when_none() -> None:
    t = FakeTransport()
    t.on("GET", "/api/v1/nodes", json_response({"items": []}))
    RestClient(t).request("GET", "/api/v1/nodes")
    (req,) = t.requests
    assert "Content-Type" not in req.headers and "Authorization" not in req.headers


@pytest.mark.parametrize(
    ("response", "status", "reason", "message"),
    [
        (
            status_response(409, "Conflict", "pod is already assigned"),
            409,
            "Conflict",
            "pod is already assigned",
        ),
        (
            status_response(404, "NotFound", 'pods "p" not found'),
            404,
            "NotFound",
            'pods "p" not found',
        ),
        (RawResponse(503, b"upstream gone"), 503, "", "upstream gone"),
        (RawResponse(500, b""), 500, "", "HTTP 500"),
    ],
    ids=["status-409", "status-404", "plain-text", "empty"],
)
def test_errors_become_api_errors(
    response: RawResponse, status: int, reason: str, message: str
) -> None:
    t = FakeTransport()
    t.on("GET", "/x", response)
    with pytest.raises(ApiError) as exc:
        RestClient(t).request("GET", "/x")
    assert (exc.value.status, exc.value.reason, exc.value.message) == (status, reason, message)


def test_transport_errors_pass_through_and_bad_json_is_a_transport_error() -> None:
    t = FakeTransport()
    t.on("GET", "/down", TransportError("connection refused"))
    t.on("GET", "/garbage", RawResponse(200, b"<html>"))
    rest = RestClient(t)
    with pytest.raises(TransportError, match="refused"):
        rest.request("GET", "/down")
    with pytest.raises(TransportError, match="undecodable"):
        rest.request("GET", "/garbage")


def test_requests_take_a_token_from_the_bucket() -> None:
    clock = FakeClock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    t = FakeTransport()
    t.on("GET", "/x", json_response({}))
    rest = RestClient(t, limiter=TokenBucket(10, 2, clock=clock.now, sleep=sleep))
    for _ in range(4):
        rest.request("GET", "/x")
    assert slept == pytest.approx([0.1, 0.1])


def test_with_limiter_shares_the_transport() -> None:
    t = FakeTransport()
    rest = RestClient(t, limiter=TokenBucket(1, 1))
    other = rest.with_limiter(None)
    assert other.transport is t and other.limiter is None


def test_watch_stream_splits_lines_across_chunks() -> None:
    a = event("ADDED", {"metadata": {"name": "a"}})
    b = event("DELETED", {"metadata": {"name": "b"}})
    chunks = [a[:7], a[7:] + b[:3], b[3:-1], b[-1:]]
    events = list(WatchStream(FakeStream(chunks)))
    assert events == [
        ("ADDED", {"metadata": {"name": "a"}}),
        ("DELETED", {"metadata": {"name": "b"}}),
    ]


def test_watch_stream_rejects_garbage() -> None:
    with pytest.raises(TransportError):
        list(WatchStream(FakeStream([b"not json\n"])))
    with pytest.raises(TransportError):
        list(WatchStream(FakeStream([b'{"type":"ADDED"}\n'])))


def test_watch_non_200_raises_with_the_status_body() -> None:
    t = FakeTransport()
    body = status_response(410, "Expired", "too old resource version").body
    t.on_watch("/api/v1/pods", FakeStream(status=410, body=body))
    with pytest.raises(ApiError) as exc:
        RestClient(t).watch("/api/v1/pods", {"watch": "1"}, read_timeout=1)
    assert exc.value.status == 410 and exc.value.reason == "Expired"


def test_path_segment_escapes() -> None:
    assert path_segment("a/b c") == "a%2Fb%20c"


# -- the HTTPS transport against a real TLS server -------------------------------------------


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(crt), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return key, crt


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the pool reuses connections

    def do_GET(self) -> None:
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """(url, its certificate, another certificate) of an HTTPS server on 127.0.0.1."""
    d = tmp_path_factory.mktemp("tls")
    key, crt = _self_signed(d, "server")
    _, other = _self_signed(d, "other")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", crt, other
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("verify", "ca"),
    [
        pytest.param(False, None, id="insecure-skip-verify"),
        pytest.param(True, "server", id="pinned-ca-file"),
    ],
)
def test_https_connections_share_one_tls_context(
    tls_server: tuple[str, Path, Path], verify: bool, ca: str | None
) -> None:
    url, crt, _ = tls_server
    creds = Credentials(host=url, verify_ssl=verify, ca_file=str(crt) if ca else None)
    transport = Urllib3Transport(creds, pool_size=8)
    with ThreadPoolExecutor(8) as pool:  # concurrent requests open several connections
        answers = list(
            pool.map(lambda _: transport.request("GET", "/x", {}, None, 10.0), range(32))
        )
    assert {(a.status, a.body) for a in answers} == {(200, b'{"ok":true}')}
    conn_pool = transport._pool.connection_from_url(url)
    contexts = {id(c.sock.context) for c in list(conn_pool.pool.queue) if c is not None and c.sock}
    assert contexts == {id(transport._pool.connection_pool_kw["ssl_context"])}


def test_https_with_the_wrong_ca_is_a_transport_error(tls_server: tuple[str, Path, Path]) -> None:
    url, _, other = tls_server
    transport = Urllib3Transport(Credentials(host=url, ca_file=str(other)), pool_size=2)
    with pytest.raises(TransportError):
        transport.request("GET", "/x", {}, None, 10.0)


def test_a_request_timeout_bounds_the_request_from_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connecting counts against the timeout (urllib3's ``total``), so a fenced write gives up
    within its timeout of passing the fence, not connect + read timeouts later."""
    transport = Urllib3Transport(Credentials(host="http://127.0.0.1:1"), pool_size=1)
    seen: dict[str, Any] = {}

    def request(method: str, url: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise OSError("not sent")

    monkeypatch.setattr(transport._pool, "request", request)
    with pytest.raises(TransportError):
        transport.request("POST", "/x", {}, b"{}", 7.0)
    timeout = seen["timeout"]
    assert (timeout.total, timeout.connect_timeout) == (7.0, 7.0)


@pytest.mark.parametrize(
    ("path", "template"),
    [
        (
            "/api/v1/namespaces/team/pods/web-0/binding",
            "/api/v1/namespaces/{namespace}/pods/{name}/binding",
        ),
        ("/api/v1/namespaces/team/pods", "/api/v1/namespaces/{namespace}/pods"),
        ("/api/v1/pods", "/api/v1/pods"),
        ("/api/v1/nodes/n1", "/api/v1/nodes/{name}"),
        (
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/koord-scheduler",
            "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
        ),
        (
            "/apis/scheduling.koordinator.sh/v1alpha1/devices/n1",
            "/apis/scheduling.koordinator.sh/v1alpha1/devices/{name}",
        ),
        ("/apis/policy/v1", "/apis/policy/v1"),
        (
            "/api/v1/namespaces/team/pods/web-0?fieldSelector=x",
            "/api/v1/namespaces/{namespace}/pods/{name}",
        ),
    ],
)
def test_request_urls_are_templated_as_client_go_does(path: str, template: str) -> None:
    assert url_template(path) == template


def test_every_request_is_observed_with_its_code_and_duration() -> None:
    """client-go's rest_client metrics: each request's verb, URL template, status code (or
    ``<error>`` when no answer came) and duration reach the observer."""
    transport = FakeTransport()
    transport.on("GET", "/api/v1/nodes/n1", json_response({}))
    transport.on("DELETE", "/api/v1/nodes/n1", status_response(409, "Conflict", "c"))
    seen: list[tuple[str, str, str]] = []
    rest = RestClient(transport, observe=lambda m, url, code, s: seen.append((m, url, code)))
    rest.request("GET", "/api/v1/nodes/n1")
    with pytest.raises(ApiError):
        rest.request("DELETE", "/api/v1/nodes/n1")
    with pytest.raises(TransportError):
        rest.request("GET", "/api/v1/nodes/n2")  # nothing scripted: no answer
    rest.with_limiter(None).request("GET", "/api/v1/nodes/n1")
    assert seen == [
        ("GET", "/api/v1/nodes/{name}", "200"),
        ("DELETE", "/api/v1/nodes/{name}", "409"),
        ("GET", "/api/v1/nodes/{name}", "<error>"),
        ("GET", "/api/v1/nodes/{name}", "200"),
    ]


# -- kubeconfig: the plain reader agrees with the kubernetes package's loader ----------------

_CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def _kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    import json

    (tmp_path / "ca.crt").write_text(_CA_PEM)
    (tmp_path / "tls.crt").write_text("cert")
    (tmp_path / "tls.key").write_text("key")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://other:1"}},
            {"name": "c", "cluster": cluster},
        ],
        "users": [{"name": "u", "user": user}, {"name": "v", "user": {"token": "vv"}}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
            {"name": "ctx2", "context": {"cluster": "other", "user": "v"}},
        ],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("cluster", "user", "context"),
    [
        ({"server": "https://h:6443/", "insecure-skip-tls-verify": True}, {"token": "t0k"}, None),
        ({"server": "https://h:6443", "certificate-authority": "ca.crt"}, {"token": "t"}, None),
        (
            {"server": "https://h:6443", "certificate-authority-data": "", "tls-server-name": "n"},
            {"client-certificate": "tls.crt", "client-key": "tls.key"},
            None,
        ),
        ({"server": "http://h:8080"}, {}, None),
        ({"server": "https://h:6443"}, {"token": "t"}, "ctx2"),
    ],
    ids=["token-skip-verify", "ca-file-token", "ca-data-client-cert", "no-auth", "context"],
)
def test_a_plain_kubeconfig_reads_as_the_kubernetes_loader_reads_it(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str | None
) -> None:
    import base64

    if "certificate-authority-data" in cluster:
        cluster["certificate-authority-data"] = base64.b64encode(_CA_PEM.encode()).decode()
    path = _kubeconfig(tmp_path, cluster, user)
    plain = load_credentials(path, None, context)
    ref = kubernetes_credentials(path, None, context)
    assert plain.token.__qualname__ != ref.token.__qualname__  # the fast path was taken
    assert (plain.host, plain.verify_ssl, plain.tls_server_name, plain.token()) == (
        ref.host,
        ref.verify_ssl,
        ref.tls_server_name,
        ref.token(),
    )
    for mine, theirs in ((plain.cert_file, ref.cert_file), (plain.key_file, ref.key_file)):
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert Path(mine).read_text() == Path(theirs).read_text()
    ca_ref = Path(ref.ca_file).read_text() if ref.ca_file else None
    ca_mine = Path(plain.ca_file).read_text() if plain.ca_file else plain.ca_data
    assert ca_mine == ca_ref
    assert load_credentials(path, "https://m:1/", context).host == "https://m:1"


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "true"}},
        {"username": "a", "password": "b"},
        {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"},
        {"tokenFile": "tok"},
        {"client-certificate": "tls.crt"},
    ],
    ids=["exec", "basic", "embedded-cert", "token-file", "cert-without-key"],
)
def test_other_kubeconfigs_go_to_the_kubernetes_loader(
    tmp_path: Path, user: dict[str, Any]
) -> None:
    from scheduler.kube.credentials import _plain_kubeconfig

    path = _kubeconfig(tmp_path, {"server": "https://h:6443"}, user)
    assert _plain_kubeconfig(path, None, None) is None
    assert _plain_kubeconfig(str(tmp_path / "absent"), None, None) is None
    assert _plain_kubeconfig(path, None, "no-such-context") is None


def test_the_kubernetes_loader_token_is_reused_within_a_second(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://h:6443"}, {"token": "t"})
    creds = kubernetes_credentials(path)
    assert creds.token() == "Bearer t"
    assert creds.token() == "Bearer t"
