"""GPU partition tables end to end on a real API server: a Device CR carrying the interconnect
and the partition table koordlet derives from it (an 8-card A100 box of NVLink pairs), labelled
``node.koordinator.sh/gpu-partition-policy: Honor``; ``koord-scheduler run`` gives every
``nvidia.com/gpu: 2`` pod one NVLink pair of the table, and answers a 3-GPU pod with
Koordinator's reason instead of placing it across pairs."""

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
    DEVICES,
    GIB,
    GPU_CORE,
    GPU_MEMORY,
    GPU_RATIO,
    Kube,
    SchedulerProcess,
    condition,
    gpu_pod,
    uid,
    wait_for,
)

from apis.device import ANNOTATION_GPU_TOPOLOGY
from apis.partition import ANNOTATION_GPU_PARTITIONS, LABEL_GPU_PARTITION_POLICY, POLICY_HONOR
from koordlet.devices.fake import FakeLibrary
from koordlet.reporting.partitions import derive_partitions

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "examples" / "fake-gpus-a100-nvlink-pairs.yaml"
ALLOCATED = "scheduling.koordinator.sh/device-allocated"


class Env:
    def __init__(self, kube: Kube, ns: str, scheduler: str, node: str, pairs: set[Any]) -> None:
        self.kube, self.ns, self.scheduler, self.node, self.pairs = kube, ns, scheduler, node, pairs

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.kube.pods(self.ns)}


@pytest.fixture
def env(apiserver: ApiServer, tmp_path: Path) -> Iterator[Env]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-partition")
    ns = kube.ensure_namespace(uid("partition"))
    node = uid("a100")
    topology = FakeLibrary.from_file(EXAMPLE).discover().topology
    table = derive_partitions(topology, range(8))
    assert table is not None
    alloc = {
        "cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8",
        GPU_CORE: "800", GPU_RATIO: "800", GPU_MEMORY: str(80 * GIB * 8),
    }  # fmt: skip
    kube.post("/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"e2e-group": scheduler}},
        "status": {"capacity": alloc, "allocatable": alloc},
    })
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": None}})
    kube.post(DEVICES, {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
        "metadata": {
            "name": node,
            "labels": {LABEL_GPU_PARTITION_POLICY: POLICY_HONOR},
            "annotations": {
                ANNOTATION_GPU_TOPOLOGY: topology.encode(),
                ANNOTATION_GPU_PARTITIONS: table.encode(),
            },
        },
        "spec": {"devices": [
            {"type": "gpu", "id": f"GPU-{node}-{m}", "minor": m, "health": True,
             "resources": {GPU_CORE: "100", GPU_MEMORY: "80Gi", GPU_RATIO: "100"}}
            for m in range(8)
        ]},
    })
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 2,
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler}],
    }))
    proc = SchedulerProcess(apiserver.kubeconfig_path(), cfg, tmp_path).start()
    try:
        proc.wait_ready()
        yield Env(kube, ns, scheduler, node, {p.minors for p in table.of_size(2)})
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        kube.remove_node(node)


def test_honor_gives_each_two_gpu_pod_a_table_pair_and_refuses_three(env: Env) -> None:
    selector = {"e2e-group": env.scheduler}
    # On the empty node: eight free cards, but no 3-GPU partition in the table.
    body = gpu_pod("three", env.scheduler, {"nvidia.com/gpu": "3"}, selector)
    env.kube.post(f"/api/v1/namespaces/{env.ns}/pods", body)

    def refused() -> str:
        cond = condition(env.pods()["three"]) or {}
        return str(cond.get("message", "")) if cond.get("status") == "False" else ""

    message = wait_for("the 3-GPU pod refused", refused, timeout=30)
    # Other tests' nodes share this API server (rejected by our node selector); ours gives
    # Koordinator's partition reason.
    assert "1 node(s) Unsupported number of GPU requests" in message, message
    assert not env.pods()["three"]["spec"].get("nodeName")
    env.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/three")

    for i in range(4):
        body = gpu_pod(f"pair-{i}", env.scheduler, {"nvidia.com/gpu": "2"}, selector)
        env.kube.post(f"/api/v1/namespaces/{env.ns}/pods", body)
    wait_for(
        "four pairs bound",
        lambda: sum(1 for p in env.pods().values() if p["spec"].get("nodeName")) == 4,
        timeout=60,
    )
    taken: list[int] = []
    for pod in env.pods().values():
        minors = tuple(sorted(
            a["minor"] for a in json.loads(pod["metadata"]["annotations"][ALLOCATED])["gpu"]
        ))
        assert minors in env.pairs, f"{pod['metadata']['name']} got {minors}, not a table pair"
        taken.extend(minors)
    assert sorted(taken) == list(range(8))
