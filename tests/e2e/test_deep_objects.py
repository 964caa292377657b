"""A tenant's deeply nested objects on each real kube-apiserver (issue 45, finding 1).

A user with the default ``edit`` ClusterRole in one namespace (RBAC on; the role aggregated as
kube-controller-manager would, plus the PodGroup rules an installation offering gangs to
tenants adds) creates a Pod, a PodDisruptionBudget and a PodGroup whose
``metadata.managedFields[0].fieldsV1`` nests 1,500 levels, and a Pod as deep as the API
server accepts (10,000 levels; its list page 10,002). The API server accepts them and serves
them back as written. ``json.loads`` stops at ~1,000 levels: before the fix the webhook
refused the pod (400), a running scheduler's informers relisted for ever and a restarted one
never became ready, and koordlet's node pod list failed (no Device sync, never ready). Proved
here, on one API server:

- the koord webhook reviews the deep pod (mutates it to koord-scheduler), and the running
  scheduler binds it and another GPU pod created after it;
- a restarted scheduler becomes ready (``/readyz`` 200), binds a new pod, and holds nothing
  in quarantine (the deep objects decode);
- koordlet started on the deep pod's node becomes ready: its node pod list (with the deep
  pod) and its Device CR sync work.

Beside them the tenant creates a huge pod (200 KB of annotations) and a malformed PodGroup
(``minMember: -3``, which its CRD accepts): the pod is bound, the PodGroup is quarantined —
one log line naming it, the gauge at 1 — and nothing else is held or blocked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apiserver import V120
from test_node_to_container import FAKE_GPUS, Agent
from test_scheduler_harness import (
    DEVICES,
    GPU_CORE,
    GPU_RATIO,
    REPO_ROOT,
    Kube,
    KubeError,
    SchedulerProcess,
    free_port,
    gpu_pod,
    scheduler_config,
    wait_for,
)
from test_webhook import SA_GROUPS, SCHED_USER, WebhookProcess, _register

from tests.deepjson import with_deep_managed_fields

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

DEEP = 1_500
DEEPEST = 9_996
"""The deepest fieldsV1 the API server accepts in a Pod written as JSON (the Pod is then
10,000 levels deep, json-iterator's limit; a list page of it 10,002)."""
NODE = "gpu-0"
SCHEDULER = "koord-scheduler"
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC = f"/apis/{RBAC_GROUP}/v1"
# policy/v1 since 1.21 (the only version from 1.25); 1.20 serves only v1beta1.
PDBS = "/apis/{version}/namespaces/{ns}/poddisruptionbudgets"
POD_GROUPS = "/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/podgroups"


def grant_edit(admin: Kube, ns: str, user: str) -> None:
    """``user`` gets the default ``edit`` ClusterRole in ``ns`` (a RoleBinding)."""
    admin.post(
        f"{RBAC}/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {
                "name": "podgroups-edit",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"},
            },
            "rules": [
                {
                    "apiGroups": ["scheduling.sigs.k8s.io"],
                    "resources": ["podgroups"],
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
            ],
        },
    )
    aggregate(admin, "edit")
    admin.post(
        f"{RBAC}/namespaces/{ns}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "User", "name": user}],
        },
    )


def aggregate(admin: Kube, name: str) -> list[dict[str, Any]]:
    """What kube-controller-manager's clusterrole-aggregation controller (not run in this
    tier) does: an aggregated ClusterRole's rules become the union of the roles its
    aggregationRule selects (``edit`` takes ``view``'s, itself aggregated). Its rules."""
    role = admin.get(f"{RBAC}/clusterroles/{name}")
    if not role.get("aggregationRule"):
        return list(role.get("rules") or [])
    rules: list[dict[str, Any]] = []
    for selector in role["aggregationRule"]["clusterRoleSelectors"]:
        labels = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
        for part in admin.get(f"{RBAC}/clusterroles?labelSelector={labels}")["items"]:
            rules.extend(r for r in aggregate(admin, part["metadata"]["name"]) if r not in rules)
    role["rules"] = rules
    admin.request("PUT", f"{RBAC}/clusterroles/{name}", role)
    return rules


def ensure_pod_group_crd(admin: Kube) -> None:
    crd = yaml.safe_load(
        (REPO_ROOT / "config/crd/podgroups.scheduling.sigs.k8s.io.yaml").read_text()
    )
    admin.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def served() -> bool:
        try:
            admin.get(POD_GROUPS.format(ns="default"))
            return True
        except KubeError:
            return False

    wait_for("the PodGroup CRD to be served", served, timeout=30)


def node_of(kube: Kube, path: str) -> str:
    """``spec.nodeName`` of a pod read as text (the deep pod is beyond ``json``'s reach)."""
    found = re.search(r'"nodeName":"([^"]*)"', kube.request_text("GET", path))
    return found.group(1) if found else ""


def scheduler_name_of(kube: Kube, path: str) -> str:
    found = re.search(r'"schedulerName":"([^"]*)"', kube.request_text("GET", path))
    return found.group(1) if found else ""


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_a_tenants_deep_objects_block_nothing(
    make_apiserver: Any, kube_version: str, tmp_path: Path
) -> None:
    policy = "policy/v1beta1" if kube_version == V120 else "policy/v1"
    server: ApiServer = make_apiserver(
        authorization_mode="RBAC", extra_users={SCHED_USER: [*SA_GROUPS, "system:masters"]}
    )
    admin = Kube(server.url, server.admin_token)
    tenant = Kube(server.url, server.user_token)
    ns = admin.ensure_namespace("tenant-a")
    admin.ensure_device_crd()
    ensure_pod_group_crd(admin)
    grant_edit(admin, ns, server.plain_user)
    wait_for(
        "the tenant's edit role", lambda: _allowed(tenant, f"/api/v1/namespaces/{ns}/pods"), 30
    )
    with pytest.raises(KubeError) as outside:
        tenant.get("/api/v1/namespaces/default/pods")
    assert outside.value.status == 403  # a tenant of its namespace only
    admin.add_gpu_node(NODE, gpus=2)

    certs = tmp_path / "certs"
    made = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "webhook", "certs", f"--out={certs}",
         "--host=127.0.0.1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    webhook = WebhookProcess(certs, tmp_path).start()
    first = second = agent = None
    try:
        _register(admin, webhook.port, made.stdout.strip())
        kubeconfig = server.kubeconfig_path(server.token_for(SCHED_USER))
        cfg = scheduler_config(tmp_path / "sched.yaml", SCHEDULER)
        first = SchedulerProcess(kubeconfig, cfg, tmp_path).start()
        first.wait_ready(timeout=60)

        # The tenant's deep objects: accepted, and served back as written.
        pods = f"/api/v1/namespaces/{ns}/pods"
        deep_pod = gpu_pod("deep-pod", SCHEDULER, {"nvidia.com/gpu": "1"})
        del deep_pod["spec"]["schedulerName"]  # the webhook's mutation sets it
        pdb: dict[str, Any] = {
            "apiVersion": policy,
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "deep-pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "deep"}}},
        }
        group: dict[str, Any] = {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "deep-group"},
            "spec": {"minMember": 1},
        }
        deepest = gpu_pod("deepest-pod", "default-scheduler", {})
        deep: list[tuple[str, dict[str, Any], int]] = [
            (pods, deep_pod, DEEP),
            (PDBS.format(version=policy, ns=ns), pdb, DEEP),
            (POD_GROUPS.format(ns=ns), group, DEEP),
            (pods, deepest, DEEPEST),
        ]
        for path, obj, levels in deep:
            create = _creator(tenant, path, obj, levels)
            wait_for(f"the tenant's deep {obj['kind']}", create, timeout=30)
            served = admin.request_text("GET", f"{path}/{obj['metadata']['name']}")
            assert served.count('"f:a"') >= levels - 1, served[:500]

        # Huge and malformed: a pod of ours with 200 KB of annotations (the API server allows
        # 256 KiB; no GPU, so the cards stay for the pods below), and a PodGroup its CRD
        # accepts but the gang reading refuses (minMember -3): the pod is scheduled, the
        # PodGroup quarantined, nothing blocked.
        huge = gpu_pod("huge-pod", SCHEDULER, {})
        huge["metadata"]["annotations"] = {f"tenant.example/k{i}": "x" * 1000 for i in range(200)}
        tenant.post(pods, huge)
        bad_group = {**group, "metadata": {"name": "bad-group"}, "spec": {"minMember": -3}}
        tenant.post(POD_GROUPS.format(ns=ns), bad_group)

        # The running scheduler: the deep pod (mutated by the webhook) and the next are bound.
        wait_for("the huge pod bound", lambda: node_of(admin, f"{pods}/huge-pod") == NODE, 60)
        assert scheduler_name_of(admin, f"{pods}/deep-pod") == SCHEDULER
        wait_for("the deep pod bound", lambda: node_of(admin, f"{pods}/deep-pod") == NODE, 60)
        tenant.post(pods, gpu_pod("after", SCHEDULER, {GPU_CORE: "50", GPU_RATIO: "50"}))
        wait_for("a pod after it bound", lambda: node_of(admin, f"{pods}/after") == NODE, 60)

        # A restarted scheduler lists everything again: ready, binding, nothing quarantined.
        first.stop()
        second = SchedulerProcess(kubeconfig, cfg, tmp_path).start()
        second.wait_ready(timeout=60)
        tenant.post(pods, gpu_pod("after-restart", SCHEDULER, {GPU_CORE: "50", GPU_RATIO: "50"}))
        wait_for(
            "bound after a restart", lambda: node_of(admin, f"{pods}/after-restart") == NODE, 60
        )
        held = second.metrics()["koord_scheduler_informer_quarantined_objects"].samples
        assert {s.labels["resource"] for s in held} >= {"Pod", "PodDisruptionBudget", "PodGroup"}
        # only the malformed PodGroup is held; the deep and huge objects decode
        assert {s.labels["resource"]: s.value for s in held if s.value} == {"PodGroup": 1}, held
        named = [
            e for e in second.log_lines()
            if e.get("event", "").startswith("object quarantined")
            and e.get("object") == f"{ns}/bad-group"
        ]  # fmt: skip
        assert len(named) == 1, second.log_lines()[-20:]
        failed = [e for e in second.log_lines() if e.get("event") == "list/watch failed"]
        assert not failed, failed

        # koordlet on the deep pod's node: its pod list holds the deep pod, the Device syncs.
        port = free_port()
        agent = Agent(
            ["--node-name", NODE, "--kubeconfig", server.kubeconfig_path(),
             "--fake-gpus", str(FAKE_GPUS), "--kubelet-root", str(tmp_path / "kubelet"),
             "--sync-interval", "1s", "--socket", str(tmp_path / "koordlet.sock"),
             "--hook-dir", str(tmp_path / "hooks"),
             "--metrics-bind-address", f"127.0.0.1:{port}", "--fairshare=off"],
            tmp_path / "koordlet.log",
        )  # fmt: skip
        wait_for(
            "koordlet ready",
            lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200,
            60,
        )
        fake = {g["uuid"] for g in yaml.safe_load(FAKE_GPUS.read_text())["gpus"]}
        device = admin.get(f"{DEVICES}/{NODE}")
        assert {d["id"] for d in device["spec"]["devices"] if d["type"] == "gpu"} == fake
    finally:
        if agent is not None:
            assert agent.stop() == 0, (tmp_path / "koordlet.log").read_text()[-3000:]
        for proc in (second, first):
            if proc is not None:
                proc.stop()
        webhook.stop()


def _allowed(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except KubeError as exc:
        if exc.status == 403:
            return False
        raise
    return True


def _creator(kube: Kube, path: str, obj: dict[str, Any], levels: int) -> Callable[[], bool]:
    """POST ``obj`` with deep managedFields; False (try again) while the webhook is being
    registered or does not answer."""

    def create() -> bool:
        try:
            kube.request_text("POST", path, with_deep_managed_fields(obj, levels).encode())
        except KubeError as exc:
            if exc.status == 409:
                return True
            if "failed calling webhook" in str(exc) or exc.status >= 500:
                return False
            raise
        return True

    return create
