"""Every install entry point (``config/``, ``config/overlays/*``) built by Debian's kubectl 1.20
(``kubernetes-client``, via ``hack/kubectl.sh``; its embedded kustomize is v2.0.3) and applied
to a real kube-apiserver: the CRD, Namespace and RBAC parts for real, then every manifest with
``--dry-run=server`` (server-side validation and defaulting of each object). A broken manifest,
a kustomization the old kustomize cannot build, or overlays whose image differs fail here.
A fresh API server is used: the real CRD must not replace the session's open-schema test CRD.

Kustomize versions: kubectl 1.20 builds every entry point without a line on stderr; a current
kustomize (a kubectl >= 1.21 or ``kustomize`` on PATH; skipped when there is none) builds the
same objects with no warning but the deprecation of ``bases``/``patchesStrategicMerge``, the two
fields v2.0.3 needs; and v2.0.3 refuses the newer spelling, which is why they stay.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
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


# --- kustomize versions ----------------------------------------------------------------------
# The files keep the spelling of kubectl 1.20's kustomize v2.0.3 (`bases:`,
# `patchesStrategicMerge:`); kustomize v4/v5 (kubectl >= 1.21) builds them the same, warning
# that those two fields are deprecated, and its spelling (directories under `resources:`,
# `patches:`) is refused by v2.0.3: no single form builds warning-free on both
# (docs/operations.md, "Kustomize versions").
DEPRECATED_BY_V5 = {"bases", "patchesStrategicMerge"}
_WARNING = re.compile(r"^# Warning: '(\w+)' is deprecated\. Please use '\w+' instead\.")


@functools.cache
def _current_kustomize() -> list[str] | None:
    """A kustomize v4+ build command: `kustomize build` on PATH, else a kubectl on PATH whose
    embedded kustomize is v4 or later (kubectl >= 1.21); None when neither is here."""
    if found := shutil.which("kustomize"):
        return [found, "build"]
    if found := shutil.which("kubectl"):
        proc = subprocess.run(
            [found, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60
        )
        version = (
            json.loads(proc.stdout).get("kustomizeVersion", "") if proc.returncode == 0 else ""
        )
        if re.match(r"v([4-9]|\d\d)\.", version):
            return [found, "kustomize"]
    return None


def _fields(kustomization_dir: Path) -> set[str]:
    """The top-level fields of a kustomization and of its bases, recursively."""
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if (kustomization_dir / name).is_file():
            doc = yaml.safe_load((kustomization_dir / name).read_text()) or {}
            break
    else:
        raise AssertionError(f"{kustomization_dir}: no kustomization file")
    fields = set(doc)
    for base in doc.get("bases", []):
        fields |= _fields((kustomization_dir / base).resolve())
    return fields


def _objects(built: str) -> list[str]:
    """The built objects, canonical: keys sorted, containers' `ports` by number (strategic-merge
    order differs between kustomize versions and means nothing)."""

    def canon(node: object) -> object:
        if isinstance(node, dict):
            out = {k: canon(v) for k, v in node.items()}
            ports = out.get("ports")
            if isinstance(ports, list):
                out["ports"] = sorted(ports, key=lambda p: json.dumps(p, sort_keys=True))
            return out
        if isinstance(node, list):
            return [canon(v) for v in node]
        return node

    return sorted(json.dumps(canon(d), sort_keys=True) for d in yaml.safe_load_all(built) if d)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_entry_point_builds_without_warnings_on_1_20_and_only_the_documented_ones_on_v5(
    kubectl: str, entry: str
) -> None:
    old = subprocess.run(
        [kubectl, "kustomize", entry], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert old.returncode == 0, old.stderr
    assert old.stderr == "", f"kubectl 1.20 kustomize {entry} warns:\n{old.stderr}"
    current = _current_kustomize()
    if current is None:
        pytest.skip("no kustomize v4+ here (a kubectl >= 1.21 or kustomize on PATH)")
    new = subprocess.run([*current, entry], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert new.returncode == 0, f"{' '.join(current)} {entry}:\n{new.stderr}"
    warned = set()
    for line in new.stderr.splitlines():
        m = _WARNING.match(line)
        assert m, f"{' '.join(current)} {entry}: an unexpected line on stderr: {line}"
        warned.add(m.group(1))
    used = _fields(REPO / entry)
    unexpected = warned - (DEPRECATED_BY_V5 & used)
    assert not unexpected, (
        f"{entry}: {' '.join(current)} warns that {sorted(unexpected)} is deprecated; only "
        f"{sorted(DEPRECATED_BY_V5)} (which kubectl 1.20 needs) may be"
    )
    assert _objects(new.stdout) == _objects(old.stdout), f"{entry}: the two kustomizes differ"


NEWER_SPELLING = {
    "a directory under resources": "resources:\n  - ../base\n",
    "patches": "resources:\n  - cm.yaml\npatches:\n  - path: patch.yaml\n",
}


@pytest.mark.parametrize("form", sorted(NEWER_SPELLING))
def test_kubectl_1_20_refuses_the_spelling_that_current_kustomize_wants(
    kubectl: str, tmp_path: Path, form: str
) -> None:
    """Why the files keep the deprecated fields: kustomize v5's spelling does not build on 1.20."""
    base, overlay = tmp_path / "base", tmp_path / "overlay"
    base.mkdir()
    overlay.mkdir()
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: '1'\n"
    (base / "kustomization.yaml").write_text("resources:\n  - cm.yaml\n")
    (base / "cm.yaml").write_text(cm)
    (overlay / "patch.yaml").write_text(cm.replace("'1'", "'2'"))
    (overlay / "kustomization.yaml").write_text(NEWER_SPELLING[form])
    shutil.copy(base / "cm.yaml", overlay / "cm.yaml")
    old = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True)
    assert old.returncode != 0, f"kubectl 1.20 now builds {form}: the files can move to it"
    current = _current_kustomize()
    if current is None:
        return
    new = subprocess.run([*current, str(overlay)], capture_output=True, text=True, timeout=120)
    assert new.returncode == 0 and new.stderr == "", new.stderr
