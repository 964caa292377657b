"""scheduler.observability.metrics: kube-scheduler's names, types, labels and buckets; the
scrape-time queue and device collectors; the exposition (no *_created series)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.core import Node, Pod, decode_node, decode_pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, Device
from scheduler.observability.metrics import (
    ATTEMPT_BUCKETS,
    EXTENSION_POINT_BUCKETS,
    PLUGIN_BUCKETS,
    POD_ATTEMPTS_BUCKETS,
    SLI_BUCKETS,
    SchedulerMetrics,
    exponential_buckets,
)

ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def families(m: SchedulerMetrics) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}


@pytest.mark.parametrize(
    ("buckets", "first", "last", "count"),
    [
        (ATTEMPT_BUCKETS, 0.001, 16.384, 15),
        (SLI_BUCKETS, 0.01, 5242.88, 20),
        (POD_ATTEMPTS_BUCKETS, 1, 16, 5),
        (EXTENSION_POINT_BUCKETS, 0.0001, 0.2048, 12),
        (PLUGIN_BUCKETS, 0.00001, 0.00001 * 1.5**19, 20),
    ],
    ids=["attempt", "sli", "pod-attempts", "extension-point", "plugin"],
)
def test_buckets_are_kube_schedulers(
    buckets: tuple[float, ...], first: float, last: float, count: int
) -> None:
    assert len(buckets) == count
    assert buckets[0] == first
    assert math.isclose(buckets[-1], last, rel_tol=1e-12)


def test_exponential_buckets_multiply_like_go() -> None:
    assert exponential_buckets(0.00001, 1.5, 3) == (0.00001, 0.00001 * 1.5, 0.00001 * 1.5 * 1.5)
    with pytest.raises(ValueError):
        exponential_buckets(0, 2, 3)


def test_observer_calls_become_kube_scheduler_series() -> None:
    m = SchedulerMetrics()
    m.attempt("scheduled", "koord-scheduler", 0.003)
    m.attempt("unschedulable", "koord-scheduler", 0.002)
    m.scheduled(2, 1.5)
    m.extension_point("koord-scheduler", "Filter", "Success", 0.0002)
    m.plugin("DeviceShare", "Filter", "Unschedulable", 0.00003)
    m.incoming("active", "PodAdd")
    m.incoming("active", "PodAdd")
    fams = families(m)

    attempts = fams["scheduler_schedule_attempts"]
    assert attempts.type == "counter"
    got = {(s.labels["result"], s.labels["profile"]): s.value for s in attempts.samples}
    assert got == {("scheduled", "koord-scheduler"): 1, ("unschedulable", "koord-scheduler"): 1}

    expected = {
        "scheduler_scheduling_attempt_duration_seconds": ({"result", "profile"}, ATTEMPT_BUCKETS),
        "scheduler_pod_scheduling_sli_duration_seconds": ({"attempts"}, SLI_BUCKETS),
        "scheduler_pod_scheduling_attempts": (set(), POD_ATTEMPTS_BUCKETS),
        "scheduler_framework_extension_point_duration_seconds": (
            {"extension_point", "status", "profile"},
            EXTENSION_POINT_BUCKETS,
        ),
        "scheduler_plugin_execution_duration_seconds": (
            {"plugin", "extension_point", "status"},
            PLUGIN_BUCKETS,
        ),
    }
    for name, (labels, buckets) in expected.items():
        fam = fams[name]
        assert fam.type == "histogram", name
        les = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")]
        assert les[: len(buckets) + 1] == [*buckets, math.inf], name
        names = {k for s in fam.samples for k in s.labels} - {"le"}
        assert names == labels, name
    sli = [s for s in fams["scheduler_pod_scheduling_sli_duration_seconds"].samples]
    assert {s.labels.get("attempts") for s in sli} == {"2"}
    incoming = fams["scheduler_queue_incoming_pods"].samples
    assert [(s.labels, s.value) for s in incoming] == [({"queue": "active", "event": "PodAdd"}, 2)]
    assert not any(name.endswith("_created") for name in fams)
    assert b"_created" not in m.exposition()


def test_registry_is_explicit() -> None:
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.attempt("scheduled", "p", 0.1)
    assert "scheduler_schedule_attempts" in families(a)
    assert not families(b)["scheduler_schedule_attempts"].samples
    reg = CollectorRegistry()
    assert SchedulerMetrics(reg).registry is reg


@dataclass
class Stats:
    pending: dict[str, int]
    unschedulable: dict[tuple[str, str], int]


def test_queue_gauges_read_the_published_snapshot() -> None:
    m = SchedulerMetrics()
    snapshot: list[Stats | None] = [None]
    m.watch_queue(lambda: snapshot[0])
    fams = families(m)
    assert fams["scheduler_pending_pods"].type == "gauge"
    assert fams["scheduler_pending_pods"].samples == []
    snapshot[0] = Stats(
        {"active": 3, "backoff": 1, "unschedulable": 2},
        {("DeviceShare", "koord-scheduler"): 2, ("NodeResourcesFit", "koord-scheduler"): 1},
    )
    fams = families(m)
    pending = {s.labels["queue"]: s.value for s in fams["scheduler_pending_pods"].samples}
    assert pending == {"active": 3, "backoff": 1, "unschedulable": 2, "gated": 0}
    unsched = {
        (s.labels["plugin"], s.labels["profile"]): s.value
        for s in fams["scheduler_unschedulable_pods"].samples
    }
    assert unsched == {
        ("DeviceShare", "koord-scheduler"): 2,
        ("NodeResourcesFit", "koord-scheduler"): 1,
    }


def test_a_failing_source_yields_no_samples() -> None:
    m = SchedulerMetrics()

    def broken() -> Any:
        raise RuntimeError("boom")

    m.watch_queue(broken)
    m.watch_devices(broken)
    fams = families(m)
    assert fams["scheduler_pending_pods"].samples == []
    assert fams["koord_scheduler_device_capacity"].samples == []


@dataclass
class View:
    nodes: dict[str, Node]
    devices: list[Device]
    pods: list[Pod] = field(default_factory=list)


def gpu_device(
    name: str, gpus: int, unhealthy: tuple[int, ...] = (), annotations: dict[str, str] | None = None
) -> Device:
    return Device.from_dict(
        {
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "devices": [
                    {
                        "type": "gpu",
                        "id": f"GPU-{m}",
                        "minor": m,
                        "health": m not in unhealthy,
                        "resources": {
                            "koordinator.sh/gpu-core": "100",
                            "koordinator.sh/gpu-memory": "16Gi",
                            "koordinator.sh/gpu-memory-ratio": "100",
                        },
                    }
                    for m in range(gpus)
                ]
                + [{"type": "rdma", "id": "0000:1f:00.0", "minor": 0, "health": True,
                    "resources": {"koordinator.sh/rdma": "100"}}]
            },
        }
    )  # fmt: skip


def bound(name: str, node: str, annotation: str) -> Pod:
    return decode_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                         "annotations": {ALLOCATED: annotation}},
            "spec": {"nodeName": node},
        }
    )  # fmt: skip


def test_device_metrics_per_card() -> None:
    m = SchedulerMetrics()
    view = View(
        {"n1": decode_node({"metadata": {"name": "n1"}})},
        [gpu_device("n1", 2, unhealthy=(1,))],
        [
            bound("a", "n1", '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"30",'
                  '"koordinator.sh/gpu-memory-ratio":"25"}}]}'),
            bound("b", "n1", '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"20",'
                  '"koordinator.sh/gpu-memory":"4Gi"}}],'
                  '"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"50"}}]}'),
        ],
    )  # fmt: skip
    m.watch_devices(lambda: view)
    fams = families(m)

    def value(metric: str, minor: str, resource: str | None = None, dtype: str = "gpu") -> float:
        for s in fams[metric].samples:
            if (
                s.labels["minor"] == minor
                and s.labels["device_type"] == dtype
                and (resource is None or s.labels["resource"] == resource)
            ):
                return float(s.value)
        raise KeyError((metric, minor, resource))

    gib = 1024**3
    assert value("koord_scheduler_device_capacity", "0", "koordinator.sh/gpu-memory") == 16 * gib
    assert value("koord_scheduler_device_allocated", "0", "koordinator.sh/gpu-core") == 50
    assert value("koord_scheduler_device_allocated", "0", "koordinator.sh/gpu-memory") == 8 * gib
    assert value("koord_scheduler_device_allocated", "0", "koordinator.sh/gpu-memory-ratio") == 50
    assert value("koord_scheduler_device_pods", "0") == 2
    assert value("koord_scheduler_device_pods", "1") == 0
    assert value("koord_scheduler_device_healthy", "1") == 0
    assert value("koord_scheduler_device_allocated", "0", "koordinator.sh/rdma", "rdma") == 50
    sample = fams["koord_scheduler_device_pods"].samples[0]
    assert set(sample.labels) == {"node", "device_type", "minor", "uuid"}
    assert fams["koord_scheduler_device_annotation_errors"].samples[0].value == 0


def test_device_metrics_count_kubelet_held_cards() -> None:
    checkpoints = encode_devices_checkpoints(
        [PodDeviceEntry("u-legacy", "cuda", "nvidia.com/gpu", ("GPU-1",))]
    )
    device = gpu_device("n1", 2, annotations={ANNOTATION_DEVICES_CHECKPOINTS: checkpoints})
    m = SchedulerMetrics()
    view = View({"n1": decode_node({"metadata": {"name": "n1"}})}, [device], [])
    m.watch_devices(lambda: view)
    fams = families(m)
    got = {
        (s.name, s.labels["minor"], s.labels.get("resource", "")): s.value
        for metric in ("koord_scheduler_device_allocated", "koord_scheduler_device_pods")
        for s in fams[metric].samples
        if s.labels["device_type"] == "gpu"
    }
    assert got[("koord_scheduler_device_allocated", "1", "koordinator.sh/gpu-core")] == 100
    memory = ("koord_scheduler_device_allocated", "1", "koordinator.sh/gpu-memory")
    assert got[memory] == 16 * 1024**3
    assert got[("koord_scheduler_device_pods", "1", "")] == 1
    assert got[("koord_scheduler_device_pods", "0", "")] == 0


def test_annotation_errors_count_once_per_pod_and_text() -> None:
    m = SchedulerMetrics()
    view = View(
        {"n1": decode_node({"metadata": {"name": "n1"}})},
        [gpu_device("n1", 1)],
        [bound("bad", "n1", "{nope")],
    )
    m.watch_devices(lambda: view)

    def errors() -> float:
        return float(families(m)["koord_scheduler_device_annotation_errors"].samples[0].value)

    assert errors() == 1
    assert errors() == 1  # the same pod and text again: not counted twice
    view.pods.append(bound("worse", "n1", "[]"))
    assert errors() == 2
    pods = families(m)["koord_scheduler_device_pods"].samples
    assert pods[0].value == 2  # an annotation that does not decode holds every card


NEGATIVE = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-100",'
    '"koordinator.sh/gpu-memory-ratio":"-100"}}]}'
)


def test_device_metrics_never_show_an_invalid_annotation_freeing_a_card() -> None:
    """Issue 23: the per-card metrics summed the -100 (card 0 at -100 % allocated); now it
    holds the card whole, as the scheduler's ledger counts it, and the node's gauge says so."""
    m = SchedulerMetrics()
    view = View(
        {"n1": decode_node({"metadata": {"name": "n1"}})},
        [gpu_device("n1", 2)],
        [
            bound("hostile", "n1", NEGATIVE),
            bound("ok", "n1", '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50"}}]}'),
        ],
    )
    m.watch_devices(lambda: view)
    fams = families(m)
    allocated = {
        (s.labels["minor"], s.labels["resource"]): s.value
        for s in fams["koord_scheduler_device_allocated"].samples
    }
    assert allocated[("0", "koordinator.sh/gpu-core")] == 150
    assert allocated[("0", "koordinator.sh/gpu-memory-ratio")] == 100 + 0
    assert ("1", "koordinator.sh/gpu-core") not in allocated
    pods = {
        s.labels["minor"]: s.value
        for s in fams["koord_scheduler_device_pods"].samples
        if s.labels["device_type"] == "gpu"
    }
    assert pods == {"0": 2, "1": 0}
    invalid = fams["koord_scheduler_device_invalid_allocation_pods"].samples
    assert [(s.labels, s.value) for s in invalid] == [({"node": "n1"}, 1)]
    view.pods.pop(0)  # the pod is gone: so is the gauge's sample
    assert not families(m)["koord_scheduler_device_invalid_allocation_pods"].samples


def test_api_requests_and_the_process_are_exposed_under_client_gos_names() -> None:
    """The kubernetes-mixin scheduler dashboard reads rest_client_* and process_*: the
    scheduler's own API requests (client-go's names, labels and buckets) and its memory."""
    metrics = SchedulerMetrics()
    metrics.watch_process()
    binding = "/api/v1/namespaces/{namespace}/pods/{name}/binding"
    metrics.rest_request("https://127.0.0.1:6443", "POST", binding, "201", 0.003)
    metrics.rest_request("https://127.0.0.1:6443", "POST", binding, "<error>", 10.0)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    requests = {
        (s.labels["code"], s.labels["method"], s.labels["host"]): s.value
        for s in families["rest_client_requests"].samples
        if s.name == "rest_client_requests_total"
    }
    assert requests == {
        ("201", "POST", "127.0.0.1:6443"): 1.0,
        ("<error>", "POST", "127.0.0.1:6443"): 1.0,
    }
    url = "https://127.0.0.1:6443/api/v1/namespaces/%7Bnamespace%7D/pods/%7Bname%7D/binding"
    buckets = {
        s.labels["le"]: s.value
        for s in families["rest_client_request_duration_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["url"] == url and s.labels["verb"] == "POST"
    }
    assert buckets["0.004"] == 1.0 and buckets["0.512"] == 1.0 and buckets["+Inf"] == 2.0
    assert len(buckets) == 11  # client-go: ExponentialBuckets(0.001, 2, 10) and +Inf
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert "process_cpu_seconds" in families
