"""The fair-share service: first sync at start, clients kept when the pod list fails."""

from __future__ import annotations

import time

from structlog.testing import capture_logs

from koordlet.fairshare.server import FairShareServer
from koordlet.fairshare.service import FairShareService
from koordlet.pods.fairshare import FairSharePod
from koordlet.pods.record import PodRecord

ALLOC = "scheduling.koordinator.sh/device-allocated"
GEMINI = {"koordinator.sh/gpu-isolation-provider": "Gemini"}
SHARED = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"40"}}]}'


class PodList:
    def __init__(self) -> None:
        self.records: list[PodRecord] = []
        self.fail = False

    def __call__(self) -> list[PodRecord]:
        if self.fail:
            raise RuntimeError("apiserver unavailable")
        return list(self.records)


def test_sync_follows_the_list_and_survives_its_failures() -> None:
    pods = PodList()
    pods.records = [
        PodRecord("u1", "ns", "a", GEMINI, {ALLOC: SHARED}),
        PodRecord("u2", "ns", "bad", GEMINI, {ALLOC: SHARED, "koordinator.sh/gpu-core-limit": "5"}),
    ]
    server = FairShareServer()
    service = FairShareService(server, pods, interval_s=3600)
    with capture_logs() as logs:
        service.start()  # the first sync runs before start returns
        try:
            assert server.endpoint("u1") is not None and server.endpoint("u2") is None
            pods.fail = True
            assert not service.sync_once()
            assert server.endpoint("u1") is not None  # kept on an API error
            pods.fail, pods.records = False, []
            assert service.sync_once()
            assert server.endpoint("u1") is None
        finally:
            service.stop()
            service.stop()
    events = [e["event"] for e in logs]
    assert events.count("fair-share: pod not served") == 1
    assert "fair-share: pod list unavailable, clients kept" in events


def test_a_bad_pod_affects_only_itself() -> None:
    """Issue 25.3: one pod with ``gpu-core: -50`` killed the sync thread; after that no new
    Gemini pod got a quota, and deleting the bad pod did not recover."""
    bad_alloc = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-50"}}]}'
    pods = PodList()
    pods.records = [
        PodRecord("u1", "ns", "a", GEMINI, {ALLOC: SHARED}),
        PodRecord("u2", "ns", "bad", GEMINI, {ALLOC: bad_alloc}),
    ]
    reported: list[tuple[str, str]] = []
    server = FairShareServer()
    service = FairShareService(
        server, pods, interval_s=0.01, on_problem=lambda r, msg: reported.append((r.uid, msg))
    )
    service.start()
    try:
        assert server.endpoint("u1") is not None and server.endpoint("u2") is None
        assert [uid for uid, _ in reported] == ["u2"] and "gpu-core" in reported[0][1]
        pods.records = [*pods.records, PodRecord("u3", "ns", "c", GEMINI, {ALLOC: SHARED})]
        for _ in range(200):  # the sync thread lives on and serves the new pod
            if server.endpoint("u3") is not None:
                break
            time.sleep(0.01)
        assert server.endpoint("u3") is not None
        pods.records = [r for r in pods.records if r.uid != "u2"]
        assert service.sync_once()
        assert server.endpoint("u1") is not None and server.endpoint("u3") is not None
    finally:
        service.stop()


def test_the_sync_thread_survives_an_unexpected_error() -> None:
    pods = PodList()
    pods.records = [PodRecord("u1", "ns", "a", GEMINI, {ALLOC: SHARED})]
    server = FairShareServer()
    calls: list[int] = []
    real_sync = server.sync_pods

    def buggy(listed: list[FairSharePod]) -> list[tuple[FairSharePod, str]]:
        calls.append(1)
        if len(calls) == 2:
            raise AssertionError("a bug")  # only this pass is lost
        return real_sync(listed)

    server.sync_pods = buggy  # type: ignore[method-assign]
    service = FairShareService(server, pods, interval_s=0.01)
    service.start()
    try:
        for _ in range(200):
            if len(calls) >= 4:
                break
            time.sleep(0.01)
        assert len(calls) >= 4
    finally:
        service.stop()
