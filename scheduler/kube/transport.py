"""HTTP transports to one API server: the ``Transport`` port and urllib3's pooled one.

Role: below ``RestClient`` (scheduler/kube/rest.py). ``Urllib3Transport`` speaks HTTP(S)
through one ``urllib3.PoolManager`` and opens every watch stream; ``Http11Transport``
(scheduler/kube/http11.py) is the lean default for short requests. Invariants:

- Every response is read to its end and its connection released, on errors too, so the pool
  never stalls (KUBE_APISERVER.md: an unreleased response cuts binds from ~600/s to ~30/s).
- A connection-level failure (refused, reset, timeout, TLS) raises ``TransportError``;
  urllib3's own retries and redirects are off: callers decide what to retry.
- A request's timeout counts from its start, connecting included: no answer is waited for
  longer (the API server may still apply a write it received; see scheduler/kube/leader.py).
- Injectable: tests use a fake at this HTTP boundary (``Transport``).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3

from scheduler.kube.credentials import Credentials
from scheduler.kube.errors import TransportError

__all__ = ["RawResponse", "Stream", "Transport", "Urllib3Transport", "shared_tls_context"]


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    body: bytes


class Stream(Protocol):
    """An open streaming response (a watch)."""

    status: int

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives; ends when the server closes the stream."""
        ...

    def read_all(self) -> bytes: ...

    def close(self) -> None:
        """Idempotent; may be called from another thread to end a blocked ``chunks()``."""
        ...


class Transport(Protocol):
    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> RawResponse: ...

    def stream(
        self, path: str, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> Stream: ...

    def close(self) -> None: ...


_NET_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class _Urllib3Stream:
    def __init__(self, resp: urllib3.BaseHTTPResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self._closed = threading.Event()

    def chunks(self) -> Iterator[bytes]:
        try:
            for chunk in self._resp.stream(amt=None, decode_content=True):
                if chunk:
                    yield chunk
        except _NET_ERRORS as exc:
            if not self._closed.is_set():
                raise TransportError(f"watch stream: {exc}") from exc

    def read_all(self) -> bytes:
        try:
            return bytes(self._resp.read())
        except _NET_ERRORS as exc:
            raise TransportError(f"reading response: {exc}") from exc
        finally:
            self._resp.release_conn()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        shutdown = getattr(self._resp, "shutdown", None)
        try:
            if shutdown is not None:
                shutdown()  # unblocks a read in another thread (urllib3 >= 2.3)
        except (RuntimeError, ValueError, *_NET_ERRORS):
            # RuntimeError: a stream read to its end (the server ended the watch at its
            # timeoutSeconds) already gave its connection back to the pool: nothing to unblock.
            pass
        try:
            self._resp.close()
        except _NET_ERRORS:
            pass
        finally:
            self._resp.release_conn()


def shared_tls_context(creds: Credentials) -> ssl.SSLContext:
    """One TLS context for every pooled connection.

    Without it urllib3 builds a context per new connection and loads the system CA store into
    it (~ms of CPU each; B2's profile showed it at 4 % of the scheduler's busy time while the
    bind workers opened their connections). The CA file/data and client certificate are still
    passed to urllib3 as before, which loads them into this context.
    """
    verify = creds.verify_ssl
    ctx = urllib3.util.ssl_.create_urllib3_context(
        cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    )
    if not verify:
        ctx.check_hostname = False
    elif not (creds.ca_file or creds.ca_data):
        ctx.load_default_certs()
    return ctx


class Urllib3Transport:
    """HTTPS to one API server through a pooled urllib3 ``PoolManager``."""

    def __init__(self, creds: Credentials, pool_size: int = 32) -> None:
        self._base = creds.host
        kwargs: dict[str, Any] = {"maxsize": pool_size, "num_pools": 4}
        if creds.host.startswith("https://"):
            if creds.verify_ssl:
                kwargs["cert_reqs"] = "CERT_REQUIRED"
                if creds.ca_file:
                    kwargs["ca_certs"] = creds.ca_file
                if creds.ca_data:
                    kwargs["ca_cert_data"] = creds.ca_data
                if creds.tls_server_name:
                    kwargs["server_hostname"] = creds.tls_server_name
            else:
                kwargs["cert_reqs"] = "CERT_NONE"
                kwargs["assert_hostname"] = False
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            if creds.cert_file:
                kwargs["cert_file"] = creds.cert_file
            if creds.key_file:
                kwargs["key_file"] = creds.key_file
        if creds.host.startswith("https://"):
            kwargs["ssl_context"] = shared_tls_context(creds)
        self._pool = urllib3.PoolManager(**kwargs)

    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> RawResponse:
        try:
            resp = self._pool.request(
                method,
                self._base + path,
                body=body,
                headers=dict(headers),
                # ``total``: connecting counts against the timeout too, so no answer
                # (status line) comes later than ``timeout`` after the request started.
                timeout=urllib3.Timeout(total=timeout, connect=min(timeout, 10.0), read=timeout),
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except _NET_ERRORS as exc:
            raise TransportError(f"{method} {path}: {exc}") from exc
        try:
            data = resp.read()
        except _NET_ERRORS as exc:
            raise TransportError(f"{method} {path}: reading the response: {exc}") from exc
        finally:
            resp.release_conn()
        return RawResponse(resp.status, bytes(data))

    def stream(
        self, path: str, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> Stream:
        try:
            resp = self._pool.request(
                "GET",
                self._base + path,
                headers=dict(headers),
                timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except _NET_ERRORS as exc:
            raise TransportError(f"GET {path}: {exc}") from exc
        return _Urllib3Stream(resp)

    def close(self) -> None:
        self._pool.clear()
