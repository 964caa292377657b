"""koordlet.pods: decoding the pod spec's GPU requests (record), and the hook's pod cache."""

from __future__ import annotations

from typing import Any

import pytest

from koordlet.pods.cache import PodCache, PodMissing, PodUnavailable
from koordlet.pods.record import ContainerRecord, PodRecord, decode_pod_record


def pod(uid: str = "uid-1", name: str = "p") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "ns"},
        "spec": {
            "initContainers": [
                {"name": "setup"},
                {"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "proxy", "restartPolicy": "Always"},
            ],
            "containers": [
                {"name": "main", "resources": {"requests": {
                    "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "8Gi",
                    "cpu": "1"}}},
                {"name": "gs", "resources": {"limits": {"aliyun.com/gpu-mem": "3"}}},
                {"name": "zero", "resources": {"requests": {"koordinator.sh/gpu-core": "0"}}},
            ],
        },
    }  # fmt: skip


def test_decode_pod_record() -> None:
    assert decode_pod_record(pod()) == PodRecord(
        uid="uid-1",
        namespace="ns",
        name="p",
        containers=(
            ContainerRecord("setup", "init", {}),
            ContainerRecord("warm", "init", {"nvidia.com/gpu": 1}),
            ContainerRecord("proxy", "sidecar", {}),
            ContainerRecord(
                "main", "app", {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory": 8 << 30}
            ),
            ContainerRecord("gs", "app", {"aliyun.com/gpu-mem": 3}),
            ContainerRecord("zero", "app", {}),
        ),
    )


class Getter:
    """A PodGetter of our port: answers from a dict, or raises what it is told to."""

    def __init__(self, *pods: PodRecord, error: Exception | None = None) -> None:
        self.pods = {(p.namespace, p.name): p for p in pods}
        self.error = error
        self.calls: list[tuple[str, str, float]] = []

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> PodRecord:
        self.calls.append((namespace, name, timeout_s))
        if self.error is not None:
            raise self.error
        if (namespace, name) not in self.pods:
            raise PodMissing(f"pod {namespace}/{name} does not exist")
        return self.pods[(namespace, name)]


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


P1 = decode_pod_record(pod())


def test_listed_pods_are_answered_without_a_call() -> None:
    getter = Getter()
    cache = PodCache(getter)
    cache.replace([P1], listed_at=0)
    assert cache.lookup("uid-1", "ns", "p") is P1
    assert cache.lookup("", "ns", "p") is P1  # a request without uid: by name
    assert getter.calls == []


def test_a_miss_is_fetched_once_with_the_bounded_timeout_then_cached() -> None:
    getter = Getter(P1)
    cache = PodCache(getter, fetch_timeout_s=1.5)
    assert cache.lookup("uid-1", "ns", "p") == P1
    assert cache.lookup("uid-1", "ns", "p") == P1
    assert getter.calls == [("ns", "p", 1.5)]


def test_a_fetched_pod_survives_a_list_that_started_before_the_fetch() -> None:
    clock = Clock()
    getter = Getter(P1)
    cache = PodCache(getter, monotonic=clock)
    cache.lookup("uid-1", "ns", "p")
    getter.pods.clear()  # deleted since
    cache.replace([], listed_at=clock.now - 1)  # stale list: keep it
    assert cache.lookup("uid-1", "ns", "p") == P1
    cache.replace([], listed_at=clock.now + 1)  # a later list without it: gone
    with pytest.raises(PodMissing):
        cache.lookup("uid-1", "ns", "p")


ERRORS = [
    pytest.param(Getter(), PodMissing, id="not-found"),
    pytest.param(Getter(decode_pod_record(pod(uid="uid-new"))), PodMissing,
                 id="re-created-under-the-same-name"),
    pytest.param(Getter(error=PodUnavailable("timed out")), PodUnavailable, id="timeout"),
    pytest.param(None, PodUnavailable, id="no-api"),
]  # fmt: skip


@pytest.mark.parametrize(("getter", "error"), ERRORS)
def test_lookup_errors(getter: Getter | None, error: type[Exception]) -> None:
    with pytest.raises(error):
        PodCache(getter).lookup("uid-1", "ns", "p")


def test_one_record_carries_what_every_node_service_reads() -> None:
    obj = pod()
    obj["metadata"]["labels"] = {"koordinator.sh/gpu-isolation-provider": "Gemini", "n": None}
    obj["metadata"]["annotations"] = {
        "scheduling.koordinator.sh/device-allocated": '{"gpu":[]}',
        "koordinator.sh/gpu-core-limit": 50,  # not text: read as text, as the API server's
    }
    record = decode_pod_record(obj)
    assert record.labels == {"koordinator.sh/gpu-isolation-provider": "Gemini"}
    assert record.annotations == {
        "scheduling.koordinator.sh/device-allocated": '{"gpu":[]}',
        "koordinator.sh/gpu-core-limit": "50",
    }
    assert record.allocation == '{"gpu":[]}'
    assert decode_pod_record(pod()).allocation is None
    assert decode_pod_record({"metadata": {"labels": "x", "annotations": ["y"]}}) == PodRecord("")
