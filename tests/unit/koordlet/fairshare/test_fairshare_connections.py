"""Connection bounds of the fair-share server (issue 25, finding 1).

Gemini's hook library opens a new TCP connection for every request and never closes it, so a
pod's relay sees an unbounded stream of connections even under normal load. The server must
bound them per pod, close idle ones (oldest first), keep serving every other pod, and never
take the file descriptors the rest of the agent (the runtime-hook gRPC server) needs.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from apis.fairshare import FairShareSpec
from koordlet.fairshare.client import GeminiClient
from koordlet.fairshare.protocol import QuotaRequest, encode_request
from koordlet.fairshare.server import FairShareConfig, FairShareServer
from koordlet.fairshare.tokens import SchedulerConfig
from koordlet.pods.fairshare import FairSharePod
from runtimehooks.api import api_pb2, api_pb2_grpc

GiB = 2**30
FAST = SchedulerConfig(window_ms=2_000, base_quota_ms=50, min_quota_ms=20)


def pod(uid: str, minor: int = 0, mem: int = GiB) -> FairSharePod:
    return FairSharePod(uid, "ns", f"pod-{uid}", FairShareSpec(minor, 0.3, 1.0, mem))


def closed_by_server(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


def wait_closed(socks: list[socket.socket], want: int) -> int:
    """How many of ``socks`` the server closed, waiting (bounded) for at least ``want``."""
    n = 0
    for _ in range(200):
        n = sum(1 for s in socks if closed_by_server(s))
        if n >= want:
            return n
        select.select([], [], [], 0.05)
    return n


@pytest.fixture
def small() -> Iterator[FairShareServer]:
    cfg = FairShareConfig(scheduler=FAST, max_conns_per_pod=4, max_connections=10)
    s = FairShareServer(cfg)
    s.start()
    yield s
    s.stop()


def relay(server: FairShareServer, uid: str) -> GeminiClient:
    ep = server.endpoint(uid)
    assert ep is not None
    return GeminiClient(ep.manager_ip, ep.manager_port, "x", timeout_s=10)


def test_a_pod_at_its_bound_loses_its_oldest_idle_connection(small: FairShareServer) -> None:
    small.ensure(pod("a"))
    clients: list[GeminiClient] = []
    try:
        for _ in range(10):  # like Gemini's hook: one request per new connection, kept open
            clients.append(relay(small, "a"))
            assert clients[-1].mem_limit() == (0, GiB)
        socks = [c.sock for c in clients]
        assert wait_closed(socks[:6], 6) == 6  # the 6 oldest went, oldest first
        assert not any(closed_by_server(s) for s in socks[6:])
        assert clients[-1].mem_limit() == (0, GiB)
        assert small.connection_stats()["a"] == 4
    finally:
        for c in clients:
            c.close()


def test_a_connection_waiting_for_a_token_is_not_evicted(small: FairShareServer) -> None:
    small.ensure(pod("a"))
    small.ensure(pod("b"))
    holder = relay(small, "b")
    waiting: list[GeminiClient] = []
    try:
        assert holder.quota() == 50.0  # b holds the token for 50 ms
        for _ in range(4):
            c = relay(small, "a")
            # a quota request that has to wait for b's token
            c.sock.sendall(encode_request(QuotaRequest("x", 0, 0.0, 0.0)))
            waiting.append(c)
        # every request is answered in turn; none of the waiting connections was dropped
        for c in waiting:
            assert len(c.sock.recv(40)) == 40
    finally:
        holder.close()
        for c in waiting:
            c.close()


def test_the_node_wide_bound_takes_from_the_largest_pod(small: FairShareServer) -> None:
    for uid in "abc":
        small.ensure(pod(uid))
    clients: dict[str, list[GeminiClient]] = {u: [] for u in "abc"}
    try:
        for uid, n in (("a", 4), ("b", 3), ("c", 3)):  # 10: the node-wide bound
            for _ in range(n):
                c = relay(small, uid)
                assert c.mem_limit() == (0, GiB)
                clients[uid].append(c)
        late = relay(small, "c")  # 11th: a's oldest goes, not b's or c's
        assert late.mem_limit() == (0, GiB)
        clients["c"].append(late)
        assert wait_closed([c.sock for c in clients["a"]], 1) == 1
        assert closed_by_server(clients["a"][0].sock) or clients["a"][0].sock.fileno() < 0
        assert not any(closed_by_server(c.sock) for c in clients["b"] + clients["c"])
        assert small.connection_stats() == {"a": 3, "b": 3, "c": 4}
    finally:
        for cs in clients.values():
            for c in cs:
                c.close()


def test_idle_connections_are_closed_after_the_idle_timeout() -> None:
    cfg = FairShareConfig(scheduler=FAST, idle_timeout_s=0.2)
    s = FairShareServer(cfg)
    s.start()
    try:
        s.ensure(pod("a"))
        with relay(s, "a") as c:
            assert c.mem_limit() == (0, GiB)
            assert wait_closed([c.sock], 1) == 1
        assert s.connection_stats() == {}
    finally:
        s.stop()


_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
    from apis.fairshare import FairShareSpec
    from koordlet.pods.fairshare import FairSharePod
    from koordlet.fairshare.server import FairShareConfig, FairShareServer
    from runtimehooks.hooks import new_default_registry
    from runtimehooks.server import HookServer

    server = FairShareServer(FairShareConfig())
    server.start()
    eps = {}
    for uid in ("a", "b"):
        p = FairSharePod(uid, "ns", uid, FairShareSpec(0, 0.3, 1.0, 2**30))
        eps[uid] = server.ensure(p).manager_port
    hooks = HookServer(new_default_registry(), Path(sys.argv[2]))
    hooks.start()
    print("PORTS " + json.dumps(eps), flush=True)
    sys.stdin.read()
    hooks.stop(None)
    server.stop()
    """
)


def test_one_pod_cannot_exhaust_the_agents_file_descriptors() -> None:
    """A child agent under RLIMIT_NOFILE 256: a pod opening 600 connections (Gemini's hook
    under load) is bounded, another pod is served, the GPU hook's gRPC server answers."""
    sock_dir = Path(f"/tmp/fs-fd-{os.getpid()}")
    sock_dir.mkdir(exist_ok=True)
    hook_sock = sock_dir / "hook.sock"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, "256", str(hook_sock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    conns: list[GeminiClient] = []
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        while line and not line.startswith("PORTS "):  # the agent's log lines come first
            line = child.stdout.readline()
        ports = json.loads(line.removeprefix("PORTS "))
        for _ in range(600):
            c = GeminiClient("127.0.0.1", ports["a"], "a", timeout_s=10)
            conns.append(c)
            assert c.mem_limit() == (0, GiB)  # every new connection is answered
        with GeminiClient("127.0.0.1", ports["b"], "b", timeout_s=10) as other:
            assert other.mem_limit() == (0, GiB)
            assert other.quota() > 0
        with grpc.insecure_channel(f"unix:{hook_sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            rsp = stub.PreCreateContainerHook(api_pb2.ContainerResourceHookRequest(), timeout=10)
            assert isinstance(rsp, api_pb2.ContainerResourceHookResponse)
        open_fds = len(os.listdir(f"/proc/{child.pid}/fd"))
        assert open_fds < 256
    finally:
        for c in conns:
            c.close()
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        hook_sock.unlink(missing_ok=True)
        sock_dir.rmdir()


def test_memory_of_a_closed_idle_connection_stays_with_the_pod() -> None:
    MiB = 2**20
    s = FairShareServer(FairShareConfig(scheduler=FAST, max_conns_per_pod=1))
    s.start()
    try:
        s.ensure(pod("a"))
        first = relay(s, "a")
        assert first.mem_update(700 * MiB, True)
        with relay(s, "a") as second:  # the first is closed to make room: its process runs on
            assert wait_closed([first.sock], 1) == 1
            assert second.mem_limit() == (700 * MiB, GiB)
            assert not second.mem_update(400 * MiB, True)
        first.close()
        for _ in range(200):  # the second's peer closed (its process ended): seen by the server
            if not s.connection_stats():
                break
            select.select([], [], [], 0.05)
        with relay(s, "a") as third:
            assert third.mem_limit() == (0, GiB)
    finally:
        s.stop()
