"""The gpushare device plugin's pod side against a real kube-apiserver: which pods Allocate can
serve, and marking one assigned only at the version it was read (a concurrent change or a pod
re-created under the same name is a conflict, never a wrong pod)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from kubernetes import client

if TYPE_CHECKING:
    from apiserver import ApiServer

from koordlet.deviceplugin.gpushare import (
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_IDX,
    PodConflict,
)
from koordlet.kube import KubeNodeAPI

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(apiserver: ApiServer) -> Iterator[KubeNodeAPI]:
    node_api = KubeNodeAPI.from_kubeconfig(apiserver.kubeconfig_path())
    try:
        yield node_api
    finally:
        node_api.close()


def _pod(name: str, node: str, units: list[int], annotations: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name=f"c{i}",
                    image="busybox",
                    resources=client.V1ResourceRequirements(limits={"aliyun.com/gpu-mem": str(n)}),
                )
                for i, n in enumerate(units)
            ],
        ),
    )


def test_pending_pods_and_assignment_with_preconditions(
    api: KubeNodeAPI, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    ns = f"gs-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    node = f"node-{uuid.uuid4().hex[:6]}"
    waiting = {ANNOTATION_ASSIGNED: "false", ANNOTATION_IDX: "1", ANNOTATION_ASSUME_TIME: "5"}
    core.create_namespaced_pod(ns, _pod("two-containers", node, [2, 3], waiting))
    core.create_namespaced_pod(
        ns, _pod("served", node, [1], {**waiting, ANNOTATION_ASSIGNED: "true"})
    )
    core.create_namespaced_pod(ns, _pod("plain", node, [1], {}))
    core.create_namespaced_pod(ns, _pod("other-node", "elsewhere", [1], waiting))

    pods = api.pending_gpushare_pods(node)
    assert [(p.name, p.units) for p in pods] == [("two-containers", 5)]
    pod = pods[0]

    # A change after the read (here: the pod is re-annotated) makes the stale write a conflict.
    core.patch_namespaced_pod("two-containers", ns, {"metadata": {"labels": {"x": "y"}}})
    with pytest.raises(PodConflict):
        api.mark_assigned(pod, {ANNOTATION_ASSIGNED: "true"})
    assert (
        core.read_namespaced_pod("two-containers", ns).metadata.annotations[ANNOTATION_ASSIGNED]
        == "false"
    )

    fresh = api.pending_gpushare_pods(node)[0]
    api.mark_assigned(fresh, {ANNOTATION_ASSIGNED: "true"})
    assert (
        core.read_namespaced_pod("two-containers", ns).metadata.annotations[ANNOTATION_ASSIGNED]
        == "true"
    )
    assert api.pending_gpushare_pods(node) == []

    # Same name, new UID: the old record never marks the new pod.
    core.delete_namespaced_pod("two-containers", ns, grace_period_seconds=0)
    core.create_namespaced_pod(ns, _pod("two-containers", node, [2, 3], waiting))
    with pytest.raises(PodConflict):
        api.mark_assigned(fresh, {ANNOTATION_ASSIGNED: "true"})
