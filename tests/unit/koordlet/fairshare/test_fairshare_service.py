"""The fair-share service: first sync at start, clients kept when the pod list fails."""

from __future__ import annotations

from structlog.testing import capture_logs

from koordlet.fairshare.pods import PodRecord
from koordlet.fairshare.server import FairShareServer
from koordlet.fairshare.service import FairShareService

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
