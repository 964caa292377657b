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

This module is the pod set and the lifecycle; the event loop (connections, their bounds, the
card schedulers' turns) is ``koordlet.fairshare.loop``, the records ``koordlet.fairshare.model``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from koordlet.fairshare.loop import ConnectionLoop
from koordlet.fairshare.model import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNS_PER_POD,
    ClientStats,
    Endpoint,
    FairShareConfig,
    _Card,
    _Client,
    _Conn,
    _listen,
    _share,
)
from koordlet.fairshare.tokens import ClientShare, TokenScheduler
from koordlet.pods.fairshare import FairSharePod

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNS_PER_POD",
    "ClientStats",
    "Endpoint",
    "FairShareConfig",
    "FairShareServer",
]

log = structlog.get_logger("koordlet.fairshare")


class FairShareServer(ConnectionLoop):
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
