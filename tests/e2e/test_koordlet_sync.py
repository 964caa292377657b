"""koordlet run against a real kube-apiserver: the Device CR, the Node's labels and extended
resources, health changes, checkpoint entries, and the RBAC manifests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from apis.checkpoint import kubelet_checkpoint_json

if TYPE_CHECKING:
    from apiserver import ApiServer

from apis.checkpoint import decode_devices_checkpoints
from apis.device import Device
from tests.e2e.apiserver import OPEN_DEVICE_CRD as CRD

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "scheduling.koordinator.sh", "v1alpha1", "devices"
GIB = 1024**3
CORE, MEM, RATIO = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
)
ANN = "node.koordinator.sh/devices-checkpoints"
SA_USER = "system:serviceaccount:koordinator-system:koordlet"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(cond: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except ApiException as exc:
            if exc.status != 404:
                raise
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def ensure_device_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(CRD["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
        )

    _wait(established, what="CRD established")
    custom = client.CustomObjectsApi(api)
    _wait(
        lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None,
        what="devices endpoint",
    )


def _node(name: str) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
        status=client.V1NodeStatus(
            capacity={"cpu": "8", "memory": "32Gi", "pods": "110"},
            allocatable={"cpu": "8", "memory": "32Gi", "pods": "110"},
        ),
    )


def _fake_gpus(tmp_path: Path) -> Path:
    doc = {
        "driverVersion": "550.54.15",
        "healthFile": "health.yaml",
        "gpus": [
            {
                "uuid": f"GPU-e2e-{i}",
                "minor": i,
                "name": "NVIDIA H100 80GB HBM3",
                "memory": "80Gi",
                "busID": f"0000:{0x18 + i:02x}:00.0",
                "numaNode": i // 2,
                "pcieRoot": f"pci0000:{0x10 + 0x10 * (i // 2):02x}",
            }
            for i in range(4)
        ],
    }
    path = tmp_path / "fake-gpus.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _checkpoint(kubelet_root: Path, entries: list[tuple[str, str]]) -> None:
    plugins = kubelet_root / "device-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    tmp = plugins / ".tmp"
    tmp.write_text(
        kubelet_checkpoint_json(
            {
                "PodDeviceEntries": [
                    {
                        "PodUID": uid,
                        "ContainerName": "main",
                        "ResourceName": "nvidia.com/gpu",
                        "DeviceIDs": {"0": [gpu]},
                        "AllocResp": "",
                    }
                    for uid, gpu in entries
                ],
                "RegisteredDevices": {"nvidia.com/gpu": [f"GPU-e2e-{i}" for i in range(4)]},
            }
        )
    )
    tmp.replace(plugins / "kubelet_internal_checkpoint")


class Koordlet:
    """`koordlet run` as a subprocess."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "koordlet.cli", "run", *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        return int(self.proc.returncode)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture
def namespace(kube_client: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(kube_client)
    ns = _name("e2e-koordlet")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    yield ns
    for pod in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    core.delete_namespace(ns)


def _pod(core: client.CoreV1Api, ns: str, node: str, annotations: dict[str, str]) -> str:
    pod = core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=_name("pod"), annotations=annotations),
            spec=client.V1PodSpec(
                node_name=node, containers=[client.V1Container(name="main", image="busybox")]
            ),
        ),
    )
    return str(pod.metadata.uid)


def test_koordlet_keeps_device_and_node_in_sync(
    apiserver: ApiServer, kube_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ensure_device_crd(kube_client)
    core = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    node = _name("gpu-node")
    node_uid = core.create_node(_node(node)).metadata.uid
    legacy = _pod(core, namespace, node, {})
    koord = _pod(
        core,
        namespace,
        node,
        {"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":1,"resources":{}}]}'},
    )
    kubelet = tmp_path / "kubelet"
    _checkpoint(kubelet, [(legacy, "GPU-e2e-0"), (koord, "GPU-e2e-1"), ("gone-pod", "GPU-e2e-2")])
    fake = _fake_gpus(tmp_path)

    agent = Koordlet(
        [
            "--node-name",
            node,
            "--kubeconfig",
            apiserver.kubeconfig_path(),
            "--fake-gpus",
            str(fake),
            "--kubelet-root",
            str(kubelet),
            "--sync-interval",
            "1s",
            "--socket",
            "",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ],
        tmp_path / "koordlet.log",
    )
    try:
        get = lambda: custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, node)  # noqa: E731
        doc = _wait(get, what="Device CR")
        agent.alive()
        device = Device.from_dict(doc)
        assert device.owner_references[0]["uid"] == node_uid
        assert device.owner_references[0]["kind"] == "Node"
        assert [(d.id, d.minor, d.health) for d in device.devices] == [
            (f"GPU-e2e-{i}", i, True) for i in range(4)
        ]
        assert device.devices[3].topology is not None
        assert (device.devices[3].topology.pcie_id, device.devices[3].topology.node_id) == (
            "pci0000:20",
            1,
        )
        labels = {
            "node.koordinator.sh/gpu-vendor": "nvidia",
            "node.koordinator.sh/gpu-model": "H100-80GB-HBM3",
            "node.koordinator.sh/gpu-driver-version": "550.54.15",
        }
        assert device.labels == labels
        entries = decode_devices_checkpoints(device.annotations[ANN])
        assert [(e.pod_uid, e.device_ids) for e in entries] == [(legacy, ("GPU-e2e-0",))]

        def node_synced() -> client.V1Node | None:
            n = core.read_node(node)
            return n if n.status.allocatable.get(CORE) == "400" else None

        n = _wait(node_synced, what="node extended resources")
        assert {k: v for k, v in n.metadata.labels.items() if k in labels} == labels
        for res in (n.status.capacity, n.status.allocatable):
            assert (res[CORE], res[MEM], res[RATIO], res["cpu"]) == ("400", "320Gi", "400", "8")

        # Someone else labels the Device: our updates keep it.
        custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, node, {"metadata": {"labels": {"team": "ml"}}}
        )
        # A card fails: the CR and the node's totals follow.
        (tmp_path / "health.yaml").write_text(
            yaml.safe_dump(
                {"GPU-e2e-2": {"reason": "Xid79", "message": "GPU has fallen off the bus"}}
            )
        )

        def unhealthy() -> Any:
            d = Device.from_dict(get())
            return d if not d.devices[2].health else None

        device = _wait(unhealthy, what="card 2 unhealthy")
        cond = device.devices[2].conditions[0]
        assert (cond.type, cond.status, cond.reason, cond.message) == (
            "Healthy",
            "False",
            "Xid79",
            "GPU has fallen off the bus",
        )
        assert device.labels["team"] == "ml"
        n = _wait(
            lambda: (lambda x: x if x.status.allocatable.get(CORE) == "300" else None)(
                core.read_node(node)
            ),
            what="node totals after the failure",
        )
        assert n.status.capacity[MEM] == "240Gi"

        # The card recovers; the legacy pod goes away: its checkpoint entry is dropped.
        (tmp_path / "health.yaml").unlink()
        core.delete_namespaced_pod(
            _pod_name(core, namespace, legacy), namespace, grace_period_seconds=0
        )
        device = _wait(
            lambda: (lambda d: d if d.devices[2].health and ANN not in d.annotations else None)(
                Device.from_dict(get())
            ),
            what="recovery",
        )
        assert device.devices[2].conditions[0].reason == "DeviceHealthy"

        # Deleted behind its back: the agent re-creates it.
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, node)
        _wait(get, what="re-created Device")
        agent.alive()
    finally:
        rc = agent.stop()
    assert rc == 0, agent.log.read_text()
    events = [e["event"] for e in agent.events()]
    assert "device created" in events and events[-1] == "koordlet stopped"
    assert "device sync failed" not in events, agent.log.read_text()


def _pod_name(core: client.CoreV1Api, ns: str, uid: str) -> str:
    for pod in core.list_namespaced_pod(ns).items:
        if pod.metadata.uid == uid:
            return str(pod.metadata.name)
    raise AssertionError(f"no pod with uid {uid}")


def _apply(api: client.ApiClient, doc: dict[str, Any], dry_run: bool = False) -> None:
    """POST a manifest document to its collection (server-side validation; 409 = present)."""
    kind, api_version = doc["kind"], doc["apiVersion"]
    plural = {
        "Namespace": "namespaces",
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "DaemonSet": "daemonsets",
    }[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = doc["metadata"].get("namespace")
    path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
    method, url, headers, body, _ = api.param_serialize(
        method="POST",
        resource_path=path,
        query_params=[("dryRun", "All")] if dry_run else None,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=doc,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=headers, body=body)
    data = resp.read()
    resp.response.release_conn()
    assert resp.status in (200, 201, 409), f"{kind}: {resp.status} {data[:500]!r}"


def test_rbac_manifest_is_enough_for_the_agent(
    make_apiserver: Callable[..., ApiServer], tmp_path: Path
) -> None:
    srv = make_apiserver(authorization_mode="RBAC", extra_users={SA_USER: []})
    admin = client.ApiClient(srv.client_configuration())
    try:
        ensure_device_crd(admin)
        # The Namespace is declared once, by config/scheduler or config/overlays/agent.
        _apply(admin, yaml.safe_load((REPO / "config/overlays/agent/namespace.yaml").read_text()))
        for f in ("rbac.yaml", "daemonset.yaml"):
            for doc in yaml.safe_load_all((REPO / "config" / "koordlet" / f).read_text()):
                _apply(admin, doc, dry_run=doc["kind"] == "DaemonSet")
        core = client.CoreV1Api(admin)
        node = _name("gpu-node")
        core.create_node(_node(node))

        agent = Koordlet(
            [
                "--node-name",
                node,
                "--kubeconfig",
                srv.kubeconfig_path(srv.token_for(SA_USER)),
                "--fake-gpus",
                str(_fake_gpus(tmp_path)),
                "--kubelet-root",
                str(tmp_path),
                "--sync-interval",
                "1s",
                "--socket",
                "",
                "--metrics-bind-address",
                "127.0.0.1:0",
            ],
            tmp_path / "koordlet.log",
        )
        try:
            custom = client.CustomObjectsApi(admin)
            _wait(
                lambda: custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, node),
                what="Device CR written with the ServiceAccount's rights",
            )
            _wait(
                lambda: core.read_node(node).status.allocatable.get(CORE) == "400",
                what="node status patched with the ServiceAccount's rights",
            )
            _wait(
                lambda: "node.koordinator.sh/gpu-model" in core.read_node(node).metadata.labels,
                what="node labelled with the ServiceAccount's rights",
            )
            agent.alive()
        finally:
            assert agent.stop() == 0
        events = agent.events()
        assert not [e for e in events if e["event"] == "device sync failed"], agent.log.read_text()
    finally:
        admin.close()
