"""The fair-share server over real TCP sockets on 127.0.0.1, with Gemini's message bytes."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apis.fairshare import FairShareSpec
from koordlet.fairshare.client import GeminiClient
from koordlet.fairshare.protocol import REQUEST_SIZE, ProtocolError
from koordlet.fairshare.server import FairShareConfig, FairShareServer
from koordlet.fairshare.tokens import SchedulerConfig
from koordlet.pods.fairshare import FairSharePod

GiB = 2**30
FAST = SchedulerConfig(window_ms=2_000, base_quota_ms=50, min_quota_ms=20)


def pod(
    uid: str, minor: int = 0, request: float = 0.5, limit: float = 1.0, mem: int = GiB
) -> FairSharePod:
    return FairSharePod(uid, "ns", f"pod-{uid}", FairShareSpec(minor, request, limit, mem))


class Clock:
    """Monotonic time plus a jump the test controls."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock: Clock) -> Iterator[FairShareServer]:
    s = FairShareServer(FairShareConfig(scheduler=FAST, grace_s=60.0), clock=clock)
    s.start()
    yield s
    s.stop()


def relay(server: FairShareServer, p: FairSharePod) -> GeminiClient:
    ep = server.endpoint(p.uid)
    assert ep is not None
    return GeminiClient(ep.manager_ip, ep.manager_port, "ignored-by-relay", timeout_s=30)


def direct(server: FairShareServer, p: FairSharePod, name: str | None = None) -> GeminiClient:
    ep = server.endpoint(p.uid)
    assert ep is not None
    return GeminiClient(ep.scheduler_ip, ep.scheduler_port, name or p.uid, timeout_s=30)


def test_relay_answers_memory_from_the_allocation_pod_wide(server: FairShareServer) -> None:
    a = pod("a", mem=8 * GiB)
    ep = server.ensure(a)
    assert (ep.client_name, ep.scheduler_ip) == ("a", "127.0.0.1")
    with relay(server, a) as c1, relay(server, a) as c2:
        assert c1.mem_limit() == (0, 8 * GiB)
        assert c1.mem_update(5 * GiB, True)
        assert not c2.mem_update(4 * GiB, True)  # 5 + 4 > 8: refused, pod-wide
        assert c2.mem_update(3 * GiB, True)
        assert c2.mem_limit() == (8 * GiB, 8 * GiB)
        assert c2.mem_update(1 * GiB, False)
        assert c1.mem_limit() == (7 * GiB, 8 * GiB)
    with relay(server, a) as c3:  # both closed: their memory is given back
        for _ in range(100):
            if c3.mem_limit()[0] == 0:
                break
            time.sleep(0.05)
        assert c3.mem_limit() == (0, 8 * GiB)


def test_quota_through_relay_and_scheduler_port(server: FairShareServer) -> None:
    a, b = pod("a", request=0.5), pod("b", request=0.5)
    server.ensure(a)
    server.ensure(b)
    with relay(server, a) as ca, direct(server, b) as cb:
        assert ca.quota(0.0, 0.0) == 50.0  # base quota
        assert cb.quota(0.0, 30.0) == pytest.approx(40.0)  # 0.5 x 30 + 0.5 x 50
    stats = {s.uid: s for s in server.stats()}
    assert stats["a"].granted_ratio > 0 and stats["b"].share == 0.5


def test_only_one_holder_and_a_dead_holder_loses_the_token(server: FairShareServer) -> None:
    a, b = pod("a"), pod("b")
    server.ensure(a)
    server.ensure(b)
    ca, cb = relay(server, a), relay(server, b)
    got: list[float] = []
    assert ca.quota() == 50.0
    t = threading.Thread(target=lambda: got.append(cb.quota()))
    t.start()
    ca.close()  # dies holding the token: b is served once the 50 ms quota expires
    t.join(30)
    cb.close()
    assert got == [50.0]


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(struct.pack("<Q", 2**40) + bytes(REQUEST_SIZE - 8), id="name-length"),
        pytest.param(
            struct.pack("<Q", 1) + b"a\x00" + struct.pack("<ii", 1, 9) + bytes(62), id="type"
        ),
    ],
)
def test_malformed_message_closes_the_connection_and_the_server_serves_on(
    server: FairShareServer, frame: bytes
) -> None:
    a = pod("a")
    ep = server.ensure(a)
    with socket.create_connection((ep.manager_ip, ep.manager_port), timeout=30) as s:
        s.sendall(frame)
        assert s.recv(40) == b""  # closed by the server, no answer
    assert server.protocol_errors == 1
    with relay(server, a) as c:
        assert c.mem_limit() == (0, GiB)


def test_truncated_message_then_close_leaves_the_server_serving(server: FairShareServer) -> None:
    a = pod("a")
    ep = server.ensure(a)
    with socket.create_connection((ep.manager_ip, ep.manager_port), timeout=30) as s:
        s.sendall(bytes(30))
    with relay(server, a) as c:
        assert c.quota() == 50.0


def test_unknown_client_on_the_scheduler_port_gets_no_token(server: FairShareServer) -> None:
    a = pod("a")
    server.ensure(a)
    with direct(server, a, name="intruder") as c:
        c.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            c.quota()
    with direct(server, a) as c:
        assert c.quota() == 50.0


def test_sync_follows_the_pod_list(server: FairShareServer, clock: Clock) -> None:
    a, b = pod("a"), pod("b", minor=1)
    server.sync_pods([a, b])
    assert sorted(server.card_ports()) == [0, 1]
    old = server.endpoint("b")
    assert old is not None
    moved = pod("b", minor=0, request=0.3)
    server.sync_pods([a, moved])
    ep = server.endpoint("b")
    assert ep is not None and ep.scheduler_port == server.card_ports()[0]
    assert ep.manager_port == old.manager_port  # same relay, new card
    server.sync_pods([a])
    assert server.endpoint("b") is None
    with pytest.raises(OSError):
        socket.create_connection((old.manager_ip, old.manager_port), timeout=5).close()


def test_a_pod_announced_by_the_hook_survives_a_stale_pod_list(
    server: FairShareServer, clock: Clock
) -> None:
    server.ensure(pod("new"))
    server.sync_pods([])  # the list was read before the pod was bound
    assert server.endpoint("new") is not None
    clock.offset += 61.0
    server.sync_pods([])
    assert server.endpoint("new") is None


def test_a_listed_pod_goes_with_the_list_even_after_its_hook_ran(server: FairShareServer) -> None:
    p = pod("listed")
    server.sync_pods([p])
    server.ensure(p)  # the container is created after the list showed the pod
    server.sync_pods([])  # the pod was deleted
    assert server.endpoint("listed") is None


def test_oversubscribed_card_scales_requests(server: FairShareServer) -> None:
    server.sync_pods([pod("a", request=0.8), pod("b", request=0.4)])
    shares = {s.uid: s.share for s in server.stats()}
    assert shares == pytest.approx({"a": 0.8 / 1.2, "b": 0.4 / 1.2})


def test_restarted_agent_rebuilds_clients_on_the_same_ports(tmp_path: Path) -> None:
    cfg = FairShareConfig(scheduler=FAST, state_path=str(tmp_path / "state" / "fairshare.json"))
    a = pod("a", mem=2 * GiB)
    first = FairShareServer(cfg)
    first.start()
    before = first.ensure(a)
    first.stop()
    second = FairShareServer(cfg)
    second.start()
    try:
        second.sync_pods([a])  # rebuilt from the node's pods
        after = second.endpoint("a")
        assert after == before
        with GeminiClient(after.manager_ip, after.manager_port, "x") as c:
            assert c.mem_limit() == (0, 2 * GiB)
    finally:
        second.stop()


def test_corrupt_state_file_gives_new_ports(tmp_path: Path) -> None:
    state = tmp_path / "fairshare.json"
    state.write_text("{not json")
    s = FairShareServer(FairShareConfig(scheduler=FAST, state_path=str(state)))
    s.start()
    try:
        assert s.ensure(pod("a")).manager_port > 0
    finally:
        s.stop()


def test_client_rejects_a_mismatched_response() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(80)
        conn.sendall(struct.pack("<i", 99) + bytes(36))
        conn.close()

    t = threading.Thread(target=answer)
    t.start()
    with GeminiClient("127.0.0.1", port, "x") as c, pytest.raises(ProtocolError, match="99"):
        c.quota()
    t.join()
    listener.close()


def test_a_free_on_another_connection_counts_pod_wide(server: FairShareServer) -> None:
    """Gemini's hook library sends every request on a new connection: an allocation and its
    free arrive on different connections, and the pod's sum must follow both."""
    MiB = 2**20
    a = pod("a", mem=GiB)
    server.ensure(a)
    c1, c2, c3 = relay(server, a), relay(server, a), relay(server, a)
    assert c1.mem_update(700 * MiB, True)
    assert c2.mem_update(700 * MiB, False)
    assert c3.mem_limit() == (0, GiB)
    assert c3.mem_update(700 * MiB, True)  # refused before: the free was lost
    assert not c3.mem_update(400 * MiB, True)
    for c in (c1, c3, c2):  # the processes end (the free's last): all given back
        c.close()
    with relay(server, a) as c4:
        for _ in range(100):
            if c4.mem_limit()[0] == 0:
                break
            time.sleep(0.05)
        assert c4.mem_limit() == (0, GiB)


def test_a_free_of_more_than_the_pod_holds_leaves_zero(server: FairShareServer) -> None:
    a = pod("a", mem=GiB)
    server.ensure(a)
    with relay(server, a) as c1, relay(server, a) as c2:
        assert c1.mem_update(GiB // 2, True)
        assert c2.mem_update(GiB, False)
        assert c1.mem_limit() == (0, GiB)
        assert c1.mem_update(GiB, True)


def test_a_pod_with_an_impossible_share_is_left_out_and_the_others_served(
    server: FairShareServer,
) -> None:
    bad = FairSharePod("bad", "ns", "bad", FairShareSpec(0, -0.5, 1.0, GiB))
    server.sync_pods([pod("a"), bad])  # raised before, with "a" never given its share
    assert server.endpoint("a") is not None and server.endpoint("bad") is None
    with pytest.raises(ValueError, match="request"):
        server.ensure(bad)  # the runtime hook fails that container closed
    server.ensure(pod("b"))
    with relay(server, pod("b")) as c:
        assert c.quota() == 50.0


def test_a_limit_below_the_request_is_kept(server: FairShareServer) -> None:
    """Gemini's rule (issue 25.5): request 0.5 with limit 0.2 is capped at 0.2."""
    server.ensure(pod("a", request=0.5, limit=0.2))
    (stats,) = server.stats()
    assert (stats.share, stats.limit) == (0.5, 0.2)
