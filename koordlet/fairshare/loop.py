"""The fair-share server's event loop: accepting, reading, answering and closing connections,
with the per-pod and node-wide connection bounds, idle closing and EMFILE pauses, and running
every card's token scheduler (``koordlet.fairshare.server`` composes it).

Invariants: everything here runs on the loop thread, under the server's lock where it touches
the pod set (see the server's module docstring for the protocol guarantees).
"""

from __future__ import annotations

import contextlib
import errno
import resource
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import structlog

from koordlet.fairshare.model import (
    _ACCEPT_PAUSE_S,
    _FD_SLACK,
    _MAX_BUFFER,
    _NO_FD_LIMIT,
    _REFUSAL_LOG_S,
    FairShareConfig,
    _Card,
    _Client,
    _Conn,
    _ticket,
)
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

__all__ = ["ConnectionLoop"]

log = structlog.get_logger("koordlet.fairshare")


class ConnectionLoop:
    """The loop half of ``FairShareServer`` (its fields are set by the server's ``__init__``)."""

    config: FairShareConfig
    _clock: Callable[[], float]
    _on_grant: Callable[[float], None] | None
    _lock: threading.RLock
    _selector: selectors.BaseSelector
    _wake_r: socket.socket
    _cards: dict[int, _Card]
    _clients: dict[str, _Client]
    _conns: set[_Conn]
    _groups: dict[object, OrderedDict[_Conn, None]]
    _lru: OrderedDict[_Conn, None]
    _paused: list[tuple[float, socket.socket, object]]
    _refusal_logged: dict[object, float]
    _pending: list[tuple[socket.socket, object]]
    _stopping: bool
    protocol_errors: int
    evicted_connections: int
    refused_connections: int

    def _ms(self) -> float:
        return self._clock() * 1000.0

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
