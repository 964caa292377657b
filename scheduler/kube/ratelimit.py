"""Client-side rate limiting and retry backoff for the Kubernetes adapter.

Role: ``TokenBucket`` is client-go's ``flowcontrol`` token bucket (``--kube-api-qps`` /
``--kube-api-burst``, and the event recorder's global budget); ``Backoff`` is the jittered
exponential delay between failed list/watch attempts.

Invariants: both take their clock (and the bucket its sleep) as parameters, so tests drive
them with a fake clock; a bucket with ``rate <= 0`` is unlimited; ``TokenBucket`` is
thread-safe and never hands out more than ``burst`` tokens at once; ``Backoff.next()`` grows
from ``initial`` by ``factor`` up to ``maximum`` (before jitter) and ``reset()`` starts over.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

__all__ = ["Backoff", "TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; starts full."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(self.burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._stamp)
        self._stamp = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)

    def try_acquire(self) -> bool:
        """Take a token if one is available now."""
        if self.unlimited:
            return True
        with self._lock:
            self._refill(self._clock())
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def reserve(self) -> float:
        """Take a token now or in the future; returns how many seconds to wait for it."""
        if self.unlimited:
            return 0.0
        with self._lock:
            self._refill(self._clock())
            self._tokens -= 1.0
            if self._tokens >= 0.0:
                return 0.0
            return -self._tokens / self.rate

    def acquire(self) -> None:
        """Block until a token is ours (client-go's ``Wait``)."""
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)

    def wait_time(self) -> float:
        """Seconds until a token would be available (0 when one is), without taking it."""
        if self.unlimited:
            return 0.0
        with self._lock:
            self._refill(self._clock())
            if self._tokens >= 1.0:
                return 0.0
            return (1.0 - self._tokens) / self.rate


class Backoff:
    """Exponential backoff with jitter: ``initial * factor**n`` capped at ``maximum``,
    multiplied by a random factor in ``[1 - jitter, 1 + jitter]``."""

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 10.0,
        *,
        factor: float = 2.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or maximum < initial or factor < 1 or not 0 <= jitter < 1:
            raise ValueError("need 0 < initial <= maximum, factor >= 1, 0 <= jitter < 1")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._current = initial

    def next(self) -> float:
        base = self._current
        self._current = min(self.maximum, self._current * self.factor)
        if not self.jitter:
            return base
        return base * (1.0 + self.jitter * (2.0 * self._rng.random() - 1.0))

    def reset(self) -> None:
        self._current = self.initial
