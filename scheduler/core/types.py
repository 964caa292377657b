"""The scheduler core's public values: what it reports (``Placement``, ``Preemption``,
``QueueStats``) and what it is given (``SchedulerObserver``, the default clock).

Plain frozen records and protocols; nothing here touches scheduling state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from apis.core import Pod
from scheduler.framework.profile import Observer


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


class SchedulerObserver(Observer, Protocol):
    """What the metrics module is told, beyond extension-point timings."""

    def attempt(self, result: str, profile: str, seconds: float) -> None: ...

    def scheduled(self, attempts: int, sli_seconds: float) -> None: ...

    def preemption(self, victims: int | None) -> None:
        """A preemption attempt; ``victims`` is how many pods it evicted (None: it found none)."""
        ...


class NullSchedulerObserver:
    def extension_point(self, profile: str, ep: str, status: str, seconds: float) -> None:
        pass

    def plugin(self, plugin: str, ep: str, status: str, seconds: float) -> None:
        pass

    def attempt(self, result: str, profile: str, seconds: float) -> None:
        pass

    def scheduled(self, attempts: int, sli_seconds: float) -> None:
        pass

    def preemption(self, victims: int | None) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Placement:
    """The outcome of ``Scheduler.place``: ``resolution`` as ``BindOutcome``'s ("bound",
    "failed", "gone", "fenced", "rejected", "unknown") or "unschedulable" when the node no
    longer fits; ``message`` says why when it is not "bound"."""

    resolution: str
    message: str = ""

    @property
    def bound(self) -> bool:
        return self.resolution == "bound"


@dataclass(frozen=True, slots=True)
class Preemption:
    """A preemption this scheduler carried out: the preemptor, its node, the victims."""

    pod: Pod
    node: str
    victims: tuple[Pod, ...]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of the queue for metrics, published by ``run`` on the scheduling thread:
    pods per sub-queue, and pods in the unschedulable pool per (rejecting plugin, profile)."""

    pending: Mapping[str, int]
    unschedulable: Mapping[tuple[str, str], int]
