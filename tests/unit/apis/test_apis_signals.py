"""apis.signals: the stop-signal handler of the long-running commands never waits for a lock.

A signal can land while the main thread is inside a log write (structlog's stream lock held,
not reentrant). The handler used to log "stopping" itself: it then waited forever for the lock
its own thread held, and a scheduler replica never stopped (chaos seed 1978075360: a leader
that did not exit within 30 s of SIGTERM)."""

from __future__ import annotations

import io
import signal
import threading

import structlog

from apis.signals import StopSignals
from scheduler.observability import logs


class _SignalMidWrite(io.StringIO):
    """A log stream on which a signal arrives during the first write, as it may in a process."""

    def __init__(self, deliver: StopSignals) -> None:
        super().__init__()
        self._deliver = deliver

    def write(self, s: str) -> int:
        if not self._deliver.event.is_set():
            self._deliver.handle(signal.SIGTERM, None)  # what the interpreter runs there
        return super().write(s)


def test_a_stop_signal_during_a_log_write_stops_without_waiting_for_the_log() -> None:
    signals = StopSignals()
    stream = _SignalMidWrite(signals)
    logs.configure("json", "info", stream, stdlib=False)
    try:
        writer = threading.Thread(
            target=lambda: structlog.get_logger("t").info("a line"), daemon=True
        )
        writer.start()
        writer.join(5)
        assert not writer.is_alive(), "the handler waited for the log lock its thread holds"
        assert signals.event.is_set()
        assert signals.received == "SIGTERM"
        assert '"a line"' in stream.getvalue()
    finally:
        logs.configure("json", "warning", io.StringIO(), stdlib=False)


def test_the_first_signal_is_the_one_remembered_and_install_returns_the_old_handlers() -> None:
    signals = StopSignals()
    previous = signals.install([signal.SIGUSR1])
    try:
        assert signal.getsignal(signal.SIGUSR1) == signals.handle
        signals.handle(signal.SIGINT, None)
        signals.handle(signal.SIGTERM, None)
        assert signals.received == "SIGINT"
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert signal.getsignal(signal.SIGUSR1) == previous[signal.SIGUSR1]
