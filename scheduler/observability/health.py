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

Invariants: checks are plain callables returning None (ok) or a reason, evaluated on every
request, so an answer is never stale; a check that raises counts as failed. The server runs in
its own daemon threads, started by ``start()`` and ended by ``stop()``; it never touches
scheduling state except through the callables it was given.
"""

from __future__ import annotations

import io
import threading
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import parse_qs, urlsplit

import structlog

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["Check", "HealthServer", "run_checks"]

log = structlog.get_logger("koord-scheduler.http")
EXPLAIN_PREFIX = "/debug/explain/"

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
METRICS_CHUNK = 1 << 16
MetricsWriter = Callable[[BinaryIO], None]
"""Writes the whole exposition to the stream it is given."""


@dataclass(frozen=True, slots=True)
class Check:
    """A named probe: returns None when healthy, else the reason it is not."""

    name: str
    probe: Callable[[], str | None]


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
    ) -> None:
        self.live = list(live)
        self.ready = list(ready)
        self._metrics = metrics
        self._explain = explain
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._serve(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
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
        log.info("serving", address=self._httpd.server_address[0], port=self.port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        verbose = "verbose" in parse_qs(url.query, keep_blank_values=True)
        path = url.path.rstrip("/") or "/"
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
