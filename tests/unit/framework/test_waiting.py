"""Waiting pods: allowed by every plugin, rejected by one, or timed out."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from apis.core import decode_pod
from scheduler.framework.status import Code
from scheduler.framework.waiting import WaitingPod, WaitingPods

POD = decode_pod({"metadata": {"name": "p", "uid": "u1"}})


def test_allowed_only_when_every_plugin_allows() -> None:
    waiting = WaitingPod(POD, {"A": 30, "B": 30})
    waiting.allow("A")
    assert waiting.pending_plugins == ["B"]
    threading.Timer(0.01, waiting.allow, ("B",)).start()
    assert waiting.wait() is None


def test_one_rejection_decides() -> None:
    waiting = WaitingPod(POD, {"A": 30, "B": 30})
    waiting.reject("B", "gang incomplete")
    waiting.allow("A")
    status = waiting.wait()
    assert status is not None and status.code == Code.UNSCHEDULABLE
    assert (status.plugin, status.message) == ("B", "gang incomplete")


def test_the_earliest_timeout_rejects() -> None:
    waiting = WaitingPod(POD, {"slow": 30, "fast": 0.01})
    status = waiting.wait()
    assert status is not None and status.plugin == "fast"
    assert status.message == "rejected due to timeout after waiting 0.01s at plugin fast"
    assert waiting.timed_out_plugin == "fast"


@pytest.mark.parametrize(
    "decide",
    [
        pytest.param(lambda w: w.allow("A"), id="allowed"),
        pytest.param(lambda w: w.reject("A", "gang member failed"), id="rejected"),
    ],
)
def test_only_the_timeout_counts_as_timed_out(decide: Callable[[WaitingPod], None]) -> None:
    waiting = WaitingPod(POD, {"A": 0.05})
    decide(waiting)
    waiting.wait()
    assert waiting.timed_out_plugin == ""


def test_registry() -> None:
    pods = WaitingPods()
    pods.add(WaitingPod(POD, {"A": 1}))
    assert len(pods) == 1 and pods.get("u1") is not None
    assert [w.pod.name for w in pods] == ["p"]
    pods.remove("u1")
    assert pods.get("u1") is None
