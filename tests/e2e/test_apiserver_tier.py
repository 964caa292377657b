"""Proves the real-API-server tier: namespaces, nodes, pods, binding, CRDs, restarts, RBAC."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from apiserver import ApiServer

from tests.e2e.apiserver import OPEN_DEVICE_CRD as CRD

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "koord-scheduler"
GROUP = "scheduling.koordinator.sh"
VERSION = "v1alpha1"
PLURAL = "devices"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def namespace(kube_client: client.ApiClient) -> Any:
    core = client.CoreV1Api(kube_client)
    ns = _name("e2e")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    yield ns
    # No namespace controller runs here: the namespace stays Terminating; pods are removed by hand.
    for pod in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    core.delete_namespace(ns)


def _node(name: str) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
        status=client.V1NodeStatus(
            capacity={"cpu": "8", "memory": "32Gi", "pods": "110"},
            allocatable={"cpu": "8", "memory": "32Gi", "pods": "110"},
        ),
    )


def _pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            scheduler_name=SCHEDULER_NAME,
            containers=[client.V1Container(name="main", image="busybox")],
        ),
    )


def _bind(core: client.CoreV1Api, ns: str, pod: str, node: str, annotations: dict[str, str]) -> int:
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=pod, annotations=annotations),
        target=client.V1ObjectReference(kind="Node", name=node, api_version="v1"),
    )
    # The typed call fails decoding the Status reply: take the raw response, read and release it.
    resp = core.create_namespaced_pod_binding(pod, ns, body, _preload_content=False)
    try:
        resp.read()
    finally:
        resp.release_conn()
    return int(resp.status)


def test_node_pod_binding(kube_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_client)
    node = _name("node")
    core.create_node(_node(node))
    try:
        got = core.read_node(node)
        assert got.status.allocatable["cpu"] == "8"

        pod = _name("pod")
        core.create_namespaced_pod(namespace, _pod(pod))
        pending = core.list_namespaced_pod(
            namespace, field_selector=f"spec.schedulerName={SCHEDULER_NAME},spec.nodeName="
        )
        assert [p.metadata.name for p in pending.items] == [pod]

        ann = {"scheduling.koordinator.sh/device-allocated": json.dumps({"gpu": [{"minor": 0}]})}
        assert _bind(core, namespace, pod, node, ann) == 201

        bound = core.read_namespaced_pod(pod, namespace)
        assert bound.spec.node_name == node
        assert bound.metadata.annotations == ann

        with pytest.raises(ApiException) as exc:
            _bind(core, namespace, pod, node, {})
        assert exc.value.status == 409
    finally:
        core.delete_node(node)


def _ensure_device_crd(api_client: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(CRD["metadata"]["name"])
        conds = {c.type: c.status for c in (crd.status.conditions or [])}
        if conds.get("Established") == "True":
            return
        time.sleep(0.1)
    raise AssertionError(f"CRD not established: {conds}")


def test_device_crd(kube_client: client.ApiClient) -> None:
    _ensure_device_crd(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    name = _name("node")
    device = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {"devices": [{"type": "gpu", "minor": 0, "health": True, "resources": {}}]},
    }
    # The Established condition can precede the REST endpoint by a moment.
    deadline = time.monotonic() + 10
    while True:
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, device)
            break
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    got = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    assert got["spec"]["devices"][0]["minor"] == 0
    assert got["kind"] == "Device"
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def test_apiserver_restart_keeps_data(apiserver: ApiServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    name = _name("cm")
    core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"k": "v"})
    )
    port = apiserver.port
    try:
        apiserver.stop_apiserver()
        assert not apiserver.apiserver_running
        fresh = client.ApiClient(apiserver.client_configuration())
        try:
            with pytest.raises(Exception):  # noqa: B017 - any connection error
                client.CoreV1Api(fresh).read_namespaced_config_map(
                    name, "default", _request_timeout=2
                )
        finally:
            fresh.close()
    finally:
        apiserver.start_apiserver()
    assert apiserver.port == port
    fresh = client.ApiClient(apiserver.client_configuration())
    try:
        cm = client.CoreV1Api(fresh).read_namespaced_config_map(name, "default")
        assert cm.data == {"k": "v"}
        client.CoreV1Api(fresh).delete_namespaced_config_map(name, "default")
    finally:
        fresh.close()


def test_kubeconfig_and_rbac_user(rbac_apiserver: ApiServer) -> None:
    from kubernetes import config as kconfig

    admin = kconfig.new_client_from_config(config_file=rbac_apiserver.kubeconfig_path())
    user = kconfig.new_client_from_config(
        config_file=rbac_apiserver.kubeconfig_path(rbac_apiserver.user_token)
    )
    try:
        assert client.CoreV1Api(admin).list_namespace().items
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(user).list_namespace()
        assert exc.value.status == 403
    finally:
        admin.close()
        user.close()
