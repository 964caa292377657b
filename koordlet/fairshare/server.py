"""ADAPTER: Gemini's token scheduler protocol (SPEC section 11) on TCP sockets, one per card.

Role: for every shared card with opted-in pods, a ``TokenScheduler`` and a TCP listener that
Gemini's hook library (or Gemini's own pod manager) talks to as ``SCHEDULER_IP/PORT``; for
every opted-in pod a relay listener (``POD_MANAGER_IP/PORT``) that plays Gemini's pod manager:
it answers memory requests from the pod's allocation and keeps the pod-wide memory sum, and
forwards quota requests to the card's scheduler as the pod. One event-loop thread
(``selectors``) serves every socket and runs every card's scheduler; callers on other threads
(the pod sync, the runtime hook) change the pod set under a lock and wake the loop.

Invariants:

- A client is a pod, named by its UID (what the runtime hook puts in ``POD_NAME``). On a relay
  the name in a message is ignored (the relay knows its pod, a pod cannot pose as another);
  on a card's scheduler port a request from an unknown name is logged and not answered (as
  Gemini does), so an unknown process never gets a token.
- A malformed or truncated message closes that connection with one log line; the loop keeps
  serving. A closed connection's waiting requests are dropped and the memory it allocated is
  given back; a token it holds expires at quota end.
- A pod whose share the scheduler cannot take is refused alone (``sync_pods`` returns it, a
  served pod keeps its last good share); the loop, the other pods and later syncs go on.
- The pod set follows ``sync_pods`` (the koordlet's pod list): pods that appear are added,
  pods that end are removed (their relay closed), a pod whose card or shares changed is moved
  or updated. A pod announced by ``ensure`` (the runtime hook, before the pod list shows it)
  is kept for ``grace_s`` even if a sync does not list it.
- Ports are remembered in ``state_path`` (when given): a restarted agent rebuilds its clients
  from the node's pods and listens on the same ports, so hook libraries in running containers
  (whose env names those ports) reconnect to it.
- ``stop()`` closes every socket; ``start``/``stop`` are explicit, nothing opens on import.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from koordlet.fairshare.pods import FairSharePod
from koordlet.fairshare.protocol import (
    REQUEST_SIZE,
    MemLimitRequest,
    MemLimitResponse,
    MemUpdateRequest,
    MemUpdateResponse,
    ProtocolError,
    QuotaRequest,
    QuotaResponse,
    Response,
    decode_request,
    encode_response,
)
from koordlet.fairshare.tokens import ClientShare, SchedulerConfig, TokenScheduler

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNS_PER_POD",
    "ClientStats",
    "Endpoint",
    "FairShareConfig",
    "FairShareServer",
]

log = structlog.get_logger("koordlet.fairshare")

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


class FairShareServer:
    """See the module docstring."""

    def __init__(
        self,
        config: FairShareConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_grant: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config if config is not None else FairShareConfig()
        self._clock = clock
        self._on_grant = on_grant
        self._lock = threading.RLock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._cards: dict[int, _Card] = {}
        self._clients: dict[str, _Client] = {}
        self._conns: set[_Conn] = set()
        self._groups: dict[object, OrderedDict[_Conn, None]] = {}  # least recently used first
        self._lru: OrderedDict[_Conn, None] = OrderedDict()  # every connection, LRU first
        self._paused: list[tuple[float, socket.socket, object]] = []
        self._refusal_logged: dict[object, float] = {}
        self._pending: list[tuple[socket.socket, object]] = []
        self._saved: dict[str, dict[str, int]] = self._load_state()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.protocol_errors = 0
        self.evicted_connections = 0
        """Connections closed by the server: a pod at its bound, the node at its bound, idle."""
        self.refused_connections = 0
        """Connections closed at once: nothing of the pod (or the node) was idle to make room."""

    def _ms(self) -> float:
        return self._clock() * 1000.0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="fairshare", daemon=True)
        self._thread.start()
        log.info("fair-share server started", address=self.config.bind_address)

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping = True
            self._wake()
            thread.join(10.0)
        with self._lock:
            for conn in list(self._conns):
                self._close(conn, None)
            for client in self._clients.values():
                client.relay.close()
            for card in self._cards.values():
                card.listener.close()
            for sock, _ in self._pending:
                sock.close()
            self._pending.clear()
            self._paused.clear()
            self._clients.clear()
            self._cards.clear()
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the pod set -----------------------------------------------------------------------

    def ensure(self, pod: FairSharePod) -> Endpoint:
        """Serve ``pod`` (now, before the pod list shows it) and say where its hook connects.

        Raises ``OSError`` when a listener cannot be opened, ``ValueError`` for a share the
        scheduler cannot take (nothing changed): the caller fails the container closed.
        """
        with self._lock:
            new = pod.uid not in self._clients
            client = self._upsert(pod)
            if new:  # not (yet) in the pod list: keep it for grace_s even if a list omits it
                client.ensured_at = self._clock()
            self._apply_shares()
            card = self._cards[pod.spec.minor]
            endpoint = Endpoint(
                pod.uid, self.config.address, card.port, self.config.address, client.port
            )
            self._save_state()
        self._wake()
        return endpoint

    def sync_pods(self, pods: Iterable[FairSharePod]) -> list[tuple[FairSharePod, str]]:
        """Make the served pods those of the node's pod list (see the module docstring).

        Returns the pods that could not be served, each with the reason (a share the
        scheduler cannot take, a listener that cannot be opened); the others are served."""
        now = self._clock()
        refused: list[tuple[FairSharePod, str]] = []
        desired = {p.uid: p for p in pods}
        with self._lock:
            for uid, client in list(self._clients.items()):
                if uid in desired:
                    continue
                recent = (
                    client.ensured_at is not None and now - client.ensured_at < self.config.grace_s
                )
                if not recent:
                    self._remove(uid)
            for pod in desired.values():
                new = pod.uid not in self._clients
                try:
                    client = self._upsert(pod)
                except (OSError, ValueError) as exc:
                    log.error(
                        "fair-share: cannot serve pod",
                        pod=f"{pod.namespace}/{pod.name}",
                        error=str(exc),
                    )
                    refused.append((pod, str(exc)))
                    continue
                if new or client.ensured_at is not None:  # the list decides from now on
                    client.ensured_at = None
                    log.info("fair-share pod confirmed by the pod list", uid=pod.uid)
            self._apply_shares()
            self._save_state()
        self._wake()
        return refused

    def _card(self, minor: int) -> _Card:
        card = self._cards.get(minor)
        if card is None:
            sock = self._bind(self._saved.get("cards", {}).get(str(minor), 0))
            port = sock.getsockname()[1]
            sched = TokenScheduler(self._ms, self.config.scheduler)
            card = _Card(minor, sched, sock, port)
            self._cards[minor] = card
            self._register(sock, ("card", minor))
            log.info("fair-share scheduler listening", minor=minor, port=port)
        return card

    def _bind(self, port: int) -> socket.socket:
        if port:
            try:
                return _listen(self.config.bind_address, port)
            except OSError as exc:
                log.warning("fair-share: remembered port unavailable", port=port, error=str(exc))
        return _listen(self.config.bind_address, 0)

    def _upsert(self, pod: FairSharePod) -> _Client:
        """Serve ``pod``; ``ValueError`` (nothing changed) for a share the scheduler cannot
        take, ``OSError`` when a listener cannot be opened."""
        _share(pod)
        self._card(pod.spec.minor)
        client = self._clients.get(pod.uid)
        if client is None:
            sock = self._bind(self._saved.get("relays", {}).get(pod.uid, 0))
            client = _Client(pod, sock, sock.getsockname()[1])
            self._clients[pod.uid] = client
            self._register(sock, ("relay", pod.uid))
            log.info(
                "fair-share pod added",
                pod=f"{pod.namespace}/{pod.name}",
                uid=pod.uid,
                minor=pod.spec.minor,
                request=pod.spec.request,
                limit=pod.spec.limit,
                relay_port=client.port,
            )
        elif client.pod != pod:
            if client.pod.spec.minor != pod.spec.minor:
                log.info(
                    "fair-share pod moved",
                    uid=pod.uid,
                    old=client.pod.spec.minor,
                    new=pod.spec.minor,
                )
                for conn in self._conns:  # the old card drops their waiting requests
                    if conn.pod_uid == pod.uid:
                        conn.waiting = 0
            client.pod = pod
        return client

    def _remove(self, uid: str) -> None:
        client = self._clients.pop(uid)
        for conn in [c for c in self._conns if c.pod_uid == uid]:
            self._close(conn, None)
        self._unregister(client.relay)
        client.relay.close()
        log.info("fair-share pod removed", pod=f"{client.pod.namespace}/{client.pod.name}", uid=uid)

    def _apply_shares(self) -> None:
        by_card: dict[int, dict[str, ClientShare]] = {m: {} for m in self._cards}
        for uid, c in self._clients.items():
            by_card.setdefault(c.pod.spec.minor, {})[uid] = _share(c.pod)
        for minor, shares in by_card.items():
            sched = self._card(minor).scheduler
            before = sched.oversubscription
            sched.set_clients(shares)
            if sched.oversubscription and sched.oversubscription != before:
                log.warning(
                    "fair-share: card over-subscribed, requests scaled down",
                    minor=minor,
                    requested=round(sched.oversubscription, 4),
                )

    # -- event loop ------------------------------------------------------------------------

    def _register(self, sock: socket.socket, data: object) -> None:
        self._pending.append((sock, data))

    def _unregister(self, sock: socket.socket) -> None:
        self._pending = [(s, d) for s, d in self._pending if s is not sock]
        self._paused = [p for p in self._paused if p[1] is not sock]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _run(self) -> None:
        while not self._stopping:
            with self._lock:
                for sock, data in self._pending:
                    self._selector.register(sock, selectors.EVENT_READ, data)
                self._pending.clear()
                self._resume_listeners()
                self._reap_idle()
                timeout = self._timeout()
            # epoll counts whole milliseconds, rounded up: wake a millisecond early and poll
            # the last stretch, so that a token coming free at quota expiry is granted on time.
            wait = None if timeout is None else timeout - 0.001 if timeout > 0.001 else 0.0
            try:
                events = self._selector.select(wait)
            except OSError as exc:  # a socket closed under us; go round again
                log.debug("fair-share select failed", error=str(exc))
                continue
            if not events and wait == 0.0 and timeout:
                time.sleep(min(timeout, 0.0001))
            with self._lock:
                for key, mask in events:
                    self._event(key, mask)
                self._schedule()

    def _timeout(self) -> float | None:
        now = self._ms()
        deadlines = [
            d for c in self._cards.values() if (d := c.scheduler.next_deadline()) is not None
        ]
        secs = [(min(deadlines) - now) / 1000.0] if deadlines else []
        now_s = self._clock()
        if self._paused:
            secs.append(min(p[0] for p in self._paused) - now_s)
        if self._lru and self.config.idle_timeout_s:
            oldest = next(iter(self._lru))
            secs.append(oldest.last_active + self.config.idle_timeout_s - now_s)
        if not secs:
            return None
        return max(0.0, min(secs))

    # -- connection bounds -----------------------------------------------------------------

    def _conn_cap(self) -> int:
        """The most fair-share connections the node may hold now."""
        if self.config.max_connections:
            return self.config.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft <= 0 or soft > _NO_FD_LIMIT:
            soft = _NO_FD_LIMIT
        reserve = self.config.reserve_fds or min(256, soft // 4)
        listeners = len(self._clients) + len(self._cards)
        return max(1, soft - reserve - listeners - _FD_SLACK)

    def _touch(self, conn: _Conn) -> None:
        conn.last_active = self._clock()
        self._lru.move_to_end(conn)
        group = self._groups.get(conn.group)
        if group is not None:
            group.move_to_end(conn)

    @staticmethod
    def _oldest_idle(conns: Iterable[_Conn]) -> _Conn | None:
        """The least recently used idle connection, one that carries no memory first."""
        fallback = None
        for conn in conns:
            if not conn.idle:
                continue
            if not any(conn.memory.values()):
                return conn
            if fallback is None:
                fallback = conn
        return fallback

    def _admit(self, group: object) -> bool:
        """Make room for one more connection of ``group``; False if there is none."""
        members = self._groups.get(group)
        if members is not None and len(members) >= self.config.max_conns_per_pod:
            victim = self._oldest_idle(members)
            if victim is None:
                return False
            self._evict(victim)
        cap = self._conn_cap()
        while len(self._conns) >= cap:
            largest = max(self._groups.values(), key=len)
            victim = self._oldest_idle(largest) or self._oldest_idle(self._lru)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _evict(self, conn: _Conn) -> None:
        self.evicted_connections += 1
        self._close(conn, None, evicted=True)

    def _refuse(self, group: object, reason: str) -> None:
        self.refused_connections += 1
        now = self._clock()
        last = self._refusal_logged.get(group)
        if last is None or now - last >= _REFUSAL_LOG_S:
            self._refusal_logged[group] = now
            log.warning(
                "fair-share: connection refused",
                group=str(group),
                reason=reason,
                refused_total=self.refused_connections,
            )

    def _pause(self, listener: socket.socket, data: tuple[str, object], exc: OSError) -> None:
        """Out of file descriptors: rest the listener (a readable listener that cannot accept
        would spin the loop), and close the least recently used idle connection."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(listener)
        self._paused.append((self._clock() + _ACCEPT_PAUSE_S, listener, data))
        self._refuse(data, f"accept failed: {exc}")
        if self._groups:
            largest = max(self._groups.values(), key=len)
            victim = self._oldest_idle(largest) or self._oldest_idle(self._lru)
            if victim is not None:
                self._evict(victim)

    def _resume_listeners(self) -> None:
        if not self._paused:
            return
        now = self._clock()
        due = [p for p in self._paused if p[0] <= now]
        self._paused = [p for p in self._paused if p[0] > now]
        for _, sock, data in due:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.register(sock, selectors.EVENT_READ, data)

    def _reap_idle(self) -> None:
        limit = self.config.idle_timeout_s
        if not limit:
            return
        now = self._clock()
        while self._lru:
            conn = next(iter(self._lru))
            if now - conn.last_active < limit:
                return
            if conn.idle:
                self._evict(conn)
            else:  # waiting for a token: in use
                self._touch(conn)

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        data = key.data
        if data == "wake":
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
            return
        if isinstance(data, tuple):
            self._accept(key.fileobj, data)  # type: ignore[arg-type]
            return
        if isinstance(data, _Conn):
            if mask & selectors.EVENT_READ:
                self._read(data)
            if mask & selectors.EVENT_WRITE and not data.closed:
                self._flush(data)

    def _accept(self, listener: socket.socket, data: tuple[str, object]) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause(listener, data, exc)
            return
        client = None
        if data[0] == "card":
            minor = int(data[1])  # type: ignore[call-overload]
            group: object = ("card", minor)
        else:
            uid = str(data[1])
            client = self._clients.get(uid)
            if client is None:
                sock.close()
                return
            group, minor = uid, client.pod.spec.minor
        if not self._admit(group):
            sock.close()
            self._refuse(group, "every connection of it is in use")
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            return
        conn = _Conn(sock, client.pod.uid if client else None, minor, group, self._clock())
        if client is not None and client.retained:
            conn.memory[client.pod.uid] = client.retained
            client.retained = 0
        self._conns.add(conn)
        self._lru[conn] = None
        self._groups.setdefault(group, OrderedDict())[conn] = None
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_MAX_BUFFER)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(conn, f"receive failed: {exc}")
            return
        if not data:
            reason = f"truncated message ({len(conn.inbuf)} bytes)" if conn.inbuf else None
            self._close(conn, reason)
            return
        conn.inbuf += data
        self._touch(conn)
        while len(conn.inbuf) >= REQUEST_SIZE and not conn.closed:
            frame = bytes(conn.inbuf[:REQUEST_SIZE])
            del conn.inbuf[:REQUEST_SIZE]
            try:
                req = decode_request(frame)
            except ProtocolError as exc:
                self.protocol_errors += 1
                self._close(conn, f"malformed message: {exc}")
                return
            self._handle(conn, req)

    def _close(self, conn: _Conn, reason: str | None, *, evicted: bool = False) -> None:
        """Close ``conn``. Its net memory is given back when its peer went (Gemini: the hook
        library's connections close when its process ends) but, when the server closed it
        (``evicted``), handed to the pod's newest connection: the process still runs."""
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        self._lru.pop(conn, None)
        members = self._groups.get(conn.group)
        if members is not None:
            members.pop(conn, None)
            if not members:
                del self._groups[conn.group]
                self._refusal_logged.pop(conn.group, None)
        if reason is not None:
            log.warning(
                "fair-share connection closed",
                reason=reason,
                pod_uid=conn.pod_uid,
                minor=conn.minor,
            )
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()
        for card in self._cards.values():
            card.scheduler.cancel_where(lambda t: isinstance(t, tuple) and t[0] is conn)
        for uid, nbytes in conn.memory.items():
            client = self._clients.get(uid)
            if client is None or not nbytes:
                continue
            if not evicted:
                client.memory_net -= nbytes
                continue
            heir = next(reversed(members), None) if members else None
            if heir is not None:
                heir.memory[uid] = heir.memory.get(uid, 0) + nbytes
            else:
                client.retained += nbytes

    def _send(self, conn: _Conn, rsp: Response) -> None:
        if conn.closed:
            return
        conn.outbuf += encode_response(rsp)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._close(conn, f"send failed: {exc}")
            return
        del conn.outbuf[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._selector.modify(conn.sock, events, conn)

    def _handle(self, conn: _Conn, req: QuotaRequest | MemLimitRequest | MemUpdateRequest) -> None:
        uid = conn.pod_uid if conn.pod_uid is not None else req.name
        client = self._clients.get(uid)
        if client is None or (conn.pod_uid is None and client.pod.spec.minor != conn.minor):
            log.warning(
                "fair-share: request from an unknown client ignored",
                client=req.name,
                minor=conn.minor,
            )
            return
        if isinstance(req, QuotaRequest):
            card = self._cards[client.pod.spec.minor]
            if card.scheduler.submit(uid, (conn, req.req_id), req.overuse_ms, req.burst_ms):
                conn.waiting += 1
        elif isinstance(req, MemLimitRequest):
            self._send(
                conn, MemLimitResponse(req.req_id, client.memory_used, client.pod.spec.memory_bytes)
            )
        else:
            self._send(conn, MemUpdateResponse(req.req_id, self._memory(conn, client, req)))

    @staticmethod
    def _memory(conn: _Conn, client: _Client, req: MemUpdateRequest) -> bool:
        """Pod-wide, as Gemini's pod manager: a free counts whichever connection it comes on
        (the hook library sends each request on a new one). The connection keeps its net
        (signed) so that its process's memory is given back when the peer closes it."""
        uid = client.pod.uid
        if req.is_allocate:
            if client.memory_used + req.nbytes > client.pod.spec.memory_bytes:
                return False
            client.memory_net += req.nbytes
            conn.memory[uid] = conn.memory.get(uid, 0) + req.nbytes
            return True
        freed = min(req.nbytes, client.memory_used)
        conn.memory[uid] = conn.memory.get(uid, 0) - freed
        client.memory_net -= freed
        return True

    def _schedule(self) -> None:
        for card in self._cards.values():
            while (grant := card.scheduler.poll()) is not None:
                conn, req_id = _ticket(grant.ticket)
                conn.waiting = max(0, conn.waiting - 1)
                client = self._clients.get(grant.client)
                if client is not None:
                    client.throttled_ms += grant.queued_ms
                self._send(conn, QuotaResponse(req_id, grant.quota_ms))
                if self._on_grant is not None:
                    self._on_grant(grant.waited_ms / 1000.0)

    # -- observation -----------------------------------------------------------------------

    def endpoint(self, uid: str) -> Endpoint | None:
        with self._lock:
            client = self._clients.get(uid)
            if client is None:
                return None
            card = self._cards[client.pod.spec.minor]
            return Endpoint(uid, self.config.address, card.port, self.config.address, client.port)

    def stats(self) -> list[ClientStats]:
        """Every served pod's target share, granted share and throttled time."""
        window = self.config.scheduler.window_ms
        with self._lock:
            out = []
            for uid, c in self._clients.items():
                sched = self._cards[c.pod.spec.minor].scheduler
                share = sched.share(uid)
                out.append(
                    ClientStats(
                        minor=c.pod.spec.minor,
                        uid=uid,
                        namespace=c.pod.namespace,
                        name=c.pod.name,
                        share=sched.effective_request(uid) if share is not None else 0.0,
                        limit=share.limit if share is not None else 0.0,
                        granted_ratio=min(1.0, sched.usage_ms(uid) / window),
                        throttled_s=c.throttled_ms / 1000.0,
                    )
                )
            return out

    def connection_stats(self) -> dict[str, int]:
        """Open connections by pod uid (``card:<minor>`` for a card's scheduler port)."""
        with self._lock:
            return {
                g if isinstance(g, str) else f"card:{g[1]}": len(m)  # type: ignore[index]
                for g, m in self._groups.items()
            }

    def card_ports(self) -> dict[int, int]:
        with self._lock:
            return {m: c.port for m, c in self._cards.items()}

    # -- state file ------------------------------------------------------------------------

    def _load_state(self) -> dict[str, dict[str, int]]:
        if not self.config.state_path:
            return {}
        try:
            raw = json.loads(Path(self.config.state_path).read_text())
            return {
                k: {str(n): int(p) for n, p in dict(raw.get(k, {})).items()}
                for k in ("cards", "relays")
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning(
                "fair-share state unreadable: new ports",
                path=self.config.state_path,
                error=str(exc),
            )
            return {}

    def _save_state(self) -> None:
        if not self.config.state_path:
            return
        state = {
            "cards": {str(m): c.port for m, c in self._cards.items()},
            "relays": {uid: c.port for uid, c in self._clients.items()},
        }
        if state == self._saved or not (state["cards"] or state["relays"] or self._saved):
            return  # unchanged, or nothing served and nothing remembered
        self._saved = state
        path = Path(self.config.state_path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(state, sort_keys=True))
            os.replace(tmp, path)
        except OSError as exc:
            log.error("fair-share state not written", path=str(path), error=str(exc))
