"""The v1.37.2 control plane built by ``hack/kube-1.37.sh`` works as a control plane.

Every binary reports its version; etcd v3.7.3 + kube-apiserver v1.37.2 start through the same
``ApiServer`` harness as the 1.20 tier (TLS + bearer tokens: 1.37 has no insecure port) and
answer ``/version`` and ``resource.k8s.io/v1`` discovery; with kube-controller-manager and
kube-scheduler v1.37.2 beside them, a namespace is finalized (namespace controller), a dependent
is collected (garbage collector), and a pod asking for a device through a
ResourceClaimTemplate gets its claim (resourceclaim controller), the device allocated from a
ResourceSlice and a node (kube-scheduler's DynamicResources plugin).

The binaries are never built here (``make kube-1.37``); absent, the module skips with one
line, or fails under ``CI``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apiserver import ApiServer
from test_scheduler_harness import Kube, KubeError, free_port, wait_for

pytestmark = pytest.mark.e2e

VERSION = "v1.37.2"
ETCD_VERSION = "3.7.3"
DRIVER = "gpu.smoke.example.com"
CONTROLLERS = "namespace-controller,garbage-collector-controller,resourceclaim-controller"


class Component:
    """kube-controller-manager or kube-scheduler against ``srv``, serving /healthz on a free
    loopback port; ``stop()`` terminates its process group."""

    def __init__(self, binary: str, srv: ApiServer, work: Path, *args: str) -> None:
        self.name = Path(binary).name
        self.port = free_port()
        kubeconfig = srv.kubeconfig_path()
        cert_dir = work / f"{self.name}-certs"
        cert_dir.mkdir()
        self.log = work / f"{self.name}.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    # No --authentication/authorization-kubeconfig: /healthz is always allowed,
                    # and without a client CA the server publishes no
                    # extension-apiserver-authentication ConfigMap for them to read.
                    f"--kubeconfig={kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.port}",
                    f"--cert-dir={cert_dir}",
                    "--leader-elect=false",
                    "--v=1",
                    *args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/healthz", timeout=2, context=ctx
            ) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def plane(kube137_binaries: dict[str, str]) -> Iterator[tuple[ApiServer, Kube]]:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler, all v1.37 / v3.7."""
    srv = ApiServer(
        kube137_binaries["KUBE_APISERVER_BIN"],
        kube137_binaries["ETCD_BIN"],
        startup_timeout=120.0,  # a cold 1.37 server on two busy cores
    ).start()
    components: list[Component] = []
    work = Path(tempfile.mkdtemp(prefix="koord-plane137-"))
    try:
        components.append(
            Component(
                kube137_binaries["KUBE_CONTROLLER_MANAGER_BIN"],
                srv,
                work,
                f"--controllers={CONTROLLERS}",
                "--use-service-account-credentials=false",
            )
        )
        components.append(Component(kube137_binaries["KUBE_SCHEDULER_BIN"], srv, work))
        for c in components:
            wait_for(f"{c.name} /healthz", c.healthy, timeout=120)
        yield srv, Kube(srv.url, srv.admin_token)
    finally:
        for c in components:
            c.stop()
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("KUBE_APISERVER_BIN", f"Kubernetes {VERSION}"),
        ("KUBE_CONTROLLER_MANAGER_BIN", f"Kubernetes {VERSION}"),
        ("KUBE_SCHEDULER_BIN", f"Kubernetes {VERSION}"),
        ("ETCD_BIN", f"etcd Version: {ETCD_VERSION}"),
    ],
)
def test_each_binary_reports_its_version(
    kube137_binaries: dict[str, str], key: str, expected: str
) -> None:
    out = subprocess.run(
        [kube137_binaries[key], "--version"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout.splitlines()[0], out.stdout


def test_the_server_reports_v1_37_2_and_serves_resource_v1(plane: tuple[ApiServer, Kube]) -> None:
    _, kube = plane
    version = kube.get("/version")
    assert (version["gitVersion"], version["major"], version["minor"]) == (VERSION, "1", "37")
    resources = {r["name"] for r in kube.get("/apis/resource.k8s.io/v1")["resources"]}
    assert {"resourceclaims", "resourceslices", "deviceclasses"} <= resources, resources
    group = kube.get("/apis/resource.k8s.io")
    assert group["preferredVersion"]["version"] == "v1"


def test_a_deleted_namespace_is_finalized(plane: tuple[ApiServer, Kube]) -> None:
    _, kube = plane
    kube.ensure_namespace("smoke-ns-gone")
    kube.post(
        "/api/v1/namespaces/smoke-ns-gone/configmaps",
        {"metadata": {"name": "content"}, "data": {"k": "v"}},
    )
    kube.delete("/api/v1/namespaces/smoke-ns-gone")
    wait_for(
        "namespace smoke-ns-gone to be finalized",
        lambda: _gone(kube, "/api/v1/namespaces/smoke-ns-gone"),
        timeout=90,
    )


def test_a_dependent_is_collected_with_its_owner(plane: tuple[ApiServer, Kube]) -> None:
    _, kube = plane
    ns = kube.ensure_namespace("smoke-gc")
    base = f"/api/v1/namespaces/{ns}/configmaps"
    owner = kube.post(base, {"metadata": {"name": "owner"}})
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    kube.post(base, {"metadata": {"name": "dependent", "ownerReferences": [ref]}})
    kube.delete(f"{base}/owner")
    wait_for(
        "the dependent ConfigMap to be collected",
        lambda: _gone(kube, f"{base}/dependent"),
        timeout=90,
    )


def test_a_pod_gets_its_claim_a_device_and_a_node(plane: tuple[ApiServer, Kube]) -> None:
    _, kube = plane
    ns = kube.ensure_namespace("smoke-dra")
    kube.post("/api/v1/nodes", _node("smoke-n1"))
    # Admission (TaintNodesByCondition) adds node.kubernetes.io/not-ready; no kubelet clears it.
    kube.patch("/api/v1/nodes/smoke-n1", {"spec": {"taints": None}})
    kube.post(
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
    )
    kube.post(
        "/apis/resource.k8s.io/v1/resourceslices",
        {
            "metadata": {"name": "smoke-n1-gpus"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "smoke-n1",
                "pool": {"name": "smoke-n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "h200"}}}],
            },
        },
    )
    kube.post(
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
        {
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                }
            },
        },
    )
    kube.post(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/pause",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        },
    )

    def bound() -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/trainer")
        return pod if pod["spec"].get("nodeName") else None

    pod = wait_for("the pod to be bound", bound, timeout=120)
    assert pod["spec"]["nodeName"] == "smoke-n1"
    statuses = pod["status"]["resourceClaimStatuses"]
    assert [s["name"] for s in statuses] == ["gpu"]
    claim = kube.get(
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["device"], r["request"]) for r in results] == [
        (DRIVER, "smoke-n1", "gpu-0", "gpu")
    ]
    assert [c["name"] for c in claim["status"]["reservedFor"]] == ["trainer"]


def _gone(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except KubeError as exc:
        if exc.status == 404:
            return True
        raise
    return False


def _node(name: str) -> dict[str, Any]:
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }
