"""config/crd and config/scheduler: well-formed manifests that agree with the code.

(The e2e tier applies them to a real API server under RBAC; these checks are the fast part.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from apis.device import GROUP, KIND, PLURAL, VERSION
from apis.gang import POD_GROUP_API_VERSION, decode_pod_group
from scheduler.config import load_config, parse_config
from scheduler.kube.cluster import (
    CONFIGMAPS_PATH,
    DEVICES_PATH,
    NODES_PATH,
    POD_GROUPS_PATH,
    PODS_FIELD_SELECTOR,
    PODS_PATH,
)

ROOT = Path(__file__).resolve().parents[3]
PG_GROUP = POD_GROUP_API_VERSION.split("/")[0]


def docs(folder: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    base = ROOT / folder
    for path in [base] if base.is_file() else sorted(base.glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in docs("config/scheduler") + docs("config/crd")
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def test_every_manifest_has_kind_name_and_labels() -> None:
    for doc in docs("config/scheduler") + docs("config/crd"):
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "koord-py"


def test_configmap_holds_the_shipped_configuration() -> None:
    cm = by_kind("ConfigMap")
    embedded = parse_config(yaml.safe_load(cm["data"]["scheduler-config.yaml"]), "configmap")
    assert embedded == load_config(ROOT / "config/scheduler-config.yaml")


def test_deployment_runs_two_replicas_with_probes_and_scrape_annotations() -> None:
    dep = by_kind("Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "10259",
        "prometheus.io/path": "/metrics",
        "prometheus.io/scheme": "https",
    }
    (container,) = pod["spec"]["containers"]
    assert container["command"][:2] == ["koord-scheduler", "run"]
    assert_serves_https_only(container)
    assert pod["spec"]["serviceAccountName"] == by_kind("ServiceAccount")["metadata"]["name"]
    cm_name = by_kind("ConfigMap")["metadata"]["name"]
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == cm_name


def assert_serves_https_only(container: dict[str, Any]) -> None:
    """The secure port only (no --port: no plain HTTP), probed over HTTPS on paths that are
    always allowed (the kubelet sends no token)."""
    from scheduler.cli import build_parser

    args = build_parser().parse_args(container["command"][1:])
    assert (args.port, args.secure_port) == (0, 10259)
    port = next(p for p in container["ports"] if p["containerPort"] == args.secure_port)
    open_paths = args.authorization_always_allow_paths.split(",")
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["scheme"] == "HTTPS" and get["port"] == port["name"]
        assert get["path"] in open_paths
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_extender_overlay_serves_https_only() -> None:
    patch = yaml.safe_load((ROOT / "config/overlays/extender/deployment-patch.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    base = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["koord-scheduler", "extender"]
    assert_serves_https_only({**base, **container})


def test_cluster_role_is_least_privilege() -> None:
    rules = by_kind("ClusterRole")["rules"]
    grants = {
        (group, res, verb)
        for r in rules
        for group in r["apiGroups"]
        for res in r["resources"]
        for verb in r["verbs"]
    }
    assert grants == {
        ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("", "pods", "delete"),  # preemption's victims
        ("", "pods", "patch"),  # a timed-out gang's mark (and --bind-mode patch)
        ("policy", "poddisruptionbudgets", "list"), ("policy", "poddisruptionbudgets", "watch"),
        (PG_GROUP, "podgroups", "list"), (PG_GROUP, "podgroups", "watch"),
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        ("", "events", "create"), ("", "events", "patch"),
        # events.k8s.io/v1, as kube-scheduler writes them (core/v1 where not served)
        ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch"),
        (GROUP, PLURAL, "get"), (GROUP, PLURAL, "list"), (GROUP, PLURAL, "watch"),
        # the secure port's delegated authentication and authorization
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }  # fmt: skip
    assert NODES_PATH == "/api/v1/nodes" and PODS_PATH == "/api/v1/pods"
    assert f"/apis/{GROUP}/{VERSION}/{PLURAL}" == DEVICES_PATH
    assert "status.phase" in PODS_FIELD_SELECTOR
    assert f"/apis/{PG_GROUP}/v1alpha1/podgroups" == POD_GROUPS_PATH


def test_lease_role_matches_the_configuration() -> None:
    le = load_config(ROOT / "config/scheduler-config.yaml").leader_election
    role = by_kind("Role", "koord-scheduler-leader-election")
    assert role["metadata"]["namespace"] == le.resource_namespace
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named[0]["resourceNames"] == [le.resource_name]
    binding = by_kind("RoleBinding", "koord-scheduler-leader-election")
    assert binding["metadata"]["namespace"] == le.resource_namespace
    sa = by_kind("ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"],
         "namespace": sa["metadata"]["namespace"]}
    ]  # fmt: skip


def test_unhealthy_gpus_role_lets_the_informer_list_and_watch_kube_system_configmaps() -> None:
    role = by_kind("Role", "koord-scheduler-unhealthy-gpus")
    assert f"/api/v1/namespaces/{role['metadata']['namespace']}/configmaps" == CONFIGMAPS_PATH
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}
    ]
    binding = by_kind("RoleBinding", "koord-scheduler-unhealthy-gpus")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    sa = by_kind("ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"],
         "namespace": sa["metadata"]["namespace"]}
    ]  # fmt: skip


def test_crd_is_the_cluster_scoped_device_with_the_spec_schema() -> None:
    crd = by_kind("CustomResourceDefinition", f"{PLURAL}.{GROUP}")
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert spec["scope"] == "Cluster" and spec["group"] == GROUP
    assert spec["names"]["kind"] == KIND and spec["names"]["plural"] == PLURAL
    (version,) = spec["versions"]
    assert version["name"] == VERSION and version["subresources"] == {"status": {}}
    item = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["devices"][
        "items"
    ]["properties"]
    assert set(item) == {
        "type", "id", "minor", "moduleID", "health", "resources", "topology", "labels",
        "vfGroups", "conditions",
    }  # fmt: skip
    assert set(item["topology"]["properties"]) == {"socketID", "nodeID", "pcieID", "busID"}
    assert set(item["vfGroups"]["items"]["properties"]) == {"labels", "vfs"}
    assert set(item["vfGroups"]["items"]["properties"]["vfs"]["items"]["properties"]) == {
        "minor",
        "busID",
    }
    assert item["resources"]["additionalProperties"]["x-kubernetes-int-or-string"] is True


def test_pod_group_crd_is_scheduler_plugins_namespaced_v1alpha1() -> None:
    crd = by_kind("CustomResourceDefinition", f"podgroups.{PG_GROUP}")
    spec = crd["spec"]
    assert spec["group"] == PG_GROUP and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "PodGroup", "listKind": "PodGroupList", "plural": "podgroups",
        "singular": "podgroup", "shortNames": ["pg", "pgs"],
    }  # fmt: skip
    (version,) = spec["versions"]
    assert f"{PG_GROUP}/{version['name']}" == POD_GROUP_API_VERSION
    assert version["served"] and version["storage"]
    props = version["schema"]["openAPIV3Schema"]["properties"]
    assert set(props["spec"]["properties"]) == {
        "minMember",
        "minResources",
        "scheduleTimeoutSeconds",
    }
    for field in ("minMember", "scheduleTimeoutSeconds"):
        assert props["spec"]["properties"][field]["type"] == "integer"
        assert props["spec"]["properties"][field]["format"] == "int32"
    assert set(props["status"]["properties"]) == {
        "phase", "occupiedBy", "scheduled", "running", "succeeded", "failed", "scheduleStartTime",
    }  # fmt: skip
    example = {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minMember": 3, "scheduleTimeoutSeconds": 60},
    }
    group = decode_pod_group(example)
    assert (group.id, group.min_member, group.schedule_timeout_seconds) == ("ml/train", 3, 60.0)


def test_kustomization_ships_both_crds() -> None:
    kustomization = yaml.safe_load((ROOT / "config/crd/Kustomization").read_text())
    shipped = {p.name for p in (ROOT / "config/crd").glob("*.yaml")}
    assert set(kustomization["resources"]) == shipped
    assert f"podgroups.{PG_GROUP}.yaml" in shipped


def test_prometheus_example_scrapes_the_annotated_pods() -> None:
    cfg = yaml.safe_load((ROOT / "config/prometheus/scrape-config.yaml").read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "koord-scheduler"]
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert any(r["regex"] == "koord-scheduler" for r in keeps)
    # The secure port: HTTPS, Prometheus's ServiceAccount token, the self-signed certificate.
    assert job["scheme"] == "https"
    assert job["authorization"] == {
        "credentials_file": "/var/run/secrets/kubernetes.io/serviceaccount/token"
    }
    assert job["tls_config"] == {"insecure_skip_verify": True}


def test_prometheus_may_get_metrics_and_nothing_else() -> None:
    rbac = docs("config/prometheus/rbac.yaml")
    role = next(d for d in rbac if d["kind"] == "ClusterRole")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = next(d for d in rbac if d["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }  # fmt: skip


def test_the_kube_scheduler_snippets_differ_only_in_their_api_version() -> None:
    """One extender entry shipped under two API versions (v1 for kube-scheduler v1.25+,
    v1beta1 for v1.20-v1.22): a change to one must be made to the other."""
    here = ROOT / "config/overlays/extender"
    current = yaml.safe_load((here / "kube-scheduler-config.yaml").read_text())
    legacy = yaml.safe_load((here / "kube-scheduler-config-v1beta1.yaml").read_text())
    assert current.pop("apiVersion") == "kubescheduler.config.k8s.io/v1"
    assert legacy.pop("apiVersion") == "kubescheduler.config.k8s.io/v1beta1"
    assert current == legacy
