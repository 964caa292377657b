"""The scheduler's HTTP endpoints on one port: ``/healthz``, ``/livez``, ``/readyz``, ``/metrics``,
``/debug/explain/NAMESPACE/POD``, ``/debug/memory``.

Role: what the kubelet's probes and Prometheus talk to. ``/livez`` and ``/healthz`` run the
liveness checks (the process's threads are alive), ``/readyz`` the readiness checks (caches
synced and connected; leading, or a healthy standby). Each answers ``200 ok``, or ``503`` with
one ``[-]<check> failed: <reason>`` line per failed check, as kube components do; ``?verbose``
lists every check (``[+]<check> ok``). ``/metrics`` streams the Prometheus text format that the
function it is given writes, in HTTP/1.1 chunks of ``METRICS_CHUNK`` bytes, so a scrape never
holds the whole body (35 MB at 5,000 nodes x 8 GPUs); a writer that raises midway ends the
response without its last chunk, which the client sees as a failed scrape.
``/debug/explain/NS/POD[?o=json|table]`` answers ``koord-scheduler explain`` for a pending pod
from the running scheduler's own state (the function it is given runs the question on the
scheduling thread); 400 for a malformed path, what the function says otherwise (404 for an
unknown pod), 500 with one line if it raises. ``/debug/memory`` lists the allocation sites
holding the most memory when the process runs with
``PYTHONTRACEMALLOC=1``, and says how to turn tracing on otherwise (404).

POST routes (``post``: path -> handler of the body, e.g. the admission webhook's reviews): the
body needs a ``Content-Length`` (411 otherwise) of at most ``max_body`` bytes (413 otherwise,
and the connection is closed without reading it); a handler that raises is one 500 line.
The listen backlog is ``BACKLOG``: many clients connecting at once are queued, not reset.

The secure port (kube-scheduler's 10259): given ``tls``, every accepted connection is wrapped
in TLS, its handshake done in the connection's own thread (``HANDSHAKE_TIMEOUT``), so a client
that never speaks stalls nobody. Given ``access`` (``Access``: delegated authentication and
authorization, as kube components do it), a request for a path that is not always allowed
(``/healthz``, ``/readyz``, ``/livez`` by default, never asking anyone) is authenticated from
its ``Authorization: Bearer`` token (no bearer token: ``system:anonymous``), then authorized
for ``(user, "get", path)``; 401 for a token the authenticator rejects or cannot check, 403 when
not allowed, 500 when the authorizer fails, each with kube's ``Status`` body.

Invariants: checks are plain callables returning None (ok) or a reason, evaluated on every
request, so an answer is never stale; a check that raises counts as failed. The server runs in
its own daemon threads, started by ``start()`` and ended by ``stop()``; it never touches
scheduling state except through the callables it was given.
"""

from __future__ import annotations

import io
import json
import socket
import ssl
import threading
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

import structlog

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["ANONYMOUS", "Access", "Check", "HealthServer", "User", "run_checks"]

log = structlog.get_logger("koord-scheduler.http")
EXPLAIN_PREFIX = "/debug/explain/"

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
METRICS_CHUNK = 1 << 16
MetricsWriter = Callable[[BinaryIO], None]
"""Writes the whole exposition to the stream it is given."""
PostHandler = Callable[[bytes], tuple[int, bytes, str]]
"""A POST route: the request body -> (status code, body, content type)."""
DEFAULT_MAX_BODY = 1 << 20
DISCARD_FACTOR = 8
"""An oversized body up to this many times the limit is read and dropped before the 413."""
BACKLOG = 1024


@dataclass(frozen=True, slots=True)
class Check:
    """A named probe: returns None when healthy, else the reason it is not."""

    name: str
    probe: Callable[[], str | None]


@dataclass(frozen=True, slots=True)
class User:
    """Who a request is, as a TokenReview answers it (``extra`` sorted, hashable)."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))
"""A request without a bearer token (kube's anonymous authenticator)."""
DEFAULT_ALWAYS_ALLOW = ("/healthz", "/readyz", "/livez")
"""kube-scheduler's ``--authorization-always-allow-paths`` default."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a TLS client has to complete its handshake."""
TLS_IDLE_TIMEOUT = 60.0
"""Seconds a TLS connection may stay silent (mid-request or kept alive) before it is closed."""


@dataclass(frozen=True, slots=True)
class Access:
    """Delegated authentication and authorization of the secure port.

    ``authenticate(token)`` is the user of a bearer token, None when the token is not valid;
    it raises when it cannot tell (401 either way, as kube answers). ``authorize(user, verb,
    path)`` is (allowed, reason); it raises when it cannot tell (500). ``always_allow``: paths
    served to anyone without asking either (exact, or a prefix written ``/prefix/*``)."""

    authenticate: Callable[[str], User | None]
    authorize: Callable[[User, str, str], tuple[bool, str]]
    always_allow: Sequence[str] = DEFAULT_ALWAYS_ALLOW

    def always_allows(self, path: str) -> bool:
        for allowed in self.always_allow:
            if allowed.endswith("*"):
                if path.startswith(allowed[:-1]):
                    return True
            elif path == allowed:
                return True
        return False


def _status(code: int, reason: str, message: str, details: bool) -> bytes:
    """kube's ``Status`` body of a refused request."""
    doc: dict[str, object] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details:
        doc["details"] = {}
    doc["code"] = code
    return json.dumps(doc, indent=2).encode() + b"\n"


def run_checks(checks: Sequence[Check], what: str, verbose: bool) -> tuple[bool, str]:
    """(ok, body) in kube's healthz format."""
    lines: list[str] = []
    ok = True
    for check in checks:
        try:
            reason = check.probe()
        except Exception as exc:  # a broken probe is a failed probe
            reason = f"{type(exc).__name__}: {exc}"
        if reason is None:
            if verbose:
                lines.append(f"[+]{check.name} ok")
        else:
            ok = False
            lines.append(f"[-]{check.name} failed: {reason}")
    if ok and not verbose:
        return True, "ok"
    lines.append(f"{what} check passed" if ok else f"{what} check failed")
    return ok, "\n".join(lines)


class HealthServer:
    """One HTTP port for probes and metrics (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        live: Sequence[Check] = (),
        ready: Sequence[Check] = (),
        metrics: MetricsWriter | None = None,
        explain: Callable[[str, str, str], tuple[int, bytes]] | None = None,
        tls: ssl.SSLContext | None = None,
        access: Access | None = None,
        post: Mapping[str, PostHandler] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.live = list(live)
        self._post = dict(post or {})
        self._max_body = max_body
        self._access = access
        self.ready = list(ready)
        self._metrics = metrics
        self._explain = explain
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._serve(self)

            def do_POST(self) -> None:
                server._serve_post(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        if tls is not None:
            Handler.timeout = TLS_IDLE_TIMEOUT
            self._httpd: _Server = _TLSServer((host, port), Handler, tls)
        else:
            self._httpd = _Server((host, port), Handler)
        self.tls = tls is not None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="http", kwargs={"poll_interval": 0.2}
        )
        self._thread.daemon = True
        self._thread.start()
        log.info(
            "serving",
            address=self._httpd.server_address[0],
            port=self.port,
            scheme="https" if self.tls else "http",
        )

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        verbose = "verbose" in parse_qs(url.query, keep_blank_values=True)
        path = url.path.rstrip("/") or "/"
        if self._access is not None and not self._admit(req, self._access, path):
            return
        if path in ("/healthz", "/livez"):
            ok, body = run_checks(self.live, path[1:], verbose)
            self._reply(req, 200 if ok else 503, body.encode() + b"\n", "text/plain")
        elif path == "/readyz":
            ok, body = run_checks(self.ready, "readyz", verbose)
            self._reply(req, 200 if ok else 503, body.encode() + b"\n", "text/plain")
        elif path.startswith(EXPLAIN_PREFIX) and self._explain is not None:
            self._serve_explain(req, path[len(EXPLAIN_PREFIX) :], url.query)
        elif path == "/debug/memory":
            self._reply(req, *_memory_report(), "text/plain")
        elif path == "/metrics" and self._metrics is not None:
            self._stream_metrics(req, self._metrics)
        else:
            self._reply(req, 404, b"404 page not found\n", "text/plain")

    def _serve_post(self, req: BaseHTTPRequestHandler) -> None:
        path = urlsplit(req.path).path.rstrip("/") or "/"
        if self._access is not None and not self._admit(req, self._access, path):
            return
        handler = self._post.get(path)
        if handler is None:
            req.close_connection = True  # its body was not read
            self._reply(req, 404, f"no POST route {path}\n".encode(), "text/plain")
            return
        body = self._read_body(req)
        if body is None:
            return
        try:
            code, out, ctype = handler(body)
        except Exception as exc:  # never take the server down for one request
            log.error("request failed", path=path, error=f"{type(exc).__name__}: {exc}")
            code, out, ctype = 500, f"{type(exc).__name__}: {exc}\n".encode(), "text/plain"
        self._reply(req, code, out, ctype)

    def _read_body(self, req: BaseHTTPRequestHandler) -> bytes | None:
        """The request's body, or None after answering why it is refused."""
        raw = req.headers.get("Content-Length")
        if raw is None or req.headers.get("Transfer-Encoding"):
            req.close_connection = True
            self._reply(req, 411, b"a Content-Length is required\n", "text/plain")
            return None
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            req.close_connection = True
            self._reply(req, 400, b"bad Content-Length\n", "text/plain")
            return None
        if length > self._max_body:
            # Read (and drop) a body up to a bound, so a client that sends it all before
            # reading sees the 413 rather than a reset; the connection ends either way.
            req.close_connection = True
            if length <= DISCARD_FACTOR * self._max_body:
                left = length
                while left > 0:
                    chunk = req.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        return None
                    left -= len(chunk)
            body = f"request body of {length} bytes is over the limit of {self._max_body}\n"
            self._reply(req, 413, body.encode(), "text/plain")
            return None
        data = req.rfile.read(length)
        if len(data) < length:  # the client went away mid-body
            req.close_connection = True
            return None
        return data

    def _admit(self, req: BaseHTTPRequestHandler, access: Access, path: str) -> bool:
        """Authenticate and authorize ``req`` for ``path``; answers the refusal itself."""
        if access.always_allows(path):
            return True
        scheme, _, token = (req.headers.get("Authorization") or "").partition(" ")
        token = token.strip()
        user = ANONYMOUS
        if scheme.lower() == "bearer" and token:
            try:
                found = access.authenticate(token)
            except Exception as exc:
                log.warning("cannot authenticate a request", path=path, error=str(exc))
                found = None
            if found is None:
                body = _status(401, "Unauthorized", "Unauthorized", details=False)
                self._reply(req, 401, body, "application/json")
                return False
            user = found
        verb = req.command.lower()
        try:
            allowed, reason = access.authorize(user, verb, path)
        except Exception as exc:
            log.warning("cannot authorize a request", path=path, user=user.name, error=str(exc))
            body = f"Internal Server Error: {path!r}: {exc}\n".encode()
            self._reply(req, 500, body, "text/plain")
            return False
        if allowed:
            return True
        message = f"forbidden: User {json.dumps(user.name)} cannot {verb} path {json.dumps(path)}"
        if reason:
            message += f": {reason}"
        self._reply(req, 403, _status(403, "Forbidden", message, details=True), "application/json")
        return False

    def _serve_explain(self, req: BaseHTTPRequestHandler, rest: str, query: str) -> None:
        assert self._explain is not None
        namespace, sep, name = rest.partition("/")
        if not sep or not namespace or not name or "/" in name:
            self._reply(req, 400, b"expected /debug/explain/NAMESPACE/POD\n", "text/plain")
            return
        output = (parse_qs(query).get("o") or ["json"])[0]
        if output not in ("json", "table"):
            self._reply(req, 400, b"o: json or table\n", "text/plain")
            return
        try:
            code, body = self._explain(namespace, name, output)
        except Exception as exc:
            log.exception("explain failed", pod=f"{namespace}/{name}")
            self._reply(req, 500, f"{exc}\n".encode(), "text/plain")
            return
        ctype = "application/json" if output == "json" and code == 200 else "text/plain"
        self._reply(req, code, body, ctype)

    @staticmethod
    def _stream_metrics(req: BaseHTTPRequestHandler, write: MetricsWriter) -> None:
        req.send_response(200)
        req.send_header("Content-Type", PROMETHEUS_TEXT)
        req.send_header("Transfer-Encoding", "chunked")
        req.send_header("X-Content-Type-Options", "nosniff")
        req.end_headers()
        out = io.BufferedWriter(_ChunkWriter(req), METRICS_CHUNK)
        try:
            write(out)
            out.flush()
        except Exception:
            # The status line is gone already: no last chunk, no keep-alive, so the client
            # sees a truncated body (a failed scrape), never a complete-looking partial one.
            log.exception("metrics exposition failed")
            req.close_connection = True
            return
        req.wfile.write(b"0\r\n\r\n")

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
        req.send_response(code)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.send_header("X-Content-Type-Options", "nosniff")
        req.end_headers()
        req.wfile.write(body)


class _Server(ThreadingHTTPServer):
    """One daemon thread per connection; a deep listen backlog (the default of 5 resets
    connections when many clients connect at once, as an API server's webhook calls do)."""

    daemon_threads = True
    request_queue_size = BACKLOG


class _TLSServer(_Server):
    """TLS on every accepted socket; the handshake runs in the connection's thread."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        context: ssl.SSLContext,
    ) -> None:
        self._tls = context
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        return self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            request.do_handshake()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("TLS handshake failed", client=str(client_address[0]), error=str(exc))
            return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection failed", client=str(client_address[0]), exc_info=True)


class _ChunkWriter(io.RawIOBase):
    """Each write is one HTTP/1.1 chunk on the request's socket."""

    def __init__(self, req: BaseHTTPRequestHandler) -> None:
        self._wfile = req.wfile

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        chunk = bytes(data)
        if chunk:
            self._wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return len(chunk)


MEMORY_TOP = 30


def _memory_report() -> tuple[int, bytes]:
    """``/debug/memory``: the allocation sites holding the most memory now, when the process
    traces allocations (``PYTHONTRACEMALLOC=1``; tracing costs CPU, so it is never on by
    default); 404 saying how to turn it on otherwise."""
    if not tracemalloc.is_tracing():
        return 404, b"not tracing: start koord-scheduler with PYTHONTRACEMALLOC=1\n"
    snapshot = tracemalloc.take_snapshot()
    stats = snapshot.statistics("lineno")
    current, peak = tracemalloc.get_traced_memory()
    lines = [f"traced: {current / 2**20:.1f} MiB now, {peak / 2**20:.1f} MiB peak"]
    lines += [str(stat) for stat in stats[:MEMORY_TOP]]
    return 200, ("\n".join(lines) + "\n").encode()
