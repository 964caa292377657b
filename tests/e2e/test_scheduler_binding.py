"""``koord-scheduler run`` on a real API server: bindings with device annotations, events,
PodScheduled conditions; invalid device requests fail with the reason and bind nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    GPU_CORE,
    GPU_MEMORY,
    GPU_RATIO,
    Kube,
    SchedulerProcess,
    condition,
    gpu_pod,
    scheduler_config,
    shared_gpu,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e


class Env:
    def __init__(
        self, kube: Kube, ns: str, scheduler: str, nodes: list[str], proc: SchedulerProcess
    ):
        self.kube, self.ns, self.scheduler, self.nodes, self.proc = kube, ns, scheduler, nodes, proc
        self.selector = {"e2e-group": scheduler}

    def pod(self, name: str) -> dict[str, Any]:
        return self.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{name}")

    def create(self, body: dict[str, Any]) -> None:
        self.kube.post(f"/api/v1/namespaces/{self.ns}/pods", body)


@pytest.fixture(scope="module", params=["urllib3", "http11"])
def env(
    apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Env]:
    """The scheduler with each request transport (``--kube-transport``), over TLS."""
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace(uid("bind"))
    nodes = [uid("gpu"), uid("gpu")]
    for name in nodes:
        kube.add_gpu_node(name, gpus=4, memory="80Gi", labels={"e2e-group": scheduler})
    work = tmp_path_factory.mktemp("sched")
    cfg = scheduler_config(work / "config.yaml", scheduler)
    transport = [f"--kube-transport={request.param}"]
    proc = SchedulerProcess(apiserver.kubeconfig_path(), cfg, work, extra_args=transport).start()
    try:
        proc.wait_ready()
        yield Env(kube, ns, scheduler, nodes, proc)
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for name in nodes:
            kube.remove_node(name)


def _bound(env: Env, name: str) -> dict[str, Any] | None:
    pod = env.pod(name)
    return pod if pod["spec"].get("nodeName") else None


def test_binds_with_device_annotation_event_and_condition(env: Env) -> None:
    env.create(shared_gpu("half", env.scheduler, 50, node_selector=env.selector))
    env.create(gpu_pod("mem", env.scheduler, {GPU_CORE: "25", GPU_MEMORY: "8Gi"}, env.selector))
    env.create(gpu_pod("two", env.scheduler, {"nvidia.com/gpu": "2"}, env.selector))

    for name in ("half", "mem", "two"):
        pod = wait_for(f"{name} bound", lambda n=name: _bound(env, n), timeout=20)  # type: ignore[misc]
        assert pod["spec"]["nodeName"] in env.nodes
        allocation = json.loads(pod["metadata"]["annotations"][ALLOCATED])
        gpus = allocation["gpu"]
        node = pod["spec"]["nodeName"]
        for card in gpus:
            assert card["id"] == f"GPU-{node}-{card['minor']}"
        if name == "half":
            assert [c["resources"] for c in gpus] == [
                {GPU_CORE: "50", GPU_MEMORY: "40Gi", GPU_RATIO: "50"}
            ]
        elif name == "mem":
            assert [c["resources"] for c in gpus] == [
                {GPU_CORE: "25", GPU_MEMORY: "8Gi", GPU_RATIO: "10"}
            ]
        else:
            assert len(gpus) == 2 and len({c["minor"] for c in gpus}) == 2
            assert all(c["resources"][GPU_CORE] == "100" for c in gpus)
        cond = condition(pod)
        assert cond is not None and cond["status"] == "True"

    def scheduled_events() -> dict[str, dict[str, Any]]:
        got = {
            e["involvedObject"]["name"]: e
            for e in env.kube.events(env.ns)
            if e["reason"] == "Scheduled"
        }
        return got if len(got) >= 3 else {}

    events = wait_for("Scheduled events", scheduled_events, timeout=20)
    for name in ("half", "mem", "two"):
        node = env.pod(name)["spec"]["nodeName"]
        event = events[name]
        assert event["type"] == "Normal"
        assert event["message"] == f"Successfully assigned {env.ns}/{name} to {node}"
        # Written as events.k8s.io/v1 (as kube-scheduler does); the core view names the
        # reporting controller reportingComponent.
        assert event["reportingComponent"] == env.scheduler
        assert event["action"] == "Binding"
        assert event["involvedObject"]["uid"] == env.pod(name)["metadata"]["uid"]

    bound = [line for line in env.proc.events_named("bound") if line["pod"].startswith(env.ns)]
    assert sorted(line["pod"].split("/")[1] for line in bound) == ["half", "mem", "two"]
    assert all("node" in line for line in bound)
    assert all("cycle" in line for line in env.proc.events_named("scheduled"))


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({GPU_CORE: "50"}, "invalid resource device requests: [koordinator.sh/gpu-core]"),
        ({GPU_CORE: "150", GPU_RATIO: "150"}, "invalid resource device requests"),
        ({"nvidia.com/gpu": "8"}, "Insufficient nvidia.com/gpu"),
    ],
    ids=["core-alone", "core-not-multiple", "too-many-gpus"],
)
def test_unschedulable_pod_gets_event_and_condition(
    env: Env, limits: dict[str, str], reason: str
) -> None:
    name = uid("bad")
    env.create(gpu_pod(name, env.scheduler, limits, env.selector))

    def failed() -> dict[str, Any] | None:
        pod = env.pod(name)
        cond = condition(pod)
        return pod if cond is not None and cond["status"] == "False" else None

    pod = wait_for(f"{name} PodScheduled=False", failed, timeout=20)
    cond = condition(pod)
    assert cond is not None
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("0/")
    assert reason in cond["message"]

    def event() -> dict[str, Any] | None:
        for e in env.kube.events(env.ns):
            if e["involvedObject"]["name"] == name and e["reason"] == "FailedScheduling":
                return e
        return None

    ev = wait_for("FailedScheduling event", event, timeout=20)
    assert ev["type"] == "Warning"
    assert ev["message"] == cond["message"]
    assert not env.pod(name)["spec"].get("nodeName")


def test_inspect_reads_the_live_cluster(
    env: Env, apiserver: ApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler.cli import main

    name = uid("seen")
    env.create(shared_gpu(name, env.scheduler, 30, node_selector=env.selector))
    node = wait_for(f"{name} bound", lambda: _bound(env, name), timeout=20)["spec"]["nodeName"]
    assert main(["inspect", node, "--kubeconfig", apiserver.kubeconfig_path()]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "GPU CARDS (allocated/total)"
    assert f"{env.ns}/{name}" in out
    assert all(other not in out for other in env.nodes if other != node)
    assert "4 GPUs" in out
