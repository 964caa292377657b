"""Fakes of our ports for tests: small, generic, deterministic.

``FakeClock`` satisfies ``scheduler.framework.interfaces.Clock``: time moves only when a test
moves it.
"""

from __future__ import annotations


class FakeClock:
    """A clock that stands still until ``advance()`` or ``set()``; seconds as a float."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never backward); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back, got advance({seconds})")
        self._now += seconds
        return self._now

    def set(self, t: float) -> None:
        """Jump to ``t`` (not earlier than now: the clock is monotonic)."""
        if t < self._now:
            raise ValueError(f"a clock cannot go back from {self._now} to {t}")
        self._now = float(t)
