"""RDMA from sysfs to the container on a real API server: ``koordlet run --sysfs-root`` on a
fake sysfs tree with two SR-IOV NICs writes the Device CR entries (and the node's
``koordinator.sh/rdma``) as Koordinator's koordlet does; ``koord-scheduler run`` then gives a
pod a VF from them; and the runtime hook on the same tree turns that allocation into the CDI
spec naming exactly that VF's verbs device and ``rdma_cm``."""

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
    Kube,
    KubeError,
    SchedulerProcess,
    scheduler_config,
    uid,
    wait_for,
)

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from runtimehooks.cdi import ANNOTATION_KEY, CDISpecs
from runtimehooks.context import ContainerContext, ContainerMeta, PodMeta
from runtimehooks.hooks.rdma import RDMAHook
from tests.e2e.test_koordlet_sync import Koordlet
from tests.fake_sysfs import RDMA_CM, UVERBS_MAJOR, FakeSysfs

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

NIC_A, NIC_B = "0000:18:00.0", "0000:af:00.0"


def _fake_gpu(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"driverVersion": "550.54.15", "gpus": [{
        "uuid": "GPU-rdma-e2e-0", "minor": 0, "name": "NVIDIA H100 80GB HBM3",
        "memory": "80Gi", "busID": "0000:19:00.0", "numaNode": 0, "pcieRoot": "pci0000:17"}]}))
    return path


class Node:
    def __init__(self, kube: Kube, name: str, sysfs: Path, uverbs: dict[str, str]) -> None:
        self.kube, self.name, self.sysfs, self.uverbs = kube, name, sysfs, uverbs

    def device(self) -> dict[str, Any] | None:
        try:
            doc = self.kube.get(f"{DEVICES}/{self.name}")
        except KubeError:
            return None
        rdma = [d for d in doc.get("spec", {}).get("devices", []) if d.get("type") == "rdma"]
        return doc if len(rdma) == 2 else None


@pytest.fixture(scope="module")
def node(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    work = tmp_path_factory.mktemp("koordlet-rdma")
    fs = FakeSysfs(work / "sys")
    uverbs = {**fs.nic(NIC_A, 0, numa=0, vfs=2),
              **fs.nic(NIC_B, 1, numa=1, root_complex="pci0000:ae", vfs=2)}
    name = uid("rdma-kl")
    res = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    kube.post("/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node", "status": {"capacity": res, "allocatable": res},
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})  # admission's not-ready
    agent = Koordlet(["--node-name", name, "--kubeconfig", apiserver.kubeconfig_path(),
                      "--fake-gpus", str(_fake_gpu(work / "gpus.yaml")),
                      "--kubelet-root", str(work / "kubelet"), "--sysfs-root", str(work / "sys"),
                      "--sync-interval", "1s", "--socket", "",
                      "--metrics-bind-address", "127.0.0.1:0"], work / "koordlet.log")
    try:
        yield Node(kube, name, work / "sys", uverbs)
    finally:
        rc = agent.stop()
        kube.remove_node(name)
    assert rc == 0, agent.log.read_text()


def test_koordlet_writes_the_nics_and_their_vf_groups(node: Node) -> None:
    doc = wait_for("the Device CR with both NICs", node.device, timeout=30)
    rdma = [d for d in doc["spec"]["devices"] if d["type"] == "rdma"]
    assert rdma == [
        {"type": "rdma", "id": NIC_A, "minor": 0, "health": True,
         "resources": {"koordinator.sh/rdma": "100"},
         "topology": {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:17", "busID": NIC_A},
         "vfGroups": [{"vfs": [{"minor": -1, "busID": "0000:18:00.2"},
                               {"minor": -1, "busID": "0000:18:00.3"}]}]},
        {"type": "rdma", "id": NIC_B, "minor": 1, "health": True,
         "resources": {"koordinator.sh/rdma": "100"},
         "topology": {"socketID": -1, "nodeID": 1, "pcieID": "pci0000:ae", "busID": NIC_B},
         "vfGroups": [{"vfs": [{"minor": -1, "busID": "0000:af:00.2"},
                               {"minor": -1, "busID": "0000:af:00.3"}]}]},
    ]
    allocatable = wait_for(
        "the node's koordinator.sh/rdma",
        lambda: node.kube.get(f"/api/v1/nodes/{node.name}")["status"]["allocatable"].get(
            "koordinator.sh/rdma"), timeout=30)
    assert allocatable == "200"


def test_the_scheduler_gives_a_vf_and_the_hook_delivers_exactly_it(
    node: Node, apiserver: ApiServer, tmp_path: Path
) -> None:
    wait_for("the Device CR with both NICs", node.device, timeout=30)
    kube, scheduler = node.kube, uid("koord-rdma-kl")
    ns = kube.ensure_namespace(uid("rdma-kl"))
    proc = SchedulerProcess(apiserver.kubeconfig_path(),
                            scheduler_config(tmp_path / "config.yaml", scheduler), tmp_path)
    proc.start()
    try:
        proc.wait_ready()
        kube.post(f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nccl", "annotations": {
                "scheduling.koordinator.sh/device-allocate-hint": '{"rdma":{"vfSelector":{}}}'}},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {"kubernetes.io/hostname": node.name},
                     "containers": [{"name": "main", "image": "busybox", "resources": {
                         "limits": {"koordinator.sh/rdma": "1"}}}]}})

        def bound() -> dict[str, Any] | None:
            pod = kube.get(f"/api/v1/namespaces/{ns}/pods/nccl")
            return pod if pod["spec"].get("nodeName") else None

        try:
            pod = wait_for("the RDMA pod bound", bound, timeout=30)
        except AssertionError:
            status = kube.get(f"/api/v1/namespaces/{ns}/pods/nccl").get("status")
            raise AssertionError(f"{status}\n{proc.log_tail()}") from None
    finally:
        proc.stop()
    allocation = json.loads(pod["metadata"]["annotations"][ALLOCATED])
    (entry,) = allocation["rdma"]
    (vf,) = entry["extension"]["vfs"]
    assert entry["id"] == NIC_A and vf == {"minor": -1, "busID": "0000:18:00.2"}

    pod_uid = pod["metadata"]["uid"]
    out = RDMAHook(node.sysfs, cdi=CDISpecs(tmp_path / "cdi"))(ContainerContext(
        pod_meta=PodMeta("nccl", pod_uid, ns), container_meta=ContainerMeta("main"),
        pod_annotations={ANNOTATION_DEVICE_ALLOCATED: pod["metadata"]["annotations"][ALLOCATED]}))
    assert out.container_annotations[ANNOTATION_KEY] == f"koordinator.sh/rdma={pod_uid}_main"
    (spec_file,) = (tmp_path / "cdi").glob("*.json")
    nodes = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
    verbs = node.uverbs[vf["busID"]]
    assert [(n["path"], n["major"], n["minor"]) for n in nodes] == [
        ("/dev/infiniband/rdma_cm", *RDMA_CM),
        (f"/dev/infiniband/{verbs}", UVERBS_MAJOR, 192 + int(verbs.removeprefix("uverbs")))]
