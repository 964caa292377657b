"""``koord-scheduler run`` on a real API server with an RDMA node (config/examples/demo-rdma.yaml:
8 GPUs and 4 SR-IOV NICs over 2 NUMA nodes x 2 PCIe switches, GPU 5 and one VF of NIC 3 in
use): the bound pods carry the GPUs and the VFs Koordinator's DeviceShare would choose."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    DEVICES,
    REPO_ROOT,
    Kube,
    SchedulerProcess,
    scheduler_config,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

DEMO = REPO_ROOT / "config" / "examples" / "demo-rdma.yaml"
DEMO_NODE = "gpu-h800-rdma-0"


def _docs() -> dict[str, dict[str, Any]]:
    out = {}
    for doc in yaml.safe_load_all(DEMO.read_text()):
        if doc:
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def _pod(doc: dict[str, Any], scheduler: str, node: str | None = None) -> dict[str, Any]:
    meta = {k: v for k, v in doc["metadata"].items() if k != "namespace"}
    spec = {**doc["spec"], "schedulerName": scheduler, "terminationGracePeriodSeconds": 0}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Env:
    def __init__(self, kube: Kube, ns: str, scheduler: str, node: str) -> None:
        self.kube, self.ns, self.scheduler, self.node = kube, ns, scheduler, node
        self.docs = _docs()

    def create(self, name: str) -> None:
        self.kube.post(f"/api/v1/namespaces/{self.ns}/pods",
                       _pod(self.docs[f"Pod/{name}"], self.scheduler))

    def allocation(self, name: str) -> dict[str, Any] | None:
        pod = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{name}")
        if not pod["spec"].get("nodeName"):
            return None
        assert pod["spec"]["nodeName"] == self.node
        result: dict[str, Any] = json.loads(pod["metadata"]["annotations"][ALLOCATED])
        return result


@pytest.fixture(scope="module")
def env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-rdma")
    ns = kube.ensure_namespace(uid("rdma"))
    node = uid("rdma-node")
    docs = _docs()
    node_doc = json.loads(json.dumps(docs[f"Node/{DEMO_NODE}"]).replace(DEMO_NODE, node))
    kube.post("/api/v1/nodes", node_doc)
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": None}})
    device = json.loads(json.dumps(docs[f"Device/{DEMO_NODE}"]).replace(DEMO_NODE, node))
    kube.post(DEVICES, device)
    kube.post(f"/api/v1/namespaces/{ns}/pods", _pod(docs["Pod/used"], scheduler, node))
    work = tmp_path_factory.mktemp("sched")
    proc = SchedulerProcess(apiserver.kubeconfig_path(),
                            scheduler_config(work / "config.yaml", scheduler), work).start()
    try:
        proc.wait_ready()
        yield Env(kube, ns, scheduler, node)
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        kube.remove_node(node)


def _vfs(allocation: dict[str, Any]) -> list[tuple[int, str]]:
    return [(a["minor"], vf["busID"]) for a in allocation["rdma"]
            for vf in a.get("extension", {}).get("vfs", [])]


def test_gpus_and_vfs_are_chosen_together(env: Env) -> None:
    env.create("train-1gpu-vf")
    got = wait_for("train-1gpu-vf bound", lambda: env.allocation("train-1gpu-vf"), timeout=30)
    assert [a["minor"] for a in got["gpu"]] == [4]  # beside the used GPU 5
    assert _vfs(got) == [(3, "0000:51:00.3")]  # the next VF of NIC 3, same switch
    assert got["rdma"][0]["extension"]["vfs"][0] == {"minor": -1, "busID": "0000:51:00.3"}
    env.create("train-4gpu-numa")
    got = wait_for("train-4gpu-numa bound", lambda: env.allocation("train-4gpu-numa"),
                   timeout=30)
    assert [a["minor"] for a in got["gpu"]] == [0, 1, 2, 3]
    assert _vfs(got) == [(1, "0000:1f:00.2"), (2, "0000:90:00.2")]


def test_designated_vf_is_kept(env: Env) -> None:
    env.create("train-pinned-vf")
    got = wait_for("train-pinned-vf bound", lambda: env.allocation("train-pinned-vf"),
                   timeout=30)
    assert _vfs(got) == [(4, "0000:b9:00.4")]
