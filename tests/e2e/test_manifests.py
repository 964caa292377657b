"""Every install entry point (``config/``, ``config/overlays/*``) built by Debian's kubectl 1.20
(``kubernetes-client``, via ``hack/kubectl.sh``; its embedded kustomize is v2.0.3) and applied
to a real kube-apiserver: the CRD, Namespace and RBAC parts for real, then every manifest with
``--dry-run=server`` (server-side validation and defaulting of each object). A broken manifest,
a kustomization the old kustomize cannot build, or overlays whose image differs fail here.
A fresh API server is used: the real CRD must not replace the session's open-schema test CRD.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prometheus import hack_values

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = [
    "config",
    "config/overlays/scheduler-only",
    "config/overlays/agent",
    "config/overlays/extender",
    "config/overlays/webhook",
]
REAL_KINDS = {
    "CustomResourceDefinition",
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
}
EXPECTED = {
    "config": {"Deployment", "DaemonSet", "ConfigMap", *REAL_KINDS},
    "config/overlays/scheduler-only": {"Deployment", "ConfigMap", *REAL_KINDS},
    "config/overlays/agent": {"DaemonSet", *REAL_KINDS - {"Role", "RoleBinding"}},
    "config/overlays/extender": {"Deployment", "ConfigMap", "Service", *REAL_KINDS},
    "config/overlays/webhook": {
        "Deployment",
        "DaemonSet",
        "ConfigMap",
        "Service",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        *REAL_KINDS,
    },
}


@pytest.fixture(scope="module")
def kubectl() -> str:
    return hack_values(REPO / "hack" / "kubectl.sh", ("KUBECTL_BIN",), "kubectl")["KUBECTL_BIN"]


def _run(kubectl: str, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [kubectl, *args], input=stdin, capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_overlays_use_the_same_image() -> None:
    images = {
        entry: yaml.safe_load((REPO / entry / "kustomization.yaml").read_text())["images"]
        for entry in ENTRY_POINTS
    }
    assert len({yaml.safe_dump(v) for v in images.values()}) == 1, images


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_entry_point_applies_to_a_real_api_server(
    kubectl: str, make_apiserver: Callable[..., ApiServer], entry: str
) -> None:
    built = _run(kubectl, "kustomize", entry)
    docs = [d for d in yaml.safe_load_all(built) if d]
    assert {d["kind"] for d in docs} == EXPECTED[entry]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    (image,) = {c["image"] for w in workloads for c in w["spec"]["template"]["spec"]["containers"]}
    want = yaml.safe_load((REPO / "config" / "kustomization.yaml").read_text())["images"][0]
    assert image == f"{want['newName']}:{want['newTag']}"
    for ds in (d for d in workloads if d["kind"] == "DaemonSet"):
        nvml = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "nvidia-ml"]
        assert nvml[0]["hostPath"]["path"].endswith("libnvidia-ml.so.1")

    srv = make_apiserver()
    kubeconfig = srv.kubeconfig_path()
    real = [d for d in docs if d["kind"] in REAL_KINDS]
    crds = [d for d in real if d["kind"] == "CustomResourceDefinition"]
    out = _run(kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-",
               stdin=yaml.safe_dump_all(crds + [d for d in real if d not in crds]))  # fmt: skip
    assert out.count("created") == len(real), out
    dry = _run(kubectl, "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "-k", entry)
    lines = [ln for ln in dry.splitlines() if ln.strip()]
    assert len(lines) == len(docs), dry
    assert all("(server dry run)" in ln for ln in lines), dry
    # The real parts exist now; the workloads were validated but not created.
    got = _run(kubectl, "--kubeconfig", kubeconfig, "get", "-n", "koordinator-system",
               "serviceaccounts,deployments,daemonsets", "-o", "name")  # fmt: skip
    assert not [ln for ln in got.splitlines() if "deployment" in ln or "daemonset" in ln]
    for sa in (d for d in real if d["kind"] == "ServiceAccount"):
        assert f"serviceaccount/{sa['metadata']['name']}" in got
