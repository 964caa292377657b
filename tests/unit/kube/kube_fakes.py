"""Fakes at the HTTP boundary of the Kubernetes adapter (``scheduler.kube.transport.Transport``).

``FakeTransport`` answers scripted responses per (method, path without query), records every
request, and hands out scripted watch streams; when a watch script runs out it returns an idle
stream that blocks until closed, as a quiet watch would. ``json_response``/``status_response``
build bodies the way the API server writes them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from scheduler.kube.rest import TransportError
from scheduler.kube.transport import RawResponse


def json_response(doc: Any, status: int = 200) -> RawResponse:
    return RawResponse(status, json.dumps(doc).encode())


def status_response(status: int, reason: str, message: str) -> RawResponse:
    doc = {"kind": "Status", "status": "Failure", "reason": reason, "message": message}
    return RawResponse(status, json.dumps({**doc, "code": status}).encode())


def object_list(items: list[Mapping[str, Any]], rv: str, cont: str = "") -> RawResponse:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return json_response({"metadata": meta, "items": list(items)})


def event(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    timeout: float = 0.0


class FakeStream:
    """A watch response: ``chunks`` then, unless ``end`` is set, blocks until ``close()``."""

    def __init__(
        self,
        chunks: list[bytes] = (),  # type: ignore[assignment]
        *,
        status: int = 200,
        end: bool = True,
        error: Exception | None = None,
        body: bytes = b"",
    ) -> None:
        self.status = status
        self._chunks = list(chunks)
        self._end = end
        self._error = error
        self._body = body
        self.closed = threading.Event()

    def chunks(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            if self.closed.is_set():
                return
            yield chunk
        if self._error is not None:
            raise self._error
        if not self._end:
            self.closed.wait(30)

    def read_all(self) -> bytes:
        return self._body

    def close(self) -> None:
        self.closed.set()


class FakeTransport:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.watches: list[Request] = []
        self._responses: dict[tuple[str, str], list[RawResponse | Exception]] = {}
        self._streams: dict[str, list[FakeStream | Exception]] = {}
        self._lock = threading.Lock()
        self.open_streams: list[FakeStream] = []
        self.closed = False

    def on(self, method: str, path: str, *responses: RawResponse | Exception) -> None:
        with self._lock:
            self._responses.setdefault((method, path), []).extend(responses)

    def replace(self, method: str, path: str, *responses: RawResponse | Exception) -> None:
        with self._lock:
            self._responses[(method, path)] = list(responses)

    def on_watch(self, path: str, *streams: FakeStream | Exception) -> None:
        with self._lock:
            self._streams.setdefault(path, []).extend(streams)

    @staticmethod
    def _split(url: str) -> tuple[str, dict[str, str]]:
        parts = urlsplit(url)
        return parts.path, dict(parse_qsl(parts.query))

    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> RawResponse:
        bare, query = self._split(path)
        with self._lock:
            self.requests.append(
                Request(
                    method,
                    bare,
                    query,
                    dict(headers),
                    json.loads(body) if body else None,
                    timeout,
                )
            )
            script = self._responses.get((method, bare))
            if not script:
                raise TransportError(f"no response scripted for {method} {bare}")
            answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def stream(
        self, path: str, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> FakeStream:
        bare, query = self._split(path)
        with self._lock:
            self.watches.append(Request("GET", bare, query, dict(headers), None))
            script = self._streams.get(bare)
            answer: FakeStream | Exception = script.pop(0) if script else FakeStream(end=False)
            if isinstance(answer, FakeStream):
                self.open_streams.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True

    def sent(self, method: str, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path == path]
