"""The manifests of config/ applied to an API server with --authorization-mode=RBAC, and the
scheduler running with the token of their ServiceAccount: everything it does is allowed (the
ClusterRole and the lease Role are sufficient), and the manifests are accepted as they are."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    DEVICES,
    GPU_CORE,
    REPO_ROOT,
    Kube,
    KubeError,
    SchedulerProcess,
    condition,
    gpu_pod,
    shared_gpu,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

SA_NAMESPACE = "koordinator-system"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:koord-scheduler"
SA_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{SA_NAMESPACE}"]

_COLLECTIONS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
}


def _manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for folder in ("config/crd", "config/scheduler"):
        for path in sorted((REPO_ROOT / folder).glob("*.yaml")):
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _apply(kube: Kube, docs: list[dict[str, Any]]) -> None:
    order = list(_COLLECTIONS)
    for doc in sorted(docs, key=lambda d: order.index(d["kind"])):
        ns = doc["metadata"].get("namespace", "")
        kube.post(_COLLECTIONS[doc["kind"]].format(ns=ns), doc)


def test_config_manifests_are_sufficient_under_rbac(
    make_apiserver: Callable[..., ApiServer], tmp_path: Path
) -> None:
    server = make_apiserver(authorization_mode="RBAC", extra_users={SA_USER: SA_GROUPS})
    admin = Kube(server.url, server.admin_token)
    docs = _manifests()
    assert {d["kind"] for d in docs} == set(_COLLECTIONS)
    _apply(admin, docs)  # every manifest is accepted by the API server's validation
    admin.ensure_device_crd()
    deployment = admin.get(f"/apis/apps/v1/namespaces/{SA_NAMESPACE}/deployments/koord-scheduler")
    assert deployment["spec"]["replicas"] == 2

    # A Device CR using every field of the schema survives the structural schema unpruned.
    # (No empty strings: this kube-apiserver build decodes "" inside custom resources as null,
    # which a string-typed schema field rejects; real API servers keep "".)
    full = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "schema-probe"},
        "spec": {
            "devices": [
                {
                    "type": "rdma",
                    "id": "0000:1f:00.0",
                    "minor": 1,
                    "moduleID": 3,
                    "health": True,
                    "resources": {"koordinator.sh/rdma": "100"},
                    "topology": {
                        "socketID": 0,
                        "nodeID": 1,
                        "pcieID": "pci0000:1a",
                        "busID": "0000:1f:00.0",
                    },
                    "labels": {"type": "fake"},
                    "vfGroups": [
                        {"labels": {"vf": "g1"}, "vfs": [{"minor": 0, "busID": "0000:1f:00.2"}]}
                    ],
                    "conditions": [
                        {
                            "type": "Healthy",
                            "status": "True",
                            "reason": "OK",
                            "message": "healthy",
                            "lastTransitionTime": "2024-01-01T00:00:00Z",
                        }
                    ],
                }
            ]
        },
    }
    admin.post(DEVICES, full)
    assert admin.get(f"{DEVICES}/schema-probe")["spec"] == full["spec"]
    admin.delete(f"{DEVICES}/schema-probe")

    # The scheduler as the ServiceAccount, with the ConfigMap's configuration.
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg_path = tmp_path / "scheduler-config.yaml"
    cfg_path.write_text(configmap["data"]["scheduler-config.yaml"])
    sa = Kube(server.url, server.token_for(SA_USER))
    with pytest.raises(KubeError) as denied:  # least privilege: no secrets, no node writes
        sa.get("/api/v1/namespaces/kube-system/secrets")
    assert denied.value.status == 403

    ns = admin.ensure_namespace("team-a")
    admin.add_gpu_node("gpu-0", gpus=4)
    proc = SchedulerProcess(server.kubeconfig_path(server.token_for(SA_USER)), cfg_path, tmp_path)
    proc.start()
    try:
        proc.wait_ready()
        admin.post(f"/api/v1/namespaces/{ns}/pods", shared_gpu("ok", "koord-scheduler", 50))
        admin.post(
            f"/api/v1/namespaces/{ns}/pods", gpu_pod("invalid", "koord-scheduler", {GPU_CORE: "30"})
        )

        def pod(name: str) -> dict[str, Any]:
            return admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")

        wait_for("the pod bound", lambda: pod("ok")["spec"].get("nodeName"), 20)
        assert ALLOCATED in pod("ok")["metadata"]["annotations"]
        wait_for(
            "PodScheduled=False patched",
            lambda: (condition(pod("invalid")) or {}).get("status") == "False",
            20,
        )
        wait_for(
            "both events written",
            lambda: {e["reason"] for e in admin.events(ns)} >= {"Scheduled", "FailedScheduling"},
            20,
        )
        lease = admin.get(
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/koord-scheduler"
        )
        assert lease["spec"]["holderIdentity"] == proc.identity
        forbidden = [  # (not a bare "403": the API server's random port may contain it)
            line
            for line in proc.log_lines()
            if line.get("status") == 403 or "orbidden" in str(line)
        ]
        assert not forbidden, forbidden
    finally:
        proc.stop()
