"""Stop signals of the long-running commands (``koord-scheduler run``/``extender``, koordlet).

A Python signal handler runs in the main thread between two bytecodes — possibly in the middle
of a log write that holds structlog's stream lock, which is not reentrant. A handler that logs
can then wait for a lock its own thread holds: the process never stops (a scheduler replica in
that state keeps renewing its Lease without scheduling until kubelet's SIGKILL). So the handler
only records the signal and sets an event; the command says "stopping" from its main thread.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from types import FrameType
from typing import Any

__all__ = ["StopSignals"]


class StopSignals:
    """Sets ``event`` on SIGTERM/SIGINT and remembers the first signal's name (``received``)."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()
        self.received = ""

    def handle(self, signum: int, frame: FrameType | None) -> None:
        # No logging, no locks: see the module docstring.
        if not self.received:
            self.received = signal.Signals(signum).name
        self.event.set()

    def install(
        self, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> dict[signal.Signals, Any]:
        """Handle ``signals`` (main thread only); returns the handlers they had before."""
        return {s: signal.signal(s, self.handle) for s in signals}
