"""/metrics scraped over HTTP from a running scheduler and parsed with prometheus_client's
parser: kube-scheduler's names, types, labels and buckets, and the per-card device metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    GIB,
    GPU_CORE,
    GPU_MEMORY,
    GPU_RATIO,
    Kube,
    SchedulerProcess,
    gpu_pod,
    scheduler_config,
    shared_gpu,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e


def _go_buckets(start: float, factor: float, count: int) -> list[float]:
    out, value = [], start
    for _ in range(count):
        out.append(value)
        value *= factor
    return [*out, float("inf")]


HISTOGRAMS = {
    "scheduler_scheduling_attempt_duration_seconds": ({"result", "profile"}, (0.001, 2, 15)),
    "scheduler_pod_scheduling_sli_duration_seconds": ({"attempts"}, (0.01, 2, 20)),
    "scheduler_pod_scheduling_attempts": (set(), (1, 2, 5)),
    "scheduler_framework_extension_point_duration_seconds": (
        {"extension_point", "status", "profile"},
        (0.0001, 2, 12),
    ),
    "scheduler_plugin_execution_duration_seconds": (
        {"plugin", "extension_point", "status"},
        (0.00001, 1.5, 20),
    ),
}
COUNTERS = {
    "scheduler_schedule_attempts": {"result", "profile"},
    "scheduler_queue_incoming_pods": {"queue", "event"},
    "koord_scheduler_device_annotation_errors": set(),
}
GAUGES = {
    "scheduler_pending_pods": {"queue"},
    "scheduler_unschedulable_pods": {"plugin", "profile"},
    "koord_scheduler_device_capacity": {"node", "device_type", "minor", "uuid", "resource"},
    "koord_scheduler_device_allocated": {"node", "device_type", "minor", "uuid", "resource"},
    "koord_scheduler_device_pods": {"node", "device_type", "minor", "uuid"},
    "koord_scheduler_device_healthy": {"node", "device_type", "minor", "uuid"},
}


def _labels(family: Any) -> set[str]:
    return {k for s in family.samples for k in s.labels if k != "le"}


def test_metrics_over_http(apiserver: ApiServer, tmp_path: Path) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace(uid("metrics"))
    node = uid("gpu")
    kube.add_gpu_node(node, gpus=2, memory="16Gi", labels={"e2e-group": scheduler}, unhealthy=[1])
    selector = {"e2e-group": scheduler}
    proc = SchedulerProcess(
        apiserver.kubeconfig_path(), scheduler_config(tmp_path / "c.yaml", scheduler), tmp_path
    ).start()
    try:
        proc.wait_ready()
        pods = [shared_gpu(f"p{i}", scheduler, 20, node_selector=selector) for i in range(4)]
        pods.append(gpu_pod("invalid", scheduler, {GPU_CORE: "20"}, selector))
        kube.create_pods(ns, pods)

        def scheduled() -> bool:
            attempts = proc.metrics()["scheduler_schedule_attempts"].samples
            return sum(s.value for s in attempts if s.labels.get("result") == "scheduled") >= 4

        wait_for("four pods scheduled", scheduled, timeout=30, interval=0.5)
        # Then a pod bound by someone else with an annotation that does not decode: it holds
        # every card of its node whole (an invalid annotation never makes a card look free).
        broken = shared_gpu("broken", "other-scheduler", 10)
        broken["metadata"]["annotations"] = {ALLOCATED: "{not json"}
        broken["spec"]["nodeName"] = node
        kube.post(f"/api/v1/namespaces/{ns}/pods", broken)

        def settled() -> dict[str, Any] | None:
            fams = proc.metrics()
            attempts = fams["scheduler_schedule_attempts"].samples
            done = sum(s.value for s in attempts if s.labels.get("result") == "scheduled")
            unsched = fams["scheduler_unschedulable_pods"].samples
            errors = fams["koord_scheduler_device_annotation_errors"].samples
            ok = done >= 4 and unsched and errors and errors[0].value >= 1
            return fams if ok else None

        fams = wait_for("metrics to settle", settled, timeout=30, interval=0.5)

        for name, labels in COUNTERS.items():
            assert fams[name].type == "counter", name
            assert {s.name for s in fams[name].samples} == {f"{name}_total"}, name
            assert _labels(fams[name]) == labels, name
        for name, labels in GAUGES.items():
            assert fams[name].type == "gauge", name
            assert _labels(fams[name]) == labels, name
        for name, (labels, (start, factor, count)) in HISTOGRAMS.items():
            family = fams[name]
            assert family.type == "histogram", name
            if not family.samples:  # plugin timings are sampled (10% of the cycles)
                assert name == "scheduler_plugin_execution_duration_seconds"
                continue
            assert _labels(family) == labels, name
            series: dict[tuple[Any, ...], list[float]] = {}
            for s in family.samples:
                if s.name == f"{name}_bucket":
                    key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    series.setdefault(key, []).append(float(s.labels["le"]))
            assert series, name
            for les in series.values():
                assert les == _go_buckets(start, factor, count), name
        assert not [f for f in fams if f.endswith("_created")]

        pending = {s.labels["queue"]: s.value for s in fams["scheduler_pending_pods"].samples}
        assert set(pending) == {"active", "backoff", "unschedulable", "gated"}
        assert pending["unschedulable"] >= 1
        unsched = {
            (s.labels["plugin"], s.labels["profile"]): s.value
            for s in fams["scheduler_unschedulable_pods"].samples
        }
        assert unsched.get(("DeviceShare", scheduler)) == 1
        results = {
            s.labels["result"]: s.value
            for s in fams["scheduler_schedule_attempts"].samples
            if s.labels["profile"] == scheduler
        }
        assert results["scheduled"] == 4 and results["unschedulable"] >= 1
        incoming = {
            (s.labels["queue"], s.labels["event"])
            for s in fams["scheduler_queue_incoming_pods"].samples
        }
        assert ("active", "PodAdd") in incoming

        def card(metric: str, minor: int, resource: str | None = None) -> float:
            for s in fams[metric].samples:
                lab = s.labels
                if (
                    lab["node"] == node
                    and lab["minor"] == str(minor)
                    and (resource is None or lab["resource"] == resource)
                ):
                    assert lab["device_type"] == "gpu" and lab["uuid"] == f"GPU-{node}-{minor}"
                    return float(s.value)
            raise AssertionError(f"no {metric} for minor {minor} {resource}")

        assert card("koord_scheduler_device_capacity", 0, GPU_CORE) == 100
        assert card("koord_scheduler_device_capacity", 0, GPU_MEMORY) == 16 * GIB
        assert card("koord_scheduler_device_capacity", 1, GPU_RATIO) == 100
        # Four pods of 20% fit only on the healthy card 0; the broken pod holds both cards whole.
        assert card("koord_scheduler_device_allocated", 0, GPU_CORE) == 80 + 100
        assert card("koord_scheduler_device_allocated", 0, GPU_RATIO) == 80 + 100
        assert card("koord_scheduler_device_allocated", 0, GPU_MEMORY) == (
            4 * (16 * GIB * 20 // 100) + 16 * GIB
        )
        assert card("koord_scheduler_device_allocated", 1, GPU_CORE) == 100
        assert card("koord_scheduler_device_pods", 0) == 4 + 1
        assert card("koord_scheduler_device_pods", 1) == 1
        assert card("koord_scheduler_device_healthy", 0) == 1
        assert card("koord_scheduler_device_healthy", 1) == 0
        assert fams["koord_scheduler_device_annotation_errors"].samples[0].value == 1
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        kube.remove_node(node)
