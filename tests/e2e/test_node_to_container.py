"""The whole path, every component a real process: koordlet advertises (fake) GPUs in the
Device CR, koord-scheduler places a pod on them, and the runtime hook hands the container
exactly the allocated cards.

koordlet run --fake-gpus -> Device CR + node resources -> koord-scheduler run -> Binding with
device-allocated -> PreCreateContainerHook over the unix socket -> NVIDIA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    DEVICES,
    GPU_CORE,
    GPU_RATIO,
    REPO_ROOT,
    Kube,
    SchedulerProcess,
    gpu_pod,
    scheduler_config,
    uid,
    wait_for,
)

from runtimehooks.api import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

FAKE_GPUS = REPO_ROOT / "config" / "examples" / "fake-gpus.yaml"


class Agent:
    """``koordlet run`` as a subprocess, stopped with SIGTERM (a clean shutdown)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        out = open(log, "wb")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "koordlet.cli", "run", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            out.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


@pytest.fixture
def cluster(apiserver: ApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    node = uid("gpu-node")
    base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    kube.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            "status": {"capacity": base, "allocatable": base},
        },
    )
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": None}})  # no kubelet to clear it
    sock, hooks = tmp_path / "koordlet.sock", tmp_path / "hooks"
    agent = Agent(
        [
            "--node-name",
            node,
            "--kubeconfig",
            apiserver.kubeconfig_path(),
            "--fake-gpus",
            str(FAKE_GPUS),
            "--kubelet-root",
            str(tmp_path / "kubelet"),
            "--sync-interval",
            "1s",
            "--socket",
            str(sock),
            "--hook-dir",
            str(hooks),
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--fairshare-address",
            "127.0.0.1",
            "--fairshare-state",
            str(tmp_path / "fairshare.json"),
        ],
        tmp_path / "koordlet.log",
    )
    scheduler = uid("koord-e2e")
    proc = SchedulerProcess(
        apiserver.kubeconfig_path(),
        scheduler_config(tmp_path / "sched.yaml", scheduler),
        tmp_path,
    ).start()
    ns = kube.ensure_namespace(uid("path"))
    try:
        yield {
            "kube": kube,
            "node": node,
            "sock": sock,
            "hooks": hooks,
            "ns": ns,
            "scheduler": scheduler,
            "proc": proc,
            "agent": agent,
        }
    finally:
        proc.stop()
        assert agent.stop() == 0, (tmp_path / "koordlet.log").read_text()[-3000:]
        # The Fail registration outlives the agent: while it is down the runtime proxy
        # refuses containers instead of starting them unchanged (docs/node.md).
        registration = json.loads((hooks / "koordlet.json").read_text())
        assert registration["failure-policy"] == "Fail"
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        kube.delete(f"/api/v1/nodes/{node}")
        kube.delete(f"{DEVICES}/{node}")


def _hook(sock: Path, pod: dict[str, Any]) -> api_pb2.ContainerResourceHookResponse:
    meta = pod["metadata"]
    request = api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(
            name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]
        ),
        container_meta=api_pb2.ContainerMetadata(name="main", id="c-1"),
        pod_annotations=meta.get("annotations") or {},
        pod_labels=meta.get("labels") or {},
        container_envs={"PATH": "/usr/bin:/bin"},
    )
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
        response: api_pb2.ContainerResourceHookResponse = stub.PreCreateContainerHook(
            request, timeout=10
        )
        return response


def test_a_scheduled_pod_sees_exactly_its_cards(cluster: dict[str, Any]) -> None:
    kube, node, ns = cluster["kube"], cluster["node"], cluster["ns"]
    # koordlet wrote the Device CR and advertised the totals on the node.
    device = wait_for("the Device CR", lambda: _get(kube, f"{DEVICES}/{node}"), timeout=60)
    assert [d["minor"] for d in device["spec"]["devices"]] == [0, 1, 2, 3]
    wait_for(
        "the node's GPU totals",
        lambda: kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"].get(GPU_CORE) == "400",
        timeout=60,
    )
    registration = json.loads((cluster["hooks"] / "koordlet.json").read_text())
    assert registration["remote-endpoint"] == str(cluster["sock"])

    cluster["proc"].wait_ready()
    selector = {"kubernetes.io/hostname": node}
    for name, percent in (("half", 50), ("pair", 200)):
        body = gpu_pod(
            name, cluster["scheduler"], {GPU_CORE: str(percent), GPU_RATIO: str(percent)}, selector
        )
        kube.post(f"/api/v1/namespaces/{ns}/pods", body)

    def bound(name: str) -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return pod if (pod["metadata"].get("annotations") or {}).get(ALLOCATED) else None

    for name, count in (("half", 1), ("pair", 2)):
        pod = wait_for(f"pod {name} to be bound", lambda n=name: bound(n), timeout=60)
        assert pod["spec"]["nodeName"] == node
        minors = [a["minor"] for a in json.loads(pod["metadata"]["annotations"][ALLOCATED])["gpu"]]
        assert len(minors) == count
        response = _hook(cluster["sock"], pod)
        envs = dict(response.container_envs)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(str(m) for m in minors)
        assert envs["PATH"] == "/usr/bin:/bin"  # the request's envs are echoed


def _get(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        return kube.get(path)
    except Exception:
        return None


def test_a_gemini_pod_gets_its_share_of_the_card_served_by_the_agent(
    cluster: dict[str, Any],
) -> None:
    """Scheduled by koord-scheduler, its container's hook env points at a relay that answers
    Gemini's protocol with the pod's allocation; deleting the pod closes the relay."""
    from koordlet.fairshare.client import GeminiClient

    kube, node, ns = cluster["kube"], cluster["node"], cluster["ns"]
    wait_for(
        "the node's GPU totals",
        lambda: kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"].get(GPU_CORE) == "400",
        timeout=60,
    )
    cluster["proc"].wait_ready()
    body = gpu_pod(
        "gemini",
        cluster["scheduler"],
        {GPU_CORE: "30", GPU_RATIO: "25"},
        {"kubernetes.io/hostname": node},
    )
    body["metadata"]["labels"] = {"koordinator.sh/gpu-isolation-provider": "Gemini"}
    body["metadata"]["annotations"] = {"koordinator.sh/gpu-core-limit": "50"}
    kube.post(f"/api/v1/namespaces/{ns}/pods", body)

    def bound() -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/gemini")
        return pod if (pod["metadata"].get("annotations") or {}).get(ALLOCATED) else None

    pod = wait_for("the Gemini pod to be bound", bound, timeout=60)
    (alloc,) = json.loads(pod["metadata"]["annotations"][ALLOCATED])["gpu"]
    envs = dict(_hook(cluster["sock"], pod).container_envs)
    assert envs["POD_NAME"] == pod["metadata"]["uid"]
    assert envs["LD_PRELOAD"].endswith("libgemhook.so.1")
    memory = int(alloc["resources"]["koordinator.sh/gpu-memory"].removesuffix("Gi")) * 2**30
    with GeminiClient(envs["POD_MANAGER_IP"], int(envs["POD_MANAGER_PORT"]), "x") as client:
        assert client.mem_limit() == (0, memory)
        assert client.quota() == 250.0
    log = cluster["agent"].log
    wait_for(  # from now on the pod list, not the hook's announcement, decides
        "the agent's pod list to show the pod",
        lambda: "fair-share pod confirmed by the pod list" in log.read_text(),
        timeout=60,
    )
    kube.delete(f"/api/v1/namespaces/{ns}/pods/gemini")

    def relay_closed() -> bool:
        try:
            GeminiClient(envs["POD_MANAGER_IP"], int(envs["POD_MANAGER_PORT"]), "x", 5).close()
        except OSError:
            return True
        return False

    try:
        wait_for("the relay to close after the pod is gone", relay_closed, timeout=60)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{log.read_text()[-4000:]}") from None
