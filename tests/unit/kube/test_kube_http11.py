"""scheduler.kube.http11: the lean HTTP/1.1 transport against real local servers (plain and
TLS): what it sends, the three body framings, keep-alive reuse and a closed idle connection,
the timeout from the request's start, TLS verification, and the same answers as urllib3's."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduler.kube.credentials import Credentials
from scheduler.kube.http11 import Http11Transport
from scheduler.kube.rest import RestClient, TransportError
from scheduler.kube.transport import Urllib3Transport


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []
    connections: set[int] = set()
    """Serials of the connections that served a request. Not ``id(self.connection)``: a
    closed connection's socket is freed, and the next one can be allocated at its address."""
    _serials = itertools.count()

    def setup(self) -> None:
        super().setup()
        self.serial = next(_Handler._serials)  # one handler per connection

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        _Handler.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        _Handler.connections.add(self.serial)
        if self.path.startswith("/trickle"):
            # A chunk every 50 ms for 5 s: no single read waits long, the whole answer does.
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with contextlib.suppress(OSError):  # the client gave up: it hangs up on us
                for _ in range(100):
                    self.wfile.write(b"1\r\nx\r\n")
                    self.wfile.flush()
                    time.sleep(0.05)
                self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/chunked"):
            self.send_response(201)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"a":', b"1", b"}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/close"):
            payload = b'{"closed":true}'
            self.send_response(409)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True
            return
        if self.path.startswith("/empty"):
            self.send_response(204)
            self.end_headers()
            return
        payload = json.dumps({"path": self.path, "len": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(server: ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if isinstance(server.socket, ssl.SSLSocket) else "http"
    yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), _Handler))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    d = tmp_path_factory.mktemp("tls")
    certs = []
    for name in ("server", "other"):
        key, crt = d / f"{name}.key", d / f"{name}.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(key), "-out", str(crt), "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        certs.append((key, crt))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs[0][1], certs[0][0])
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    for url in _serve(server):
        yield url, certs[0][1], certs[1][1]


def test_a_request_sends_method_path_headers_and_body(plain_url: str) -> None:
    _Handler.seen.clear()
    t = Http11Transport(Credentials(host=plain_url))
    resp = t.request("POST", "/api/v1/x?y=1", {"Authorization": "Bearer t"}, b'{"k":1}', 5.0)
    assert (resp.status, json.loads(resp.body)) == (200, {"path": "/api/v1/x?y=1", "len": 7})
    seen = _Handler.seen[-1]
    assert (seen["method"], seen["body"], seen["headers"]["authorization"]) == (
        "POST",
        b'{"k":1}',
        "Bearer t",
    )
    assert seen["headers"]["host"] == plain_url.split("//")[1]
    t.close()


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [("/chunked", 201, b'{"a":1}'), ("/close", 409, b'{"closed":true}'), ("/empty", 204, b"")],
    ids=["chunked", "to-eof-then-closed", "no-content"],
)
def test_every_body_framing_reads_the_same_as_urllib3(
    plain_url: str, path: str, status: int, body: bytes
) -> None:
    creds = Credentials(host=plain_url)
    mine = Http11Transport(creds).request("GET", path, {}, None, 5.0)
    ref = Urllib3Transport(creds).request("GET", path, {}, None, 5.0)
    assert (mine.status, mine.body) == (ref.status, ref.body) == (status, body)


def test_connections_are_kept_alive_and_a_closed_one_is_replaced(plain_url: str) -> None:
    t = Http11Transport(Credentials(host=plain_url), pool_size=2)
    _Handler.connections.clear()
    for _ in range(5):
        assert t.request("GET", "/a", {}, None, 5.0).status == 200
    assert len(_Handler.connections) == 1
    assert t.request("GET", "/close", {}, None, 5.0).status == 409  # not put back
    assert t.request("GET", "/a", {}, None, 5.0).status == 200
    assert len(_Handler.connections) == 2
    # the server drops the idle connection: the next request notices before sending
    with t._lock:
        idle = list(t._idle)
    for conn in idle:
        conn.sock.shutdown(socket.SHUT_RD)
    assert t.request("GET", "/a", {}, None, 5.0).status == 200
    t.close()


def test_the_timeout_counts_from_the_start_and_is_a_transport_error(plain_url: str) -> None:
    """The answer trickles in for 5 s, no gap near the timeout: a timeout per socket read
    would return it whole; one counted from the start cuts it short. (No bound on the elapsed
    time: on a loaded machine a thread can wait its turn for long, and it proves nothing more.)"""
    t = Http11Transport(Credentials(host=plain_url))
    with pytest.raises(TransportError, match="timed out"):
        t.request("POST", "/trickle", {}, b"{}", 1.0)
    refused = Http11Transport(Credentials(host="http://127.0.0.1:1"))
    with pytest.raises(TransportError):
        refused.request("GET", "/", {}, None, 2.0)


@pytest.mark.parametrize("verify", [False, True], ids=["skip-verify", "pinned-ca"])
def test_https_with_concurrent_requests(tls: tuple[str, Path, Path], verify: bool) -> None:
    url, crt, _ = tls
    t = Http11Transport(Credentials(host=url, verify_ssl=verify, ca_file=str(crt)), pool_size=4)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: t.request("GET", f"/p{i}", {}, None, 10.0), range(32)))
    assert [json.loads(a.body)["path"] for a in answers] == [f"/p{i}" for i in range(32)]
    assert len(t._idle) <= 4
    t.close()


def test_https_with_the_wrong_ca_is_a_transport_error(tls: tuple[str, Path, Path]) -> None:
    url, _, other = tls
    with pytest.raises(TransportError):
        Http11Transport(Credentials(host=url, ca_file=str(other))).request(
            "GET", "/x", {}, None, 5.0
        )


def test_rest_client_over_it(plain_url: str) -> None:
    rest = RestClient(Http11Transport(Credentials(host=plain_url)), token=lambda: "Bearer x")
    assert rest.request("PATCH", "/p", body={"a": 1}) == {"path": "/p", "len": 7}


def test_every_informers_watch_stream_closes_without_a_pool_warning(
    plain_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Watches go through urllib3: one connection per informer (six kinds) must fit its pool,
    or each stream closed at shutdown or at a watch timeout logs "Connection pool is full"
    (it did with a pool of four)."""
    transport = Http11Transport(Credentials(host=plain_url))
    streams = [transport.stream(f"/w{i}", {}, 5.0, 5.0) for i in range(8)]
    with caplog.at_level("WARNING", logger="urllib3.connectionpool"):
        for stream in streams:
            assert b"".join(stream.chunks())  # as an informer reads a watch to its end
        for stream in streams:
            stream.close()
    transport.close()
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
