"""koordlet.kube.KubeNodeAPI against a real kube-apiserver: records, errors, patches."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from apiserver import ApiServer

from apis.device import Device
from koordlet.kube import KubeConfigError, KubeNodeAPI
from koordlet.reporting.sync import ApiError, ConflictError, NotFoundError
from tests.e2e.apiserver import OPEN_DEVICE_CRD as CRD

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "scheduling.koordinator.sh", "v1alpha1", "devices"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def api(apiserver: ApiServer, kube_client: client.ApiClient) -> Iterator[KubeNodeAPI]:
    ext = client.ApiextensionsV1Api(kube_client)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
    node_api = KubeNodeAPI.from_kubeconfig(apiserver.kubeconfig_path())
    deadline = time.monotonic() + 30
    while True:  # the CRD's endpoint appears a moment after it is established
        try:
            node_api.get_device("probe")
        except NotFoundError as exc:
            if "the server could not find the requested resource" not in exc.message:
                break
        assert time.monotonic() < deadline, "devices endpoint never appeared"
        time.sleep(0.1)
    try:
        yield node_api
    finally:
        node_api.close()


@pytest.fixture
def node(kube_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    core = client.CoreV1Api(kube_client)
    name = _name("node")
    created = core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
            status=client.V1NodeStatus(
                capacity={"cpu": "8", "pods": "110"}, allocatable={"cpu": "8", "pods": "110"}
            ),
        )
    )
    yield name, created.metadata.uid
    core.delete_node(name)


def _device(name: str, **meta: Any) -> Device:
    return Device.from_dict(
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Device",
            "metadata": {"name": name, **meta},
            "spec": {
                "devices": [
                    {
                        "type": "gpu",
                        "id": "GPU-0",
                        "minor": 0,
                        "health": True,
                        "resources": {"koordinator.sh/gpu-core": "100"},
                    }
                ]
            },
        }
    )


def test_get_node(api: KubeNodeAPI, node: tuple[str, str]) -> None:
    name, uid = node
    state = api.get_node(name)
    assert (state.name, state.uid) == (name, uid)
    assert state.labels == {"kubernetes.io/hostname": name}
    assert state.capacity == {"cpu": "8", "pods": "110"}
    with pytest.raises(NotFoundError) as err:
        api.get_node(_name("missing"))
    assert err.value.status == 404


def test_patch_node_labels_and_status(api: KubeNodeAPI, node: tuple[str, str]) -> None:
    name, _ = node
    api.patch_node_labels(name, {"node.koordinator.sh/gpu-model": "H100"})
    api.patch_node_status(
        name, {"koordinator.sh/gpu-core": "200"}, {"koordinator.sh/gpu-core": "100"}
    )
    state = api.get_node(name)
    assert state.labels["node.koordinator.sh/gpu-model"] == "H100"
    assert state.labels["kubernetes.io/hostname"] == name
    assert state.capacity == {"cpu": "8", "pods": "110", "koordinator.sh/gpu-core": "200"}
    assert state.allocatable["koordinator.sh/gpu-core"] == "100"
    api.patch_node_status(name, {"koordinator.sh/gpu-core": None}, {})
    assert "koordinator.sh/gpu-core" not in api.get_node(name).capacity
    api.patch_node_status(name, {}, {})  # nothing to do: no request


def test_device_create_get_update_conflict(api: KubeNodeAPI) -> None:
    name = _name("dev")
    created = api.create_device(_device(name))
    assert created.resource_version and created.uid
    assert api.get_device(name) == created
    with pytest.raises(ConflictError):
        api.create_device(_device(name))  # already exists
    updated = api.update_device(
        Device.from_dict(
            {
                **created.to_dict(),
                "metadata": {**created.to_dict()["metadata"], "labels": {"a": "b"}},
            }
        )
    )
    assert updated.labels == {"a": "b"}
    assert updated.resource_version != created.resource_version
    with pytest.raises(ConflictError) as err:
        api.update_device(created)  # stale resourceVersion
    assert err.value.status == 409


def test_undecodable_device_reads_as_metadata_only(
    api: KubeNodeAPI, kube_client: client.ApiClient
) -> None:
    name = _name("dev")
    client.CustomObjectsApi(kube_client).create_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Device",
            "metadata": {"name": name, "labels": {"keep": "me"}},
            # Valid for the CRD's schema, installed or not (the API server does not enforce an
            # integer's int32 format); out of range for the decoder.
            "spec": {"devices": [{"type": "gpu", "minor": 1 << 40}]},
        },
    )
    device = api.get_device(name)
    assert device.devices == () and device.labels == {"keep": "me"} and device.resource_version


def test_list_node_pods(
    api: KubeNodeAPI, kube_client: client.ApiClient, node: tuple[str, str]
) -> None:
    name, _ = node
    core = client.CoreV1Api(kube_client)
    ns = "default"
    uids = {}
    for pod_name, ann in (
        ("plain", {}),
        ("koord", {"scheduling.koordinator.sh/device-allocated": "{}"}),
    ):
        pod = core.create_namespaced_pod(
            ns,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=_name(pod_name), annotations=ann),
                spec=client.V1PodSpec(
                    node_name=name, containers=[client.V1Container(name="c", image="busybox")]
                ),
            ),
        )
        uids[pod_name] = pod.metadata.uid
    done = core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=_name("done")),
            spec=client.V1PodSpec(
                node_name=name, containers=[client.V1Container(name="c", image="busybox")]
            ),
        ),
    )
    core.patch_namespaced_pod_status(done.metadata.name, ns, {"status": {"phase": "Succeeded"}})
    try:
        pods = api.list_node_pods(name)
        assert pods.uids == frozenset(uids.values())
        assert pods.allocated == frozenset({uids["koord"]})
        assert api.list_node_pods(_name("other")).uids == frozenset()
    finally:
        for pod in core.list_namespaced_pod(ns, field_selector=f"spec.nodeName={name}").items:
            core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)


def test_list_node_pod_records(
    api: KubeNodeAPI, kube_client: client.ApiClient, node: tuple[str, str]
) -> None:
    name, _ = node
    core = client.CoreV1Api(kube_client)
    ns = "default"
    pod = core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=_name("gemini"),
                labels={"koordinator.sh/gpu-isolation-provider": "Gemini"},
                annotations={"koordinator.sh/gpu-core-limit": "50"},
            ),
            spec=client.V1PodSpec(
                node_name=name, containers=[client.V1Container(name="c", image="busybox")]
            ),
        ),
    )
    try:
        (record,) = api.list_node_pod_records(name)
        assert (record.uid, record.namespace, record.name) == (
            pod.metadata.uid,
            ns,
            pod.metadata.name,
        )
        assert record.labels == {"koordinator.sh/gpu-isolation-provider": "Gemini"}
        assert record.annotations == {"koordinator.sh/gpu-core-limit": "50"}
        core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {"phase": "Failed"}})
        assert api.list_node_pod_records(name) == []
    finally:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)


def test_forbidden_is_an_api_error(apiserver: ApiServer) -> None:
    api = KubeNodeAPI.from_kubeconfig(apiserver.kubeconfig_path("not-a-valid-token"))
    try:
        with pytest.raises(ApiError) as err:
            api.get_node("x")
        assert err.value.status == 401
    finally:
        api.close()


def test_unreachable_server_is_an_api_error(tmp_path: Any) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        '{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":'
        '"https://127.0.0.1:1"}}],"users":[{"name":"u","user":{"token":"t"}}],"contexts":'
        '[{"name":"c","context":{"cluster":"c","user":"u"}}],"current-context":"c"}'
    )
    api = KubeNodeAPI.from_kubeconfig(str(cfg), timeout_s=2)
    with pytest.raises(ApiError) as err:
        api.get_node("x")
    assert err.value.status == 0


def test_bad_kubeconfig(tmp_path: Any) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: [a kubeconfig")
    with pytest.raises(KubeConfigError):
        KubeNodeAPI.from_kubeconfig(str(bad))


# -- the runtime hook's pod fetch and the Warning events -------------------------------------------


def test_get_pod_and_create_event(api: KubeNodeAPI, kube_client: client.ApiClient) -> None:
    from koordlet.events import pod_warning_event
    from koordlet.pods.cache import PodMissing
    from koordlet.pods.record import ContainerRecord

    core = client.CoreV1Api(kube_client)
    gpu = client.V1ResourceRequirements(limits={"nvidia.com/gpu": "2"})
    pod = core.create_namespaced_pod(
        "default",
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=_name("gp")),
            spec=client.V1PodSpec(
                init_containers=[client.V1Container(name="init", image="busybox")],
                containers=[client.V1Container(name="cuda", image="cuda", resources=gpu)],
            ),
        ),
    )
    try:
        record = api.get_pod("default", pod.metadata.name, 2.0)
        assert record.uid == pod.metadata.uid
        assert record.containers == (
            ContainerRecord("init", "init", {}),
            ContainerRecord("cuda", "app", {"nvidia.com/gpu": 2}),
        )
        with pytest.raises(PodMissing):
            api.get_pod("default", _name("absent"), 2.0)
        event = pod_warning_event(
            namespace="default",
            name=pod.metadata.name,
            uid=pod.metadata.uid,
            reason="GPUAllocationNotServed",
            message="m",
            host="n",
            now=datetime.now(UTC),
        )
        api.create_event(event)
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.uid={pod.metadata.uid}"
        ).items
        assert [(e.type, e.reason) for e in events] == [("Warning", "GPUAllocationNotServed")]
    finally:
        core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)


def test_get_pod_from_a_server_that_never_answers_is_unavailable(tmp_path: Any) -> None:
    from koordlet.pods.cache import PodUnavailable

    with socket.socket() as stalled:  # accepts connections (backlog), never answers
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(8)
        port = stalled.getsockname()[1]
        cfg = tmp_path / "kubeconfig"
        cfg.write_text(
            '{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":'
            f'"http://127.0.0.1:{port}"}}}}],"users":[{{"name":"u","user":{{"token":"t"}}}}],'
            '"contexts":[{"name":"c","context":{"cluster":"c","user":"u"}}],'
            '"current-context":"c"}'
        )
        api = KubeNodeAPI.from_kubeconfig(str(cfg), timeout_s=300)  # the fetch has its own bound
        try:
            with pytest.raises(PodUnavailable, match="reading pod ns/p failed"):
                api.get_pod("ns", "p", 1.0)
        finally:
            api.close()
