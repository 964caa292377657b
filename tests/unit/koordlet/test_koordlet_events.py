"""koordlet.events: Warning events on pods, posted on the recorder's own thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from koordlet.events import EventRecorder, pod_warning_event

T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)


class FakeEventAPI:
    def __init__(self, fail: bool = False, block: threading.Event | None = None) -> None:
        self.events: list[Mapping[str, Any]] = []
        self.fail = fail
        self.block = block
        self.done = threading.Event()
        self.entered = threading.Event()

    def create_event(self, event: Mapping[str, Any]) -> None:
        self.entered.set()
        if self.block is not None:
            self.block.wait(10)
        if self.fail:
            self.done.set()
            raise OSError("connection refused")
        self.events.append(event)
        self.done.set()


def _wait(cond: Any) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_event_shape() -> None:
    e = pod_warning_event(namespace="ns", name="p", uid="u", reason="R", message="m", host="n1",
                          now=T0)  # fmt: skip
    assert e["type"] == "Warning" and e["reason"] == "R" and e["message"] == "m"
    assert e["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns",
                                   "name": "p", "uid": "u"}  # fmt: skip
    assert e["metadata"] == {"generateName": "p.", "namespace": "ns"}
    assert e["firstTimestamp"] == e["lastTimestamp"] == "2024-05-01T10:00:00Z"


def test_posts_once_per_pod_and_reason_in_the_window() -> None:
    api = FakeEventAPI()
    now = [0.0]
    rec = EventRecorder(api, "n1", dedup_window_s=60, monotonic=lambda: now[0], clock=lambda: T0)
    rec.start()
    try:
        rec.warn("ns", "p", "u1", "R", "first")
        rec.warn("ns", "p", "u1", "R", "again")  # same pod and reason: deduplicated
        rec.warn("ns", "p", "u1", "Other", "x")
        now[0] = 61.0
        rec.warn("ns", "p", "u1", "R", "later")
        _wait(lambda: len(api.events) == 3)
    finally:
        rec.stop()
    assert [e["message"] for e in api.events] == ["first", "x", "later"]


def test_full_queue_drops_and_failed_posts_do_not_stop_the_recorder() -> None:
    gate = threading.Event()
    api = FakeEventAPI(block=gate)
    rec = EventRecorder(api, "n1", capacity=1)
    rec.start()
    try:
        rec.warn("ns", "p0", "u0", "R", "m")
        _wait(api.entered.is_set)  # p0 is being posted (blocked)
        for i in range(1, 5):  # p1 is queued, the rest dropped
            rec.warn("ns", f"p{i}", f"u{i}", "R", "m")
        assert rec.dropped == 3
        gate.set()
        _wait(lambda: rec.posted == 2)
        api.fail = True
        api.done.clear()
        rec.warn("ns", "q", "uq", "R", "m")
        _wait(api.done.is_set)
        api.fail = False
        rec.warn("ns", "r", "ur", "R", "m")
        _wait(lambda: any(e["involvedObject"]["name"] == "r" for e in api.events))
    finally:
        rec.stop()
