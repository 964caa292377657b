"""The fair-share server's records: its configuration and endpoints, and the per-card,
per-pod and per-connection state the event loop keeps (``koordlet.fairshare.server``).

Invariants: plain data and small helpers only; nothing here opens a socket except ``_listen``,
which the server calls.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Final

from koordlet.fairshare.protocol import (
    REQUEST_SIZE,
)
from koordlet.fairshare.tokens import ClientShare, SchedulerConfig, TokenScheduler
from koordlet.pods.fairshare import FairSharePod

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNS_PER_POD",
    "ClientStats",
    "Endpoint",
    "FairShareConfig",
]

_MAX_BUFFER: Final = 64 * REQUEST_SIZE
_ACCEPT_PAUSE_S: Final = 0.1  # a listener that hit EMFILE rests this long (no busy loop)
_FD_SLACK: Final = 8  # selector, wake pair, state file, and a few spare
_NO_FD_LIMIT: Final = 1 << 20
_REFUSAL_LOG_S: Final = 60.0
DEFAULT_MAX_CONNS_PER_POD: Final = 64
DEFAULT_IDLE_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a pod's hook library connects (the runtime hook puts this in its env)."""

    client_name: str
    scheduler_ip: str
    scheduler_port: int
    manager_ip: str
    manager_port: int


@dataclass(frozen=True, slots=True)
class FairShareConfig:
    """Node-level settings of the fair-share server."""

    bind_address: str = "127.0.0.1"
    advertise_address: str = ""
    """The IP containers connect to (default: ``bind_address``); the node's IP in a cluster."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    state_path: str = ""
    grace_s: float = 120.0
    max_conns_per_pod: int = DEFAULT_MAX_CONNS_PER_POD
    """Open connections per pod's relay (and per card's scheduler port); at the bound a new
    connection closes the pod's least recently used idle one."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """A connection with nothing in flight for this long is closed (0: never)."""
    max_connections: int = 0
    """Open connections on the whole node; 0: from ``RLIMIT_NOFILE`` less ``reserve_fds``."""
    reserve_fds: int = 0
    """File descriptors never used for fair-share connections (the runtime-hook server, the
    API client, NVML); 0: a quarter of the soft ``RLIMIT_NOFILE``, at most 256."""

    def __post_init__(self) -> None:
        if self.max_conns_per_pod < 1:
            raise ValueError("max_conns_per_pod must be at least 1")
        if self.idle_timeout_s < 0 or self.max_connections < 0 or self.reserve_fds < 0:
            raise ValueError("idle timeout, max connections and reserved fds must not be negative")

    @property
    def address(self) -> str:
        return self.advertise_address or self.bind_address


@dataclass(frozen=True, slots=True)
class ClientStats:
    """One pod's numbers on its card, read by the metrics collector."""

    minor: int
    uid: str
    namespace: str
    name: str
    share: float
    """The pod's request after over-subscription scaling (its target share)."""
    limit: float
    granted_ratio: float
    """GPU time granted to it in the current window / the window."""
    throttled_s: float
    """Total time its requests waited for a token."""


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    pod_uid: str | None  # None: a card's scheduler port, name from each message
    minor: int
    group: object  # what its bound counts against: the pod uid, or ("card", minor)
    last_active: float = 0.0
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    memory: dict[str, int] = field(default_factory=dict)
    """pod uid -> net bytes allocated (less freed) on this connection; may be negative."""
    waiting: int = 0  # quota requests of it the scheduler has not answered yet
    closed: bool = False

    @property
    def idle(self) -> bool:
        return self.waiting == 0 and not self.outbuf and not self.inbuf


@dataclass(eq=False)
class _Card:
    minor: int
    scheduler: TokenScheduler
    listener: socket.socket
    port: int


@dataclass(eq=False)
class _Client:
    pod: FairSharePod
    relay: socket.socket
    port: int
    ensured_at: float | None = None
    memory_net: int = 0
    """The sum of the nets of the pod's open connections and ``retained``: what the pod holds
    (negative only transiently, when a process that freed memory outlives the one that
    allocated it); ``memory_used`` is never below 0."""
    retained: int = 0
    """Net bytes of connections the server closed (bound, idle) when none of the pod's was
    left to carry them: handed to the pod's next connection."""
    throttled_ms: float = 0.0

    @property
    def memory_used(self) -> int:
        return max(0, self.memory_net)


def _ticket(ticket: object) -> tuple[_Conn, int]:
    assert isinstance(ticket, tuple)
    conn, req_id = ticket
    assert isinstance(conn, _Conn) and isinstance(req_id, int)
    return conn, req_id


def _share(pod: FairSharePod) -> ClientShare:
    """The pod's share for its card's scheduler; ``ValueError`` naming the pod if impossible."""
    s = pod.spec
    try:
        return ClientShare(s.request, s.limit, s.memory_bytes)  # Gemini: the limit caps
    except ValueError as exc:
        raise ValueError(f"pod {pod.namespace}/{pod.name}: {exc}") from None


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
