"""What the pod API gained since 1.20, honoured by ``koord-scheduler run`` on each control plane
of the matrix: scheduling gates, native sidecars' GPUs, pod-level resources and in-place
resize. On v1.37.2 the server keeps these fields and the scheduler counts them as kube-scheduler
v1.37 does; on v1.20.2 the server drops them (unknown fields) and the same binary schedules as
it always did there. Each test asserts the behaviour of the version it runs on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apiserver import V120
from test_scheduler_harness import (
    ALLOCATED,
    Kube,
    SchedulerProcess,
    condition,
    gpu_pod,
    scheduler_config,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

NODE_CPU = 64  # what add_gpu_node advertises


class Env:
    def __init__(self, kube: Kube, ns: str, scheduler: str, proc: SchedulerProcess) -> None:
        self.kube, self.ns, self.scheduler, self.proc = kube, ns, scheduler, proc
        self.nodes: list[str] = []

    def node(self) -> dict[str, str]:
        """A fresh GPU node (4 cards, 64 cpu) of its own; the node selector that picks it."""
        name = uid("gpu")
        self.kube.add_gpu_node(name, gpus=4, labels={"e2e-node": name})
        self.nodes.append(name)
        return {"e2e-node": name}

    def pod(self, name: str) -> dict[str, Any]:
        return self.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{name}")

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.kube.post(f"/api/v1/namespaces/{self.ns}/pods", body)

    def bound(self, name: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(  # type: ignore[no-any-return]
            f"{name} bound",
            lambda: (p := self.pod(name))["spec"].get("nodeName") and p,
            timeout=timeout,
        )

    def reported_unschedulable(self, name: str, timeout: float = 30) -> dict[str, Any]:
        def reported() -> dict[str, Any] | None:
            cond = condition(self.pod(name))
            return cond if cond and cond.get("reason") == "Unschedulable" else None

        return wait_for(f"{name} reported unschedulable", reported, timeout=timeout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace(uid("current"))
    work = tmp_path_factory.mktemp("sched")
    cfg = scheduler_config(work / "config.yaml", scheduler)
    proc = SchedulerProcess(apiserver.kubeconfig_path(), cfg, work).start()
    env = Env(kube, ns, scheduler, proc)
    try:
        proc.wait_ready()
        yield env
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for name in env.nodes:
            kube.remove_node(name)


def _cpu_pod(name: str, env: Env, selector: dict[str, str], cpu: str) -> dict[str, Any]:
    pod = gpu_pod(name, env.scheduler, {}, selector)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return pod


def test_a_gated_pod_waits_until_its_last_gate_is_removed(env: Env, kube_version: str) -> None:
    selector = env.node()
    gated = gpu_pod("gated", env.scheduler, {"nvidia.com/gpu": "1"}, selector)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}, {"name": "example.com/b"}]
    stored = env.create(gated)
    if kube_version == V120:
        # 1.20 has no such field: the server drops it and the pod is an ordinary one.
        assert "schedulingGates" not in stored["spec"]
        env.bound("gated")
        return
    env.create(gpu_pod("free", env.scheduler, {"nvidia.com/gpu": "1"}, selector))
    env.bound("free")  # the scheduler is working; the gated pod was created before it
    time.sleep(2)
    pod = env.pod("gated")
    assert not pod["spec"].get("nodeName")
    # The API server, not the scheduler, says why it waits (1.37: SchedulingGated).
    cond = condition(pod)
    assert cond is not None and cond.get("reason") == "SchedulingGated", cond
    events = [e for e in env.kube.events(env.ns) if e["involvedObject"]["name"] == "gated"]
    assert not [e for e in events if e["reason"] == "FailedScheduling"], events
    path = f"/api/v1/namespaces/{env.ns}/pods/gated"
    env.kube.patch(path, {"spec": {"schedulingGates": [{"name": "example.com/b"}]}})
    time.sleep(1)
    assert not env.pod("gated")["spec"].get("nodeName")
    env.kube.patch(path, {"spec": {"schedulingGates": None}})
    pod = env.bound("gated")
    assert json.loads(pod["metadata"]["annotations"][ALLOCATED])["gpu"]


def test_a_native_sidecars_gpu_is_held_beside_the_apps(env: Env, kube_version: str) -> None:
    """An init container with ``restartPolicy: Always`` runs for the pod's life: its GPU adds
    to the app's (kube-scheduler's and the kubelet's arithmetic). On 1.20 the field is dropped:
    an init container's GPU is then the max of init and app, not the sum."""
    selector = env.node()
    pod = gpu_pod("sidecar", env.scheduler, {"nvidia.com/gpu": "1"}, selector)
    pod["spec"]["initContainers"] = [
        {
            "name": "agent",
            "image": "busybox",
            "restartPolicy": "Always",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    ]
    env.create(pod)
    bound = env.bound("sidecar")
    cards = json.loads(bound["metadata"]["annotations"][ALLOCATED])["gpu"]
    assert len(cards) == (1 if kube_version == V120 else 2), cards


def test_pod_level_requests_count_as_the_pods_cpu(env: Env, kube_version: str) -> None:
    """``spec.resources.requests.cpu`` replaces the containers' sum: a pod of one 500m
    container asking 60 cpu at pod level leaves 4 of the node's 64, so an 8-cpu pod does not
    fit. On 1.20 the field is dropped and the 8-cpu pod fits."""
    selector = env.node()
    big = _cpu_pod("pod-level", env, selector, "500m")
    big["spec"]["resources"] = {"requests": {"cpu": "60"}}
    stored = env.create(big)
    env.bound("pod-level")
    env.create(_cpu_pod("eight", env, selector, "8"))
    if kube_version == V120:
        assert "resources" not in stored["spec"]
        env.bound("eight")
        return
    cond = env.reported_unschedulable("eight")
    assert "Insufficient cpu" in cond.get("message", ""), cond


def test_a_resized_pod_holds_what_the_kubelet_allocated(env: Env, kube_version: str) -> None:
    """In-place resize: the kubelet reports a bound pod's new size in
    ``status.containerStatuses[].allocatedResources`` (written here as the kubelet would);
    the scheduler counts the larger of spec and status, so an 8-cpu pod no longer fits beside
    a 1-cpu pod resized to 60. On 1.20 the status field is dropped."""
    selector = env.node()
    env.create(_cpu_pod("resized", env, selector, "1"))
    bound = env.bound("resized")
    status = {
        "containerStatuses": [
            {
                "name": "main",
                "image": "busybox",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "allocatedResources": {"cpu": "60"},
                "resources": {"requests": {"cpu": "60"}},
            }
        ]
    }
    path = f"/api/v1/namespaces/{env.ns}/pods/resized/status"
    stored = env.kube.patch(path, {"status": status})
    assert bound["spec"]["nodeName"]
    env.create(_cpu_pod("after-resize", env, selector, "8"))
    if kube_version == V120:
        assert "allocatedResources" not in stored["status"]["containerStatuses"][0]
        env.bound("after-resize")
        return
    assert stored["status"]["containerStatuses"][0]["allocatedResources"] == {"cpu": "60"}
    cond = env.reported_unschedulable("after-resize")
    assert "Insufficient cpu" in cond.get("message", ""), cond
    assert NODE_CPU - 60 < 8
