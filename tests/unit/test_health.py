"""scheduler.observability.health: kube-style check output and the HTTP endpoints on one port."""

from __future__ import annotations

import http.client
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import BinaryIO

import pytest

from scheduler.observability.health import Check, HealthServer, run_checks


def test_run_checks_formats_like_kube() -> None:
    ok = Check("ping", lambda: None)
    bad = Check("informer-sync", lambda: "caches not synced: Pod")
    assert run_checks([ok], "readyz", verbose=False) == (True, "ok")
    assert run_checks([ok], "readyz", verbose=True) == (True, "[+]ping ok\nreadyz check passed")
    assert run_checks([ok, bad], "readyz", verbose=False) == (
        False,
        "[-]informer-sync failed: caches not synced: Pod\nreadyz check failed",
    )


def test_a_raising_probe_fails() -> None:
    def boom() -> str | None:
        raise RuntimeError("oops")

    ok, body = run_checks([Check("x", boom)], "livez", verbose=False)
    assert not ok and "RuntimeError: oops" in body


@pytest.fixture
def server() -> Iterator[tuple[HealthServer, dict[str, str | None]]]:
    state: dict[str, str | None] = {"ready": "not leading", "live": None}
    srv = HealthServer(
        "127.0.0.1",
        0,
        live=[Check("threads", lambda: state["live"])],
        ready=[Check("ping", lambda: None), Check("leader", lambda: state["ready"])],
        metrics=lambda out: out.write(b"# HELP x y\n# TYPE x gauge\nx 1.0\n"),
    )
    srv.start()
    yield srv, state
    srv.stop()


def get(srv: HealthServer, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}{path}", timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_endpoints(server: tuple[HealthServer, dict[str, str | None]]) -> None:
    srv, state = server
    assert get(srv, "/healthz")[::2] == (200, "ok\n")
    assert get(srv, "/livez")[::2] == (200, "ok\n")
    code, _, body = get(srv, "/readyz")
    assert code == 503 and "[-]leader failed: not leading" in body
    state["ready"] = None
    assert get(srv, "/readyz")[::2] == (200, "ok\n")
    code, _, body = get(srv, "/readyz?verbose")
    assert code == 200 and "[+]ping ok" in body and "[+]leader ok" in body
    state["live"] = "threads not running: Pod"
    assert get(srv, "/livez")[0] == 503
    code, ctype, body = get(srv, "/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4") and "x 1.0" in body
    assert get(srv, "/nope")[0] == 404


def test_debug_explain_route() -> None:
    asked: list[tuple[str, str, str]] = []

    def explain(ns: str, name: str, output: str) -> tuple[int, bytes]:
        asked.append((ns, name, output))
        if name == "boom":
            raise RuntimeError("scheduler gone")
        if name == "absent":
            return 404, b"pod ns/absent not found\n"
        return 200, b'{"pod": "ns/p"}' if output == "json" else b"POD ns/p\n"

    srv = HealthServer("127.0.0.1", 0, explain=explain)
    srv.start()
    try:
        code, ctype, body = get(srv, "/debug/explain/ns/p")
        assert (code, ctype, body) == (200, "application/json", '{"pod": "ns/p"}')
        assert get(srv, "/debug/explain/ns/p?o=table")[::2] == (200, "POD ns/p\n")
        assert get(srv, "/debug/explain/ns/absent")[::2] == (404, "pod ns/absent not found\n")
        assert get(srv, "/debug/explain/ns/boom")[::2] == (500, "scheduler gone\n")
        for bad in ("/debug/explain/ns", "/debug/explain/ns/p/x", "/debug/explain/ns/p?o=yaml"):
            assert get(srv, bad)[0] == 400, bad
        assert asked == [("ns", "p", "json"), ("ns", "p", "table"), ("ns", "absent", "json"),
                         ("ns", "boom", "json")]  # fmt: skip
    finally:
        srv.stop()
    plain = HealthServer("127.0.0.1", 0)
    plain.start()
    try:
        assert get(plain, "/debug/explain/ns/p")[0] == 404
    finally:
        plain.stop()


def test_debug_memory_lists_allocation_sites_only_while_tracing(
    server: tuple[HealthServer, dict[str, str | None]],
) -> None:
    srv, _ = server
    assert not tracemalloc.is_tracing()
    code, _, body = get(srv, "/debug/memory")
    assert code == 404 and "PYTHONTRACEMALLOC=1" in body
    tracemalloc.start()
    try:
        held = [bytearray(1 << 20) for _ in range(4)]  # 4 MiB from one line
        code, _, body = get(srv, "/debug/memory")
    finally:
        tracemalloc.stop()
    assert code == 200 and body.startswith("traced: ")
    assert "test_health.py" in body.splitlines()[1] and len(held) == 4


def test_metrics_are_streamed_in_chunks_and_arrive_whole() -> None:
    """A large exposition is sent as it is written (chunked), and arrives byte for byte."""
    lines = [f'x{{card="{i}"}} {i}.0\n'.encode() for i in range(60_000)]  # ~1.2 MB

    def write(out: BinaryIO) -> None:
        for line in lines:
            out.write(line)

    srv = HealthServer("127.0.0.1", 0, metrics=write)
    srv.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as r:
            assert r.headers["Transfer-Encoding"] == "chunked"
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert r.read() == b"".join(lines)
        assert get(srv, "/healthz")[::2] == (200, "ok\n")  # the connection pool still works
    finally:
        srv.stop()


def test_a_failing_exposition_is_a_failed_scrape_not_a_partial_one() -> None:
    """The status line is sent before the body is made: a writer that raises midway must end
    the response without its last chunk (the client sees an error), and the server serves on."""

    def write(out: BinaryIO) -> None:
        out.write(b"# HELP x y\n# TYPE x gauge\n" + b"x 1.0\n" * 20_000)
        raise RuntimeError("collector bug")

    srv = HealthServer("127.0.0.1", 0, metrics=write)
    srv.start()
    try:
        url, incomplete = f"http://127.0.0.1:{srv.port}/metrics", http.client.IncompleteRead
        with pytest.raises(incomplete), urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        assert get(srv, "/healthz")[::2] == (200, "ok\n")
    finally:
        srv.stop()
