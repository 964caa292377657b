"""Node-side device admission on the real API server: two pods bound to the same card share by a
foreign binder (``spec.nodeName`` and hand-written ``device-allocated`` annotations, no
scheduler), koordlet running against the API server with fake GPUs. Exactly one pod is
admitted with the card; the other's container gets ``void`` and the pod ends ``Failed``
with reason ``DeviceOvercommit`` and a Warning event, as kubelet admission fails a pod.
Likewise two pods given the same RDMA VF (koordlet on a fake sysfs tree with an SR-IOV NIC):
only the first gets it through CDI (issue 45, DUPLICATE-VF).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_node_to_container import FAKE_GPUS, Agent, _hook
from test_scheduler_harness import ALLOCATED, DEVICES, GPU_CORE, GPU_RATIO, Kube, uid, wait_for

from tests.fake_sysfs import FakeSysfs

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

GPU_MEMORY = "koordinator.sh/gpu-memory"
NIC, VF = "0000:18:00.0", "0000:18:00.3"
CDI_KEY = "cdi.k8s.io/koordinator.sh_rdma"


@pytest.fixture
def node_agent(apiserver: ApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    node = uid("admit-node")
    base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    labels = {"kubernetes.io/hostname": node}
    kube.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                "metadata": {"name": node, "labels": labels},
                                "status": {"capacity": base, "allocatable": base}})  # fmt: skip
    sock, hooks = tmp_path / "koordlet.sock", tmp_path / "hooks"
    FakeSysfs(tmp_path / "sys").nic(NIC, 0, vfs=2)
    agent = Agent(
        ["--node-name", node, "--kubeconfig", apiserver.kubeconfig_path(),
         "--fake-gpus", str(FAKE_GPUS), "--kubelet-root", str(tmp_path / "kubelet"),
         "--sync-interval", "1s", "--socket", str(sock), "--hook-dir", str(hooks),
         "--metrics-bind-address", "127.0.0.1:0", "--fairshare=off",
         "--sysfs-root", str(tmp_path / "sys"), "--cdi-dir", str(tmp_path / "cdi")],
        tmp_path / "koordlet.log",
    )  # fmt: skip
    ns = kube.ensure_namespace(uid("admit"))
    try:
        yield {"kube": kube, "node": node, "sock": sock, "ns": ns, "log": tmp_path / "koordlet.log"}
    finally:
        assert agent.stop() == 0, (tmp_path / "koordlet.log").read_text()[-3000:]
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        kube.delete(f"/api/v1/nodes/{node}")
        kube.delete(f"{DEVICES}/{node}")


def _bound_pod(name: str, node: str, percent: int) -> dict[str, Any]:
    """A pod a foreign binder placed: nodeName set, its share of card 0 written by hand."""
    allocation = {"gpu": [{"minor": 0, "resources": {
        GPU_CORE: str(percent), GPU_RATIO: str(percent), GPU_MEMORY: f"{80 * percent // 100}Gi"}}]}
    limits = {GPU_CORE: str(percent), GPU_RATIO: str(percent)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ALLOCATED: json.dumps(allocation)}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }  # fmt: skip


def test_two_pods_sharing_a_card_past_its_capacity_only_one_is_admitted(
    node_agent: dict[str, Any],
) -> None:
    kube, node, ns = node_agent["kube"], node_agent["node"], node_agent["ns"]
    wait_for("the Device CR", lambda: _exists(kube, f"{DEVICES}/{node}"), timeout=60)
    pods = [kube.post(f"/api/v1/namespaces/{ns}/pods", _bound_pod(n, node, 60))
            for n in ("first", "second")]  # fmt: skip

    visible = {p["metadata"]["name"]: dict(_hook(node_agent["sock"], p).container_envs)
               ["NVIDIA_VISIBLE_DEVICES"] for p in pods}  # fmt: skip
    assert visible == {"first": "0", "second": "void"}
    # the admitted pod's next container is still admitted; the refused one stays refused
    again = {p["metadata"]["name"]: dict(_hook(node_agent["sock"], p).container_envs)
             ["NVIDIA_VISIBLE_DEVICES"] for p in pods}  # fmt: skip
    assert again == visible

    def failed() -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/second")
        return pod if pod["status"].get("phase") == "Failed" else None

    status = wait_for("the refused pod to be Failed", failed, timeout=30)["status"]
    assert status["reason"] == "DeviceOvercommit"
    assert "GPU 0 would be over-committed" in status["message"]
    assert f"{ns}/first" in status["message"]

    def event() -> dict[str, Any] | None:
        for e in kube.events(ns):
            if e["reason"] == "DeviceOvercommit" and e["involvedObject"]["name"] == "second":
                return e
        return None

    ev = wait_for("the DeviceOvercommit event", event, timeout=30)
    assert ev["type"] == "Warning"
    assert ev["involvedObject"]["uid"] == pods[1]["metadata"]["uid"]
    first = kube.get(f"/api/v1/namespaces/{ns}/pods/first")
    assert first["status"].get("phase") != "Failed"
    assert not [e for e in kube.events(ns)
                if e["reason"] == "DeviceOvercommit" and e["involvedObject"]["name"] == "first"]


def _exists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except Exception:
        return False
    return True


def test_two_pods_given_the_same_vf_only_the_first_gets_it(node_agent: dict[str, Any]) -> None:
    kube, node, ns = node_agent["kube"], node_agent["node"], node_agent["ns"]
    wait_for("the Device CR", lambda: _exists(kube, f"{DEVICES}/{node}"), timeout=60)
    allocation = {"rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "1"}, "id": NIC,
                            "extension": {"vfs": [{"minor": -1, "busID": VF}]}}]}
    pods = []
    for name in ("first", "second"):
        pod = _bound_pod(name, node, 10)
        pod["metadata"]["annotations"] = {ALLOCATED: json.dumps(allocation)}
        del pod["spec"]["containers"][0]["resources"]
        pods.append(kube.post(f"/api/v1/namespaces/{ns}/pods", pod))

    named = {p["metadata"]["name"]: dict(_hook(node_agent["sock"], p).container_annotations)
             .get(CDI_KEY) for p in pods}  # fmt: skip
    first_uid = pods[0]["metadata"]["uid"]
    assert named == {"first": f"koordinator.sh/rdma={first_uid}_main", "second": None}

    def failed() -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/second")
        return pod if pod["status"].get("phase") == "Failed" else None

    status = wait_for("the refused pod to be Failed", failed, timeout=30)["status"]
    assert status["reason"] == "DeviceOvercommit"
    assert f"VF {VF} of RDMA NIC 0 is held by an admitted pod ({ns}/first)" in status["message"]
    first = kube.get(f"/api/v1/namespaces/{ns}/pods/first")
    assert first["status"].get("phase") != "Failed"
