"""Fakes of our ports for tests: small, generic, deterministic.

``FakeClock`` satisfies ``scheduler.framework.interfaces.Clock``: time moves only when a test
moves it. ``ManualExecutor`` runs submitted work only when a test says so.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


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


class ManualExecutor(Executor):
    """An ``Executor`` that runs nothing until the test says so: ``run(i)`` runs the ``i``-th
    submitted task still waiting (modulo their number) in the calling thread. It makes "a
    bind is on the wire" a state a test can hold, reorder and release deterministically.
    ``shutdown`` runs what is left, in order."""

    def __init__(self) -> None:
        self.tasks: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.tasks.append((future, lambda: fn(*args, **kwargs)))
        return future

    def run(self, i: int = 0) -> bool:
        """Run one waiting task; False when none waits."""
        if not self.tasks:
            return False
        future, call = self.tasks.pop(i % len(self.tasks))
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the future, as a real executor does
                future.set_exception(exc)
        return True

    def run_all(self) -> None:
        while self.run(0):
            pass

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.run_all()
