"""Unit tests of the chaos tier's TCP fault proxy (tests/e2e/chaos/faultproxy.py) against a
small loopback upstream: pass-through, latency, stalls (all / long requests), resets."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e.chaos.faultproxy import FaultProxy

LONG_AFTER = 0.3


class Upstream:
    """Loopback TCP server: echoes what it gets, and ``push(data)`` writes to every connection
    (a watch event). Counts connections that ended with a reset."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.resets = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except ConnectionResetError:
            self.resets += 1
        except OSError:
            pass

    def push(self, data: bytes) -> None:
        with self._lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread
        self.sock.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", upstream.port, long_after=LONG_AFTER) as p:
        yield p


def connect(proxy: FaultProxy, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += chunk
    return out


def nothing_arrives(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return not s.recv(1)  # b"" would be EOF: a failure too
    except TimeoutError:
        return True
    finally:
        s.settimeout(10)


def wait_until(pred: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_listens_on_loopback_only(proxy: FaultProxy) -> None:
    assert proxy._server is not None
    assert {s.getsockname()[0] for s in proxy._server.sockets} == {"127.0.0.1"}


@pytest.mark.parametrize("size", [1, 1000, 300_000], ids=["1B", "1KB", "300KB"])
def test_passes_bytes_unchanged_both_ways(proxy: FaultProxy, size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    with connect(proxy) as s:
        s.sendall(payload)
        assert recv_exact(s, size) == payload
    assert proxy.stats.bytes_up >= size and proxy.stats.bytes_down >= size


def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    proxy.set_latency(0.2)
    with connect(proxy) as s:
        start = time.monotonic()
        s.sendall(b"ping")
        assert recv_exact(s, 4) == b"ping"
        assert time.monotonic() - start >= 0.4  # 0.2 up + 0.2 down, at least
    with pytest.raises(ValueError):
        proxy.set_latency(-1)


def test_stall_all_holds_bytes_then_delivers_them_in_order(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        s.sendall(b"a")
        assert recv_exact(s, 1) == b"a"
        proxy.stall(60, "all")
        s.sendall(b"bcd")
        assert nothing_arrives(s, 0.5)
        proxy.unstall()
        assert recv_exact(s, 3) == b"bcd"
    assert proxy.stats.held_chunks >= 1


def test_stall_lifts_by_itself(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        proxy.stall(0.5, "all")
        assert proxy.stalled and 0 < proxy.stall_remaining <= 0.5
        s.sendall(b"xy")
        assert recv_exact(s, 2) == b"xy"  # within the socket's 10 s timeout
        assert not proxy.stalled


def test_stall_long_holds_quiet_streams_but_not_request_response(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    with connect(proxy) as watch, connect(proxy) as rpc:
        watch.sendall(b"W")
        assert recv_exact(watch, 1) == b"W"
        time.sleep(LONG_AFTER * 2)  # the watch's client is now quiet: a long request
        proxy.stall(60, "long")
        upstream.push(b"E")  # an event on every upstream connection
        rpc.sendall(b"R")  # a fresh request: its answer flows, the pushed E came before it
        assert recv_exact(rpc, 2) == b"ER"
        assert nothing_arrives(watch, 0.5)
        proxy.unstall()
        assert recv_exact(watch, 1) == b"E"  # late, not lost


@pytest.mark.parametrize(
    ("scope", "expect_rpc_reset"), [("all", True), ("long", False)], ids=["all", "long"]
)
def test_reset_closes_matching_connections_with_rst(
    proxy: FaultProxy, upstream: Upstream, scope: str, expect_rpc_reset: bool
) -> None:
    with connect(proxy) as watch:
        watch.sendall(b"W")
        assert recv_exact(watch, 1) == b"W"
        time.sleep(LONG_AFTER * 2)
        with connect(proxy) as rpc:
            rpc.sendall(b"R")
            assert recv_exact(rpc, 1) == b"R"
            n = proxy.reset(scope)  # type: ignore[arg-type]
            assert n == (2 if expect_rpc_reset else 1)
            with pytest.raises((ConnectionResetError, EOFError)):
                watch.sendall(b"x")
                recv_exact(watch, 1)
            if expect_rpc_reset:
                with pytest.raises((ConnectionResetError, EOFError)):
                    rpc.sendall(b"x")
                    recv_exact(rpc, 1)
            else:
                rpc.sendall(b"still")
                assert recv_exact(rpc, 5) == b"still"
        assert wait_until(lambda: upstream.resets >= 1)
        with connect(proxy) as fresh:  # later connections are unaffected
            fresh.sendall(b"ok")
            assert recv_exact(fresh, 2) == b"ok"
    assert proxy.stats.resets == n


def test_upstream_down_closes_the_client(upstream: Upstream) -> None:
    port = upstream.port
    upstream.close()
    with FaultProxy("127.0.0.1", port) as proxy:
        with pytest.raises((ConnectionResetError, EOFError)), connect(proxy) as s:
            recv_exact(s, 1)  # the reset may even reach connect() first
        assert wait_until(lambda: proxy.stats.upstream_failures == 1)


def test_bad_arguments_and_idempotent_stop(upstream: Upstream) -> None:
    proxy = FaultProxy("127.0.0.1", upstream.port).start()
    with pytest.raises(ValueError):
        proxy.stall(1, "watches")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        proxy.start()
    with connect(proxy) as s:
        s.sendall(b"z")
        assert recv_exact(s, 1) == b"z"
        proxy.stop()
        proxy.stop()
        with pytest.raises((ConnectionResetError, EOFError, OSError)):
            s.sendall(b"z")
            recv_exact(s, 1)
