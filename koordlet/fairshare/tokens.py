"""The pure token scheduler of one shared GPU (SPEC section 11), with an injected clock.

Role: decide which waiting client gets the card's one token next and for how long. The
server (``koordlet.fairshare.server``) feeds it requests and asks ``poll()`` for grants; it
does no I/O and starts no thread, so every rule below is tested with a fake clock.

Model: a client is a pod on the card with ``request`` (guaranteed fraction of GPU time) and
``limit`` (most it may use). Every grant is recorded as ``(client, start, end)``; usage of a
client is the time its grants cover inside the sliding window ``[now - W, now]`` (a grant's
not-yet-elapsed part counts, so a grant is charged in full the moment it is given).

Invariants:

- At most one holder at a time: a grant is given only when no token is outstanding, i.e. the
  previous holder came back (asked again) or its quota expired. A client that dies holding a
  token therefore loses it at quota expiry and nobody waits longer than that.
- Only clients whose usage is below ``limit x W`` are granted. Among them, clients below
  their request go first, ordered by ``missing / (missing + usage)`` descending; otherwise the
  least used first; ties by arrival. When every waiting client is at its limit, nothing is
  granted and ``next_deadline()`` says when the oldest of their grants starts leaving the
  window.
- Quota = 0.5 x burst + 0.5 x previous quota, clamped to ``[min_quota, limit x W]``; the base
  quota when the client reported no burst.
- Overuse reported with a request is charged to the client's last grant: its end moves to
  ``min(now, end + overuse)``; a client that comes back early gets the unused rest back the
  same way.
- Requests are scaled when the card is over-subscribed: with ``sum(request) > 1`` every
  request is multiplied by ``1 / sum`` (limits are kept); ``oversubscription`` reports the sum.
- The limit is the cap whatever the request, as in Gemini's scheduler: a client whose limit
  is below its request gets at most its limit; the request only orders waiting clients.
- Removing a client drops its waiting requests; a token it holds still expires normally.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "ClientShare",
    "Grant",
    "SchedulerConfig",
    "TokenScheduler",
]

_EPS: Final = 1e-9


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Gemini's defaults, in milliseconds."""

    window_ms: float = 10_000.0
    base_quota_ms: float = 250.0
    min_quota_ms: float = 100.0

    def __post_init__(self) -> None:
        if not (self.window_ms > 0 and self.base_quota_ms > 0 and self.min_quota_ms > 0):
            raise ValueError("window, base quota and minimum quota must be positive")
        if self.min_quota_ms > self.window_ms:
            raise ValueError("the minimum quota must not exceed the window")


@dataclass(frozen=True, slots=True)
class ClientShare:
    """A client's share of the card: fractions of GPU time, and GPU memory in bytes."""

    request: float
    limit: float
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.request <= 1.0 or not 0.0 < self.limit <= 1.0:
            raise ValueError(f"request {self.request} / limit {self.limit} outside [0, 1]")
        if self.memory_bytes < 0:
            raise ValueError("memory limit must not be negative")


@dataclass(frozen=True, slots=True)
class Grant:
    """A token given: ``ticket`` is the caller's handle of the request it answers."""

    client: str
    ticket: Hashable
    quota_ms: float
    waited_ms: float
    """Time from when the request could have been served (its arrival, or the token coming
    free if it was held then) to this grant: the scheduler's own latency."""
    queued_ms: float = 0.0
    """Time from the request's arrival to this grant: how long the client was throttled."""


@dataclass(slots=True)
class _Record:
    start: float
    end: float


@dataclass(slots=True)
class _Client:
    share: ClientShare
    effective_request: float
    quota_ms: float
    burst_ms: float = 0.0
    grants: deque[_Record] = field(default_factory=deque)


@dataclass(slots=True)
class _Waiting:
    client: str
    ticket: Hashable
    arrived: float


class TokenScheduler:
    """One card's token scheduler; times are milliseconds of ``clock`` (see module docs)."""

    def __init__(self, clock: Callable[[], float], config: SchedulerConfig | None = None) -> None:
        self._clock = clock
        self.config = config if config is not None else SchedulerConfig()
        self._clients: dict[str, _Client] = {}
        self._waiting: list[_Waiting] = []
        self._holder: str | None = None
        self._hold_until = 0.0
        self._freed_at = clock()
        self.oversubscription = 0.0
        """Sum of the configured requests when above 1 (they were scaled down), else 0."""

    # -- clients ---------------------------------------------------------------------------

    def set_clients(self, shares: Mapping[str, ClientShare]) -> None:
        """Make the client set exactly ``shares`` (added, changed, removed)."""
        for name in [n for n in self._clients if n not in shares]:
            del self._clients[name]
        self._waiting = [w for w in self._waiting if w.client in shares]
        for name, share in shares.items():
            existing = self._clients.get(name)
            if existing is None:
                self._clients[name] = _Client(share, share.request, self.config.base_quota_ms)
            else:
                existing.share = share
        total = sum(s.request for s in shares.values())
        scale = 1.0 / total if total > 1.0 + _EPS else 1.0
        self.oversubscription = total if scale < 1.0 else 0.0
        for c in self._clients.values():
            c.effective_request = c.share.request * scale

    def clients(self) -> dict[str, ClientShare]:
        return {n: c.share for n, c in self._clients.items()}

    def effective_request(self, name: str) -> float:
        """The client's request after over-subscription scaling."""
        return self._clients[name].effective_request

    def share(self, name: str) -> ClientShare | None:
        c = self._clients.get(name)
        return c.share if c is not None else None

    # -- requests and grants ---------------------------------------------------------------

    def submit(self, client: str, ticket: Hashable, overuse_ms: float, burst_ms: float) -> bool:
        """A quota request; False (nothing queued) for an unknown client."""
        c = self._clients.get(client)
        if c is None:
            return False
        now = self._clock()
        if c.grants:
            last = c.grants[-1]
            last.end = max(last.start, min(now, last.end + max(0.0, overuse_ms)))
        c.burst_ms = max(0.0, burst_ms)
        if self._holder == client:
            self._release(now)
        self._waiting.append(_Waiting(client, ticket, now))
        return True

    def cancel(self, ticket: Hashable) -> None:
        """Drop a waiting request (its connection closed)."""
        self._waiting = [w for w in self._waiting if w.ticket != ticket]

    def cancel_where(self, match: Callable[[Hashable], bool]) -> None:
        """Drop every waiting request whose ticket ``match``es."""
        self._waiting = [w for w in self._waiting if not match(w.ticket)]

    def _release(self, now: float) -> None:
        self._holder = None
        self._freed_at = now

    def _expire(self, now: float) -> None:
        if self._holder is not None and now >= self._hold_until:
            self._holder = None
            self._freed_at = self._hold_until

    @property
    def holder(self) -> str | None:
        self._expire(self._clock())
        return self._holder

    def usage_ms(self, name: str, now: float | None = None) -> float:
        """Time the client's grants cover in the window ending ``now``."""
        t = self._clock() if now is None else now
        c = self._clients.get(name)
        return 0.0 if c is None else self._usage(c, t)

    def _usage(self, c: _Client, now: float) -> float:
        lo = now - self.config.window_ms
        while c.grants and c.grants[0].end <= lo:
            c.grants.popleft()
        return sum(g.end - max(g.start, lo) for g in c.grants)

    def quota_for(self, name: str) -> float:
        """The next quota of ``name`` by the adaptive rule (does not change state)."""
        c = self._clients[name]
        maximum = c.share.limit * self.config.window_ms
        q = self.config.base_quota_ms if c.burst_ms <= 0 else 0.5 * c.burst_ms + 0.5 * c.quota_ms
        return max(min(self.config.min_quota_ms, maximum), min(q, maximum))

    def priority(self, now: float | None = None) -> list[str]:
        """Waiting clients that may be granted, best first (the order ``poll`` uses)."""
        t = self._clock() if now is None else now
        return [w.client for w in self._ranked(t)]

    def _ranked(self, now: float) -> list[_Waiting]:
        window = self.config.window_ms
        keyed: list[tuple[tuple[int, float, float], _Waiting]] = []
        for w in self._waiting:
            c = self._clients[w.client]
            used = self._usage(c, now)
            if used >= c.share.limit * window - _EPS:
                continue
            missing = c.effective_request * window - used
            if missing > _EPS:
                keyed.append(((0, -missing / (missing + used), w.arrived), w))
            else:
                keyed.append(((1, used, w.arrived), w))
        keyed.sort(key=lambda kw: kw[0])
        return [w for _, w in keyed]

    def poll(self) -> Grant | None:
        """The next grant if one can be given now (the caller sends it), else None."""
        now = self._clock()
        self._expire(now)
        if self._holder is not None or not self._waiting:
            return None
        ranked = self._ranked(now)
        if not ranked:
            return None
        chosen = ranked[0]
        self._waiting.remove(chosen)
        c = self._clients[chosen.client]
        quota = self.quota_for(chosen.client)
        c.quota_ms = quota
        c.grants.append(_Record(now, now + quota))
        self._holder = chosen.client
        self._hold_until = now + quota
        waited = now - max(chosen.arrived, self._freed_at)
        return Grant(chosen.client, chosen.ticket, quota, max(0.0, waited), now - chosen.arrived)

    def next_deadline(self) -> float | None:
        """When ``poll`` may have something new without a new request (clock time), or None."""
        now = self._clock()
        self._expire(now)
        if self._holder is not None:
            return self._hold_until
        if not self._waiting:
            return None
        lo = now - self.config.window_ms
        starts = [
            g.start + self.config.window_ms
            for w in self._waiting
            for g in self._clients[w.client].grants
            if g.start > lo
        ]
        return min(starts) if starts else now + 1.0  # usage is already sliding out

    def waiting(self) -> list[str]:
        return [w.client for w in self._waiting]
