"""A loopback TCP fault proxy for the chaos tier: one per scheduler replica, between it and the
API server. TLS passes through as opaque bytes; the test injects faults at the byte level.

Faults (all callable from any thread while the proxy runs):

- ``set_latency(s)``: every chunk is delivered ``s`` seconds after it was read (both directions;
  ordering and throughput are kept: a chunk's delay does not add to the next one's).
- ``stall(seconds, scope)``: hold bytes from the server until the stall ends (auto-lifted after
  ``seconds``; ``unstall()`` lifts it early). Held bytes are delivered afterwards, in order, so a
  stalled watch is a *late* watch, not a lost one. ``scope="all"`` holds both directions of every
  connection (a partition); ``scope="long"`` holds only server bytes on connections whose client
  has been quiet for ``long_after`` seconds -- a watch stream (one request, then a long answer),
  while request/response traffic (binds, lists, lease updates) flows: a fresh request makes its
  connection "short" again.
- ``reset(scope)``: close the matching connections with a TCP RST on both sides (``"all"`` or
  ``"long"`` as above). Later connections are unaffected.

Invariants: listens on 127.0.0.1 only, on a free port; bytes are never reordered, duplicated or
altered within a connection; ``stop()`` closes every connection and is idempotent. The event
loop runs in one daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["FaultProxy", "ProxyStats", "Scope"]

Scope = Literal["all", "long"]
_CHUNK = 64 * 1024
_POLL_S = 0.02


@dataclass
class ProxyStats:
    connections: int = 0
    upstream_failures: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    resets: int = 0
    stalls: int = 0
    held_chunks: int = 0  # chunks that waited for a stall to end


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    last_client_data: float = field(default_factory=time.monotonic)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """See the module docstring. ``FaultProxy(host, port).start()``; ``.port`` to connect to."""

    def __init__(self, upstream_host: str, upstream_port: int, *, long_after: float = 2.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.long_after = long_after
        self.port = 0
        self.stats = ProxyStats()
        self._latency = 0.0
        self._stall_until = 0.0
        self._stall_scope: Scope = "all"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[_Conn] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("FaultProxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)

            async def listen() -> None:
                self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                self.port = self._server.sockets[0].getsockname()[1]

            loop.run_until_complete(listen())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"faultproxy-{id(self):x}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("FaultProxy did not start")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not loop.is_running():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                self._close(conn, rst=False)
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # ------------------------------------------------------------------ faults
    def set_latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency must be >= 0: {seconds}")
        self._latency = seconds

    def stall(self, seconds: float, scope: Scope = "all") -> None:
        if scope not in ("all", "long"):
            raise ValueError(f"scope must be 'all' or 'long': {scope!r}")
        self._stall_scope = scope
        self._stall_until = time.monotonic() + seconds
        self.stats.stalls += 1

    def unstall(self) -> None:
        self._stall_until = 0.0

    @property
    def stalled(self) -> bool:
        return time.monotonic() < self._stall_until

    @property
    def stall_remaining(self) -> float:
        return max(0.0, self._stall_until - time.monotonic())

    def reset(self, scope: Scope = "all") -> int:
        """RST the matching connections now; returns how many."""
        loop = self._loop
        if loop is None:
            return 0

        async def do() -> int:
            now = time.monotonic()
            victims = [c for c in self._conns if scope == "all" or self._is_long(c, now)]
            for conn in victims:
                self._close(conn, rst=True)
            self.stats.resets += len(victims)
            return len(victims)

        return asyncio.run_coroutine_threadsafe(do(), loop).result(10)

    # ------------------------------------------------------------------ internals
    def _is_long(self, conn: _Conn, now: float) -> bool:
        return now - conn.last_client_data >= self.long_after

    def _holds(self, conn: _Conn, downstream: bool) -> bool:
        now = time.monotonic()
        if now >= self._stall_until:
            return False
        if self._stall_scope == "all":
            return True
        return downstream and self._is_long(conn, now)

    def _close(self, conn: _Conn, *, rst: bool) -> None:
        self._conns.discard(conn)
        for w in (conn.client, conn.server):
            if rst:
                _rst(w)
            else:
                w.transport.abort()
        for t in conn.tasks:
            t.cancel()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        # A cancelled connection handler is an ordinary end (stop()), not an error to log.
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(creader, cwriter)

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            sreader, swriter = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), timeout=10
            )
        except (TimeoutError, OSError):
            self.stats.upstream_failures += 1
            _rst(cwriter)
            return
        conn = _Conn(cwriter, swriter)
        self._conns.add(conn)
        conn.tasks = [
            asyncio.ensure_future(self._pipe(conn, creader, swriter, downstream=False)),
            asyncio.ensure_future(self._pipe(conn, sreader, cwriter, downstream=True)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        if conn in self._conns:
            self._close(conn, rst=False)

    async def _pipe(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        downstream: bool,
    ) -> None:
        queue: deque[tuple[float, bytes]] = deque()
        more = asyncio.Event()
        done = False

        async def read() -> None:
            nonlocal done
            try:
                while data := await reader.read(_CHUNK):
                    now = time.monotonic()
                    if not downstream:
                        conn.last_client_data = now
                    queue.append((now + self._latency, data))
                    more.set()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                done = True
                more.set()

        reader_task = asyncio.ensure_future(read())
        try:
            while True:
                while not queue:
                    if done:
                        with contextlib.suppress(OSError, RuntimeError):
                            if writer.can_write_eof():
                                writer.write_eof()
                        return
                    more.clear()
                    await more.wait()
                due, data = queue[0]
                held = False
                while True:
                    now = time.monotonic()
                    if now < due:
                        await asyncio.sleep(min(due - now, _POLL_S * 5))
                    elif self._holds(conn, downstream):
                        held = True
                        await asyncio.sleep(_POLL_S)
                    else:
                        break
                if held:
                    self.stats.held_chunks += 1
                queue.popleft()
                if downstream:
                    self.stats.bytes_down += len(data)
                else:
                    self.stats.bytes_up += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            return
        finally:
            reader_task.cancel()
