"""``koord-scheduler extender``'s HTTP server: kube-scheduler's extender verbs and gpushare's paths.

Role: route ``POST {prefix}/filter|prioritize|bind|preempt`` (prefix ``""`` or
``/gpushare-scheduler``, so an existing gpushare scheduler policy works unchanged),
``GET /gpushare-scheduler/inspect[/NODE]`` and ``GET /version`` to the ``ExtenderEngine`` and
encode its answers (``scheduler.extender.protocol``).

Answers, as kube-scheduler's HTTP extender reads them: a verb's failure rides in the body where
the type has a field for it (filter ``error``; bind ``Error`` with HTTP 500, as gpushare does),
otherwise it is a non-200 status; a malformed body is 400 with one line; a standby (not the
leader) answers 503 for prioritize/preempt and an error for filter/bind, which kube-scheduler
retries. A request never takes the process down: an unexpected exception is one 500 line and
a log entry.

Invariants: the server only reads the engine and the view it is given; it runs in its own
daemon threads, started by ``start()`` and ended by ``stop()``; it listens where it is told.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

import structlog

from apis.core import Node
from scheduler.extender.engine import ExtenderEngine, NotLeader
from scheduler.extender.protocol import (
    ExtenderRequestError,
    decode_binding_args,
    decode_extender_args,
    decode_preemption_args,
    encode_binding_result,
    encode_filter_result,
    encode_preemption_result,
    encode_priorities,
)
from scheduler.observability.inspect import ObjectsView
from scheduler.observability.inspect_gpushare import gpushare_view

__all__ = ["GPUSHARE_PREFIX", "ExtenderServer"]

log = structlog.get_logger("koord-scheduler.extender")
GPUSHARE_PREFIX: Final = "/gpushare-scheduler"
VERBS: Final = ("filter", "prioritize", "bind", "preempt")
MAX_BODY: Final = 64 << 20
JSON: Final = "application/json"


@dataclass(frozen=True, slots=True)
class Answer:
    code: int
    body: bytes
    content_type: str = JSON


class _Server(ThreadingHTTPServer):
    """One thread per connection (kube-scheduler keeps its connections alive), a listen
    backlog for kube-scheduler's many goroutines at once (the default of 5 reset
    connections under 64 concurrent binds); bodies are bounded by ``MAX_BODY``."""

    daemon_threads = True
    request_queue_size = 1024


class ExtenderServer:
    def __init__(
        self,
        address: str,
        port: int,
        engine: ExtenderEngine,
        *,
        version: str,
        view: Callable[[], ObjectsView],
        gpushare_unit: str = "GiB",
        observe: Callable[[str, int, float], None] = lambda verb, code, seconds: None,
    ) -> None:
        self._engine = engine
        self._version = version
        self._view = view
        self._unit = gpushare_unit
        self._observe = observe
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kube-scheduler keeps its connection alive

            def do_GET(self) -> None:
                outer._serve(self, "GET")

            def do_POST(self) -> None:
                outer._serve(self, "POST")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._httpd = _Server((address, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="extender-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- routing ----------------------------------------------------------------------------------

    def _serve(self, req: BaseHTTPRequestHandler, method: str) -> None:
        start = time.perf_counter()
        path = req.path.split("?", 1)[0].rstrip("/") or "/"
        verb = "unknown"
        try:
            if method == "GET" and path == "/version":
                verb, answer = "version", Answer(200, self._version.encode(), "text/plain")
            elif method == "GET" and path.split("/")[1:3] == [GPUSHARE_PREFIX[1:], "inspect"]:
                verb = "inspect"
                node = path[len(f"{GPUSHARE_PREFIX}/inspect") :].lstrip("/")
                answer = self._inspect(node)
            else:
                name = path[len(GPUSHARE_PREFIX) :] if path.startswith(GPUSHARE_PREFIX) else path
                verb = name.lstrip("/")
                if verb not in VERBS:
                    verb = "unknown"
                    answer = Answer(404, f"no such path: {path}\n".encode(), "text/plain")
                elif method != "POST":
                    answer = Answer(405, f"{verb} takes POST\n".encode(), "text/plain")
                else:
                    answer = self._verb(verb, self._body(req))
        except ExtenderRequestError as exc:
            answer = Answer(400, f"{exc}\n".encode(), "text/plain")
        except Exception as exc:  # never take the server down for one request
            log.error("extender request failed", verb=verb, error=str(exc))
            answer = Answer(500, f"{type(exc).__name__}: {exc}\n".encode(), "text/plain")
        self._reply(req, answer)
        self._observe(verb, answer.code, time.perf_counter() - start)

    @staticmethod
    def _body(req: BaseHTTPRequestHandler) -> bytes:
        try:
            length = int(req.headers.get("Content-Length") or 0)
        except ValueError:
            raise ExtenderRequestError("bad Content-Length") from None
        if length < 0 or length > MAX_BODY:
            raise ExtenderRequestError(f"request body of {length} bytes refused")
        return req.rfile.read(length)

    def _verb(self, verb: str, body: bytes) -> Answer:
        engine = self._engine
        if verb == "filter":
            fargs = decode_extender_args(body)
            try:
                result = engine.filter(fargs.pod, fargs.node_names)
            except (NotLeader, TimeoutError) as exc:
                return Answer(200, json.dumps({"error": str(exc)}).encode())
            return Answer(200, encode_filter_result(result, fargs.nodes))
        if verb == "prioritize":
            pargs = decode_extender_args(body)
            try:
                scores = engine.prioritize(pargs.pod, pargs.node_names)
            except (NotLeader, TimeoutError) as exc:
                return Answer(503, f"{exc}\n".encode(), "text/plain")
            return Answer(200, encode_priorities(scores))
        if verb == "bind":
            bargs = decode_binding_args(body)
            try:
                error = engine.bind(bargs)
            except NotLeader as exc:
                error = str(exc)
            if error:
                log.info(
                    "extender bind refused",
                    pod=f"{bargs.namespace}/{bargs.name}",
                    node=bargs.node,
                    error=error,
                )
            return Answer(500 if error else 200, encode_binding_result(error))
        eargs = decode_preemption_args(body)
        try:
            kept = engine.preempt(eargs)
        except (NotLeader, TimeoutError) as exc:
            return Answer(503, f"{exc}\n".encode(), "text/plain")
        return Answer(200, encode_preemption_result(kept))

    def _inspect(self, node: str) -> Answer:
        """gpushare's ``/inspect`` JSON, from the informers' picture."""
        view = self._view()
        nodes: Iterable[Node] = view.nodes.values()
        if node:
            nodes = [n for n in nodes if n.name == node]
        table, problems = gpushare_view(nodes, view.devices, view.pods, self._unit)
        out: dict[str, Any] = {
            "nodes": [
                {
                    "name": n.name,
                    "totalGPU": n.total,
                    "usedGPU": n.used,
                    "devs": [
                        {
                            "id": c.index,
                            "totalGPU": c.total,
                            "usedGPU": c.used,
                            "pods": [
                                {
                                    "name": key.split("/", 1)[1],
                                    "namespace": key.split("/", 1)[0],
                                    "usedGPU": units,
                                }
                                for key, units in sorted(c.pods.items())
                            ],
                        }
                        for c in n.cards
                    ],
                }
                for n in table
            ]
        }
        if node and not table:
            out["error"] = f"node {node} has no GPU memory known to koord-scheduler"
        elif problems:
            out["error"] = "; ".join(problems)
        return Answer(200, json.dumps(out).encode())

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, answer: Answer) -> None:
        try:
            req.send_response(answer.code)
            req.send_header("Content-Type", answer.content_type)
            req.send_header("Content-Length", str(len(answer.body)))
            req.end_headers()
            req.wfile.write(answer.body)
        except OSError:  # the client went away: nothing to answer
            pass
