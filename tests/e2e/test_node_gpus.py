"""The node side on a real API server: each container sees exactly its GPUs, a broken
allocation never exposes them, and kubelet-allocated cards are never offered to fractional pods.

``koordlet run --fake-gpus`` runs as a subprocess with a one-hour sync interval, so what
happens here happens through the paths under test (a pod fetched on a cache miss, the inotify
watch of the kubelet checkpoint, the hook's record of device-plugin ids), never through the
periodic poll.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from apis.checkpoint import kubelet_checkpoint_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_node_to_container import FAKE_GPUS, Agent
from test_scheduler_harness import (
    ALLOCATED,
    DEVICES,
    GPU_CORE,
    GPU_RATIO,
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

CHECKPOINTS = "node.koordinator.sh/devices-checkpoints"
CARDS = [  # config/examples/fake-gpus.yaml, minors 0..3 (NVML index = list position)
    "GPU-7c4f2a35-1b2e-4f59-9e0c-5b7a3c1d0e01",
    "GPU-1d9e6b42-8a3f-4c71-b2d5-6e8f0a1c2b02",
    "GPU-a3b5c7d9-2e4f-4a6b-8c0d-1f3e5a7b9c03",
    "GPU-e2f4a6b8-3c5d-4e7f-9a1b-2c4d6e8f0a04",
]


@pytest.fixture
def node_side(apiserver: ApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
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
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": None}})
    kubelet = tmp_path / "kubelet"  # no device-plugins/ yet: no watch, nothing wakes the sync
    kubelet.mkdir()
    sock = Path(f"/tmp/kn-{node}.sock")  # unix socket paths must be short
    agent = Agent(
        [
            "--node-name", node,
            "--kubeconfig", apiserver.kubeconfig_path(),
            "--fake-gpus", str(FAKE_GPUS),
            "--kubelet-root", str(kubelet),
            "--sync-interval", "1h",
            "--socket", str(sock),
            "--hook-dir", "",
            "--metrics-bind-address", "127.0.0.1:0",
        ],
        tmp_path / "koordlet.log",
    )  # fmt: skip
    ns = kube.ensure_namespace(uid("node"))
    try:
        wait_for("the Device CR", lambda: _get(kube, f"{DEVICES}/{node}"), timeout=60)
        wait_for("the hook socket", sock.exists, timeout=60)
        yield {"kube": kube, "node": node, "ns": ns, "sock": sock, "kubelet": kubelet,
               "agent": agent, "log": tmp_path / "koordlet.log", "tmp": tmp_path}  # fmt: skip
    finally:
        assert agent.stop() == 0, (tmp_path / "koordlet.log").read_text()[-3000:]
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        kube.delete(f"/api/v1/nodes/{node}")
        kube.delete(f"{DEVICES}/{node}")


def _get(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        return kube.get(path)
    except Exception:
        return None


def _hook(
    sock: Path, pod: dict[str, Any], container: str, envs: dict[str, str], uid_: str = ""
) -> dict[str, str]:
    meta = pod["metadata"]
    request = api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(
            name=meta["name"], namespace=meta["namespace"], uid=uid_ or meta["uid"]
        ),
        container_meta=api_pb2.ContainerMetadata(name=container, id=f"c-{container}"),
        pod_annotations=meta.get("annotations") or {},
        pod_labels=meta.get("labels") or {},
        container_envs=envs,
    )
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
        response = stub.PreCreateContainerHook(request, timeout=30)
    return dict(response.container_envs)


def _log_events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _metrics(log: Path) -> str:
    ports = [e["port"] for e in _log_events(log) if e["event"] == "metrics server listening"]
    assert ports, "koordlet did not log its metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _allocated_pod(name: str, node: str) -> dict[str, Any]:
    """A pod as koord-scheduler leaves it: bound, with a shared allocation on card 1, and an
    init container, two GPU containers and a sidecar without GPU requests."""
    allocation = {"gpu": [{"minor": 1, "resources": {
        GPU_CORE: "60", "koordinator.sh/gpu-memory": "48Gi", GPU_RATIO: "60"}, "id": CARDS[1]}]}
    gpu = {"limits": {GPU_CORE: "40", GPU_RATIO: "40"}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {ALLOCATED: json.dumps(allocation)},
                     "labels": {"koordinator.sh/gpu-isolation-provider": "HAMi-core"}},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0,
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [
                {"name": "train", "image": "cuda", "resources": gpu},
                {"name": "eval", "image": "cuda",
                 "resources": {"limits": {GPU_CORE: "20", GPU_RATIO: "20"}}},
                {"name": "logs", "image": "busybox"},
            ],
        },
    }  # fmt: skip


def test_containers_of_a_pod_not_yet_cached_get_exactly_their_share(
    node_side: dict[str, Any],
) -> None:
    kube, ns, node, sock = node_side["kube"], node_side["ns"], node_side["node"], node_side["sock"]
    # Created after koordlet's only pod list (sync interval 1 h): a cache miss for the hook.
    pod = kube.post(f"/api/v1/namespaces/{ns}/pods", _allocated_pod("split", node))
    image_env = {"NVIDIA_VISIBLE_DEVICES": "all", "PATH": "/bin"}
    train = _hook(sock, pod, "train", image_env)
    evaluate = _hook(sock, pod, "eval", image_env)
    assert (train["NVIDIA_VISIBLE_DEVICES"], evaluate["NVIDIA_VISIBLE_DEVICES"]) == ("1", "1")
    assert int(train["CUDA_DEVICE_MEMORY_LIMIT"]) == 32 * 1024**3  # 48Gi x 40/60
    assert int(evaluate["CUDA_DEVICE_MEMORY_LIMIT"]) == 16 * 1024**3  # 48Gi x 20/60
    assert (train["CUDA_DEVICE_SM_LIMIT"], evaluate["CUDA_DEVICE_SM_LIMIT"]) == ("40", "20")
    for container in ("setup", "logs"):
        envs = _hook(sock, pod, container, image_env)
        assert envs == {"NVIDIA_VISIBLE_DEVICES": "void", "PATH": "/bin"}


def test_a_pod_that_cannot_be_found_starts_without_gpus_and_is_told_so(
    node_side: dict[str, Any],
) -> None:
    kube, ns, node, sock = node_side["kube"], node_side["ns"], node_side["node"], node_side["sock"]
    pod = kube.post(f"/api/v1/namespaces/{ns}/pods", _allocated_pod("again", node))
    # The request is for an older pod of the same name (deleted and re-created since).
    envs = _hook(sock, pod, "train", {"NVIDIA_VISIBLE_DEVICES": "all"}, uid_="uid-of-the-old-pod")
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    broken = json.loads(json.dumps(pod))
    broken["metadata"]["annotations"][ALLOCATED] = "{not json"
    assert _hook(sock, broken, "train", {"NVIDIA_VISIBLE_DEVICES": "all"}) == {
        "NVIDIA_VISIBLE_DEVICES": "void"
    }
    metrics = _metrics(node_side["log"])
    assert 'koordlet_runtime_hook_denied_total{reason="pod-not-found"} 1.0' in metrics
    assert 'koordlet_runtime_hook_denied_total{reason="invalid-allocation"} 1.0' in metrics

    def warnings() -> list[dict[str, Any]]:
        return [e for e in kube.events(ns) if e["involvedObject"].get("name") == "again"
                and e["type"] == "Warning"]  # fmt: skip

    events = wait_for("two Warning events on the pod", lambda: len(warnings()) == 2 and warnings(),
                      timeout=30)  # fmt: skip
    assert {e["reason"] for e in events} == {"GPUAllocationNotServed"}
    assert any("pod-not-found" in e["message"] for e in events)
    lines = [e for e in _log_events(node_side["log"])
             if e["event"] == "gpu allocation not served: container gets no GPU"]  # fmt: skip
    assert [(e["pod"], e["reason"]) for e in lines] == [
        (f"{ns}/again", "pod-not-found"), (f"{ns}/again", "invalid-allocation")]


def _checkpoint(entries: list[dict[str, Any]]) -> str:
    return kubelet_checkpoint_json({"PodDeviceEntries": entries, "RegisteredDevices": {}})


def test_kubelet_allocated_cards_are_never_offered_to_fractional_pods(
    node_side: dict[str, Any], apiserver: ApiServer, tmp_path: Path
) -> None:
    kube, ns, node = node_side["kube"], node_side["ns"], node_side["node"]
    selector = {"kubernetes.io/hostname": node}
    # A default-scheduler pod the kubelet gave cards 0 and 1 (time-slicing replica and NVML
    # index ids), and one it gave card 2, whose container the hook then sees with card 2 (the
    # kubelet writes its checkpoint at admission, before it asks the runtime for containers).
    held = []
    for name in ("held", "hot"):
        body = gpu_pod(name, "default-scheduler", {"nvidia.com/gpu": "1"}, selector)
        body["spec"]["nodeName"] = node
        held.append(kube.post(f"/api/v1/namespaces/{ns}/pods", body))
    (node_side["kubelet"] / "device-plugins").mkdir()  # the first device plugin registers
    wait_for(
        "koordlet to watch the checkpoint",
        lambda: "watching the kubelet device checkpoint" in node_side["log"].read_text(),
        timeout=60,
    )
    start = time.monotonic()
    entries = [{"PodUID": held[0]["metadata"]["uid"], "ContainerName": "main",
                "ResourceName": "nvidia.com/gpu", "AllocResp": "",
                "DeviceIDs": {"-1": [f"{CARDS[0]}::3", "1"]}},
               {"PodUID": held[1]["metadata"]["uid"], "ContainerName": "main",
                "ResourceName": "nvidia.com/gpu", "AllocResp": "",
                "DeviceIDs": {"-1": [CARDS[2]]}}]  # fmt: skip
    path = node_side["kubelet"] / "device-plugins" / "kubelet_internal_checkpoint"
    tmp = path.with_name(".ckpt.tmp")
    tmp.write_text(_checkpoint(entries))
    tmp.rename(path)  # as the kubelet replaces it
    envs = _hook(node_side["sock"], held[1], "main", {"NVIDIA_VISIBLE_DEVICES": CARDS[2]})
    assert envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[2]  # what the kubelet gave it: unchanged
    envs = _hook(node_side["sock"], held[1], "main", {"NVIDIA_VISIBLE_DEVICES": CARDS[3]})
    assert envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[2]  # a card it was not given: not seen
    envs = _hook(node_side["sock"], held[1], "sidecar", {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "void"  # the kubelet gave this container nothing

    def published() -> set[str]:
        raw = (kube.get(f"{DEVICES}/{node}")["metadata"].get("annotations") or {}).get(CHECKPOINTS)
        return {i for e in json.loads(raw or "[]") for i in e["deviceIDs"]}

    wait_for("cards 0, 1, 2 on the Device CR", lambda: published() == set(CARDS[:3]), timeout=30,
             interval=0.02)  # fmt: skip
    seconds = time.monotonic() - start  # the sync interval is 1 h: only the watch and the hook
    print(f"kubelet allocation on the Device CR after {seconds:.3f}s")

    scheduler = uid("koord-e2e")
    proc = SchedulerProcess(
        apiserver.kubeconfig_path(), scheduler_config(tmp_path / "sched.yaml", scheduler), tmp_path
    ).start()
    try:
        proc.wait_ready()
        body = gpu_pod("frac", scheduler, {GPU_CORE: "50", GPU_RATIO: "50"}, selector)
        kube.post(f"/api/v1/namespaces/{ns}/pods", body)

        def bound() -> dict[str, Any] | None:
            pod = kube.get(f"/api/v1/namespaces/{ns}/pods/frac")
            return pod if (pod["metadata"].get("annotations") or {}).get(ALLOCATED) else None

        pod = wait_for("the fractional pod to be bound", bound, timeout=60)
    finally:
        proc.stop()
    minors = [a["minor"] for a in json.loads(pod["metadata"]["annotations"][ALLOCATED])["gpu"]]
    assert minors == [3]  # every other card is held by the kubelet's pods


def test_rbac_manifest_lets_the_hook_read_pods_and_post_events(
    make_apiserver: Any, tmp_path: Path
) -> None:
    """With only config/koordlet/rbac.yaml's rights: the cache-miss GET and the event POST."""
    import yaml
    from kubernetes import client
    from test_koordlet_sync import SA_USER, _apply

    srv = make_apiserver(authorization_mode="RBAC", extra_users={SA_USER: []})
    admin = client.ApiClient(srv.client_configuration())
    kube = Kube(srv.url, srv.admin_token)
    try:
        kube.ensure_device_crd()
        # The Namespace is declared once, by config/scheduler or config/overlays/agent.
        namespace = FAKE_GPUS.parents[1] / "overlays" / "agent" / "namespace.yaml"
        _apply(admin, yaml.safe_load(namespace.read_text()))
        rbac = FAKE_GPUS.parents[1] / "koordlet" / "rbac.yaml"
        for doc in yaml.safe_load_all(rbac.read_text()):
            _apply(admin, doc)
        node = uid("gpu-node")
        base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        kube.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                                    "status": {"capacity": base, "allocatable": base}})  # fmt: skip
        ns = kube.ensure_namespace(uid("rbac"))
        sock = Path(f"/tmp/kr-{node}.sock")
        agent = Agent(
            ["--node-name", node, "--kubeconfig", srv.kubeconfig_path(srv.token_for(SA_USER)),
             "--fake-gpus", str(FAKE_GPUS), "--kubelet-root", str(tmp_path), "--sync-interval",
             "1h", "--socket", str(sock), "--hook-dir", "", "--metrics-bind-address",
             "127.0.0.1:0"],
            tmp_path / "koordlet.log",
        )  # fmt: skip
        try:
            wait_for("the hook socket", sock.exists, timeout=60)
            wait_for("the Device CR", lambda: _get(kube, f"{DEVICES}/{node}"), timeout=60)
            pod = kube.post(f"/api/v1/namespaces/{ns}/pods", _allocated_pod("p", node))
            envs = _hook(sock, pod, "train", {"NVIDIA_VISIBLE_DEVICES": "all"})
            assert envs["NVIDIA_VISIBLE_DEVICES"] == "1"  # fetched with `get pods`
            _hook(sock, pod, "train", {}, uid_="an-older-pod")  # denied: an event
            wait_for(
                "the Warning event posted with the agent's rights",
                lambda: [e for e in kube.events(ns) if e["reason"] == "GPUAllocationNotServed"],
                timeout=30,
            )
        finally:
            assert agent.stop() == 0
        assert "posting a pod event failed" not in (tmp_path / "koordlet.log").read_text()
    finally:
        admin.close()
