"""A lean HTTP/1.1 keep-alive transport for the API server's short requests.

Role: the same ``Transport`` port as ``Urllib3Transport`` (scheduler/kube/transport.py), with
less Python per request. Under B2 (200 nodes x 1,000 pods) urllib3 and ``http.client`` were
about a third of the scheduler's CPU: the pool manager's bookkeeping, a ``Retry`` and a
``Timeout`` object per request, and ``http.client``'s header parsing through the ``email``
package. Here a request is one ``sendall`` of a preformatted head and body, and the answer is
parsed with ``bytes`` methods. Watch streams (long-lived, few) still go through urllib3.

Invariants (those of ``Transport``, as ``Urllib3Transport`` keeps them):

- A request's ``timeout`` counts from its start, connecting included: every socket operation
  waits at most for what is left of it, so no answer is waited for longer.
- No retries and no redirects: a failure of any kind after the request may have been sent is
  a ``TransportError`` and the connection is dropped; callers decide (a bind reads back).
- An idle pooled connection is reused only if the server has not closed it (it is polled
  before reuse, as urllib3 does); at most ``pool_size`` idle connections are kept.
- The whole answer is read (``Content-Length``, chunked, or to EOF) before it is returned, so
  a connection goes back to the pool only at a message boundary.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from scheduler.kube.credentials import Credentials
from scheduler.kube.errors import TransportError
from scheduler.kube.transport import RawResponse, Stream, Urllib3Transport, shared_tls_context

__all__ = ["Http11Transport"]

_MAX_HEAD = 64 * 1024
WATCH_CONNECTIONS = 16
"""Connections urllib3 keeps for the watch streams: at least one per informer (six kinds), or
every stream closed at shutdown or at a watch timeout logs "Connection pool is full"."""


class _Conn:
    __slots__ = ("buf", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def dropped(self) -> bool:
        """True when the server closed the idle connection (or sent something unasked)."""
        if self.buf:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class _Deadline:
    __slots__ = ("end",)

    def __init__(self, timeout: float) -> None:
        self.end = time.monotonic() + timeout

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class Http11Transport:
    """HTTP/1.1 (TLS or plain) to one API server; watches through ``Urllib3Transport``."""

    def __init__(self, creds: Credentials, pool_size: int = 32) -> None:
        url = urlsplit(creds.host)
        self._tls = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._tls else 80)
        self._prefix = url.path.rstrip("/")
        default_port = 443 if self._tls else 80
        host_header = self._host if ":" not in self._host else f"[{self._host}]"
        if self._port != default_port:
            host_header += f":{self._port}"
        self._host_line = f"Host: {host_header}\r\n"
        self._ctx: ssl.SSLContext | None = None
        self._server_name = creds.tls_server_name or self._host
        if self._tls:
            ctx = shared_tls_context(creds)
            if creds.verify_ssl and (creds.ca_file or creds.ca_data):
                ctx.load_verify_locations(cafile=creds.ca_file, cadata=creds.ca_data)
            if creds.cert_file:
                ctx.load_cert_chain(creds.cert_file, creds.key_file)
            self._ctx = ctx
        self._pool_size = pool_size
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._closed = False
        self._streams = Urllib3Transport(creds, pool_size=WATCH_CONNECTIONS)

    # -- connections --------------------------------------------------------------------------

    def _connect(self, deadline: _Deadline) -> _Conn:
        sock = socket.create_connection((self._host, self._port), min(deadline.left(), 10.0))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ctx is not None:
                sock.settimeout(deadline.left())
                sock = self._ctx.wrap_socket(sock, server_hostname=self._server_name)
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)

    def _take(self) -> _Conn | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if not conn.dropped():
                return conn
            conn.close()

    def _give_back(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(conn)
                return
        conn.close()

    # -- one exchange -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> RawResponse:
        deadline = _Deadline(timeout)
        head = [f"{method} {self._prefix}{path} HTTP/1.1\r\n", self._host_line]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {0 if body is None else len(body)}\r\n")
        head.append("Accept-Encoding: identity\r\n\r\n")
        data = "".join(head).encode("latin-1")
        if body:
            data += body
        conn: _Conn | None = None
        try:
            conn = self._take() or self._connect(deadline)
            conn.sock.settimeout(deadline.left())
            conn.sock.sendall(data)
            status, reusable, payload = self._read_response(conn, method, deadline)
        except (OSError, ValueError, ssl.SSLError) as exc:
            if conn is not None:
                conn.close()
            text = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            raise TransportError(f"{method} {path}: {text}") from exc
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return RawResponse(status, payload)

    @staticmethod
    def _fill(conn: _Conn, deadline: _Deadline) -> None:
        conn.sock.settimeout(deadline.left())
        chunk = conn.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        conn.buf += chunk

    def _read_response(
        self, conn: _Conn, method: str, deadline: _Deadline
    ) -> tuple[int, bool, bytes]:
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            while end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ValueError("response head too long")
                self._fill(conn, deadline)
                end = buf.find(b"\r\n\r\n")
            lines = bytes(buf[:end]).split(b"\r\n")
            del buf[: end + 4]
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise ValueError(f"bad status line {lines[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue): the real one follows
            break
        length = -1
        chunked = False
        keep = parts[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"content-length":
                length = int(value.strip())
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif key == b"connection":
                token = value.strip().lower()
                if token == b"close":
                    keep = False
                elif token == b"keep-alive":
                    keep = True
        if method == "HEAD" or status in (204, 304):
            return status, keep, b""
        if chunked:
            return status, keep, self._read_chunked(conn, deadline)
        if length >= 0:
            while len(buf) < length:
                self._fill(conn, deadline)
            payload = bytes(buf[:length])
            del buf[:length]
            return status, keep, payload
        # no length: the body runs to the end of the connection
        while True:
            conn.sock.settimeout(deadline.left())
            chunk = conn.sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        payload = bytes(buf)
        buf.clear()
        return status, False, payload

    def _read_chunked(self, conn: _Conn, deadline: _Deadline) -> bytes:
        buf = conn.buf
        out = bytearray()
        while True:
            nl = buf.find(b"\r\n")
            while nl < 0:
                self._fill(conn, deadline)
                nl = buf.find(b"\r\n")
            size = int(bytes(buf[:nl]).split(b";", 1)[0].strip(), 16)
            del buf[: nl + 2]
            if size == 0:
                # trailers, if any, end with an empty line
                while True:
                    nl = buf.find(b"\r\n")
                    while nl < 0:
                        self._fill(conn, deadline)
                        nl = buf.find(b"\r\n")
                    line = bytes(buf[:nl])
                    del buf[: nl + 2]
                    if not line:
                        return bytes(out)
            while len(buf) < size + 2:
                self._fill(conn, deadline)
            out += buf[:size]
            del buf[: size + 2]

    # -- the rest of the port -----------------------------------------------------------------

    def stream(
        self, path: str, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> Stream:
        return self._streams.stream(path, headers, connect_timeout, read_timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._streams.close()
