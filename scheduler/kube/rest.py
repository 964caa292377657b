"""JSON requests and watches against one API server: the client the Kubernetes adapter uses.

Role: ``RestClient`` adds authentication, JSON, the client-side QPS limit and the error mapping
to a ``Transport`` (scheduler/kube/transport.py) and opens watch streams; credentials come
from scheduler/kube/credentials.py. The adapter's errors (scheduler/kube/errors.py) are
re-exported here, where callers import them from.

Invariants:

- Bodies are plain JSON mappings; the ``kubernetes`` client's generated models are never used.
- A non-2xx answer raises ``ApiError`` (HTTP status, the Status ``reason`` and ``message``);
  a connection-level failure raises ``TransportError``. Both are ``KubeError``.
- Requests (not watch streams) take a token from the client's ``TokenBucket`` first.
- Every request is reported to the observer (client-go's ``rest_client_*`` metrics) with a
  bounded URL template.
- Answers, watch events and error bodies are decoded with ``apis.jsonload.loads``: anything a
  Go server serves (nested up to its 10,000 levels) decodes, and deeper or malformed JSON is
  a ``TransportError`` (an error body: its raw text), never a ``RecursionError``.
- ``metadata.managedFields`` is dropped from every object served (an answer, each of its
  ``items``, a watch event's object) as it is decoded: nothing here reads it, and a tenant
  can nest it 10,000 levels deep (``apis.core.drop_managed_fields``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from apis.core import drop_managed_fields
from apis.jsonload import loads
from scheduler.kube.errors import ApiError, CredentialsError, KubeError, TransportError
from scheduler.kube.ratelimit import TokenBucket
from scheduler.kube.transport import Stream, Transport

__all__ = [
    "ApiError",
    "CredentialsError",
    "KubeError",
    "RestClient",
    "TransportError",
    "WatchStream",
    "path_segment",
    "url_template",
]

USER_AGENT = "koord-scheduler/0.1.0"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def path_segment(name: str) -> str:
    """A name escaped for use as one URL path segment."""
    return quote(name, safe="")


def _error_from(status: int, body: bytes) -> ApiError:
    reason, message = "", ""
    try:
        doc = loads(body)
        if isinstance(doc, Mapping):
            reason = str(doc.get("reason") or "")
            message = str(doc.get("message") or "")
    except ValueError:
        pass
    if not message:
        message = body[:300].decode("utf-8", "replace").strip() or f"HTTP {status}"
    return ApiError(status, reason, message)


class WatchStream:
    """Decoded watch events ``(type, object)`` of one watch request; ``close()`` from any
    thread ends the iteration."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        buf = b""
        for chunk in self._stream.chunks():
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1 :]
                if line.strip():
                    yield _event(line)
        if buf.strip():
            yield _event(buf)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _event(line: bytes) -> tuple[str, Mapping[str, Any]]:
    try:
        doc = loads(line)
    except ValueError as exc:
        raise TransportError(f"watch stream: undecodable event: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("object"), Mapping):
        raise TransportError("watch stream: event without an object")
    return str(doc.get("type") or ""), drop_managed_fields(doc["object"])


RequestObserver = Callable[[str, str, str, float], None]
"""Told of every request: verb, URL template (``url_template``), status code (``"<error>"``
when no answer came), seconds — client-go's ``rest_client_*`` metrics."""


def url_template(path: str) -> str:
    """A request path as client-go's metrics label it: the namespace and the object name
    replaced by ``{namespace}`` and ``{name}``, the query dropped, so the label set stays
    bounded (``/api/v1/namespaces/{namespace}/pods/{name}/binding``)."""
    parts = path.split("?", 1)[0].split("/")
    # ["", "api", "v1", ...] or ["", "apis", group, version, ...]: the rest starts after these
    start = 3 if len(parts) > 1 and parts[1] == "api" else 4
    rest = parts[start:]
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest[1] = "{namespace}"
        if len(rest) >= 4:  # namespaces/{ns}/<resource>/<name>[/<subresource>]
            rest[3] = "{name}"
    elif len(rest) >= 2:  # <resource>/<name>[/<subresource>]
        rest[1] = "{name}"
    return "/".join(parts[:start] + rest)


class RestClient:
    """JSON requests and watches against one API server (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        *,
        token: Callable[[], str | None] = lambda: None,
        limiter: TokenBucket | None = None,
        timeout: float = 30.0,
        user_agent: str = USER_AGENT,
        observe: RequestObserver | None = None,
    ) -> None:
        self.transport = transport
        self._token = token
        self.limiter = limiter
        self.timeout = timeout
        self._user_agent = user_agent
        self._observe = observe

    def with_limiter(self, limiter: TokenBucket | None) -> RestClient:
        """The same connection and credentials with another rate limit (events, leases)."""
        return RestClient(
            self.transport,
            token=self._token,
            limiter=limiter,
            timeout=self.timeout,
            user_agent=self._user_agent,
            observe=self._observe,
        )

    def _observed(self, method: str, path: str, code: str, started: float) -> None:
        if self._observe is not None:
            self._observe(method, url_template(path), code, time.monotonic() - started)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self._user_agent}
        token = self._token()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer ({} when empty). Raises ``KubeError``."""
        if self.limiter is not None:
            self.limiter.acquire()
        url = path + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        started = time.monotonic()
        try:
            resp = self.transport.request(
                method,
                url,
                self._headers(content_type if data is not None else None),
                data,
                self.timeout if timeout is None else timeout,
            )
        except KubeError:
            self._observed(method, path, "<error>", started)
            raise
        self._observed(method, path, str(resp.status), started)
        if not 200 <= resp.status < 300:
            raise _error_from(resp.status, resp.body)
        if not resp.body:
            return {}
        try:
            doc = drop_managed_fields(loads(resp.body))
        except ValueError as exc:
            raise TransportError(f"{method} {path}: undecodable answer: {exc}") from None
        return doc if isinstance(doc, dict) else {"value": doc}

    def watch(
        self,
        path: str,
        query: Mapping[str, str],
        *,
        read_timeout: float,
        connect_timeout: float = 10.0,
    ) -> WatchStream:
        """Open a watch (``query`` should carry ``watch=1`` and a ``resourceVersion``)."""
        started = time.monotonic()
        try:
            stream = self.transport.stream(
                path + "?" + urlencode(query), self._headers(None), connect_timeout, read_timeout
            )
        except KubeError:
            self._observed("GET", path, "<error>", started)
            raise
        self._observed("GET", path, str(stream.status), started)
        if stream.status != 200:
            raise _error_from(stream.status, stream.read_all())
        return WatchStream(stream)

    def close(self) -> None:
        self.transport.close()
