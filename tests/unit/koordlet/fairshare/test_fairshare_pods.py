"""The node's pod records -> fair-share clients, bad ones reported and left out."""

from __future__ import annotations

from apis.fairshare import DefaultLimit
from koordlet.pods.fairshare import fairshare_pods
from koordlet.pods.record import PodRecord

ALLOC = "scheduling.koordinator.sh/device-allocated"
GEMINI = {"koordinator.sh/gpu-isolation-provider": "Gemini"}
ONE = (
    '{"gpu":[{"minor":1,"resources":'
    '{"koordinator.sh/gpu-core":"20","koordinator.sh/gpu-memory":"1Gi"}}]}'
)


def test_clients_and_problems() -> None:
    records = [
        PodRecord("u1", "ns", "good", GEMINI, {ALLOC: ONE}),
        PodRecord("u2", "ns", "plain", {}, {ALLOC: ONE}),
        PodRecord("u3", "ns", "bad", GEMINI, {ALLOC: ONE, "koordinator.sh/gpu-core-limit": "x"}),
    ]
    pods, problems = fairshare_pods(records, DefaultLimit.REQUEST)
    assert [(p.uid, p.spec.minor, p.spec.request, p.spec.limit) for p in pods] == [
        ("u1", 1, 0.2, 0.2)
    ]
    assert problems == [
        "pod ns/bad: koordinator.sh/gpu-core-limit: 'x' is not a whole percent (0-100)"
    ]
