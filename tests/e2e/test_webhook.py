"""koord-webhook on a real kube-apiserver v1.20.2: the shipped webhook configurations
(config/webhook/configurations.yaml, their service reference swapped for a loopback URL)
registered against a running ``koord-scheduler webhook serve`` over TLS, with the certificate
and caBundle of ``koord-scheduler webhook certs``, and ``koord-scheduler run`` scheduling.

Proved here, in order (one API server for the module; the outage test comes last):
- the pod of a Deployment's template without ``schedulerName`` gets koord-scheduler's and is
  bound with its cards (this tier has no controller-manager: the test creates the pod the
  ReplicaSet controller would, from the Deployment's template, owned by it);
- an invalid device request is refused at create with the container and the scheduler's message;
- a user without the scheduler's identity can neither create a pod carrying device-allocated
  nor patch one on (cluster admins included); the scheduler's binding still writes it;
- with the webhook process stopped: pod writes in covered namespaces are refused (mutate and
  guard fail closed), the opted-out namespace of the components is unaffected, a pending pod
  is still bound (pods/binding is not intercepted); after a restart everything is back.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    GPU_CORE,
    REPO_ROOT,
    Kube,
    KubeError,
    SchedulerProcess,
    free_port,
    gpu_pod,
    scheduler_config,
    wait_for,
    wait_https_ready,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

SCHED_USER = "system:serviceaccount:koordinator-system:koord-scheduler"
SA_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:koordinator-system"]
NS = "team-a"
SYSTEM_NS = "koordinator-system"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
PODS = f"/api/v1/namespaces/{NS}/pods"
NEGATIVE = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-100"}}]}'


class WebhookProcess:
    """``koord-scheduler webhook serve`` on a loopback port, JSON logs in ``log``."""

    def __init__(self, certs: Path, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "webhook.log"
        self.certs = certs
        self.args = [
            sys.executable, "-m", "scheduler.cli", "webhook", "serve",
            "--bind-address=127.0.0.1", f"--port={self.port}",
            f"--tls-cert-file={certs / 'tls.crt'}", f"--tls-private-key-file={certs / 'tls.key'}",
            f"--allocation-writers={SCHED_USER}", "--shutdown-grace=2s",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WebhookProcess:
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen(
                self.args, cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT
            )
        def alive() -> None:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()

        wait_https_ready(
            "the webhook's /readyz", self.port, self.certs / "ca.crt", timeout=30, alive=alive
        )
        return self

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


@dataclass
class Env:
    server: ApiServer
    admin: Kube
    user: Kube
    webhook: WebhookProcess
    scheduler: SchedulerProcess


def _register(admin: Kube, port: int, ca_bundle: str) -> None:
    """The shipped configurations, pointed at the loopback process."""
    docs = [d for d in yaml.safe_load_all((REPO_ROOT / "config/webhook/configurations.yaml")
            .read_text()) if d]  # fmt: skip
    for doc in docs:
        doc = copy.deepcopy(doc)
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
        plural = doc["kind"].lower() + "s"
        admin.post(f"{ADMISSION}/{plural}", doc)


def _mutated(admin: Kube) -> bool:
    probe = gpu_pod("probe", "default-scheduler", {"nvidia.com/gpu": "1"})
    try:
        made = admin.post(f"/api/v1/namespaces/{NS}/pods?dryRun=All", probe)
    except KubeError:
        return False
    return bool(made["spec"]["schedulerName"] == "koord-scheduler")


@pytest.fixture(scope="module")
def env(kube_binaries: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from apiserver import ApiServer

    tmp = tmp_path_factory.mktemp("webhook")
    server = ApiServer(*kube_binaries, extra_users={SCHED_USER: SA_GROUPS}).start()
    webhook = scheduler = None
    try:
        admin = Kube(server.url, server.admin_token)
        certs = tmp / "certs"
        made = subprocess.run(
            [sys.executable, "-m", "scheduler.cli", "webhook", "certs", f"--out={certs}",
             "--host=127.0.0.1"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        ca_bundle = made.stdout.strip()
        # The components' namespace as shipped (labelled out of the webhook's scope).
        rbac = yaml.safe_load_all((REPO_ROOT / "config/scheduler/rbac.yaml").read_text())
        admin.post("/api/v1/namespaces", next(d for d in rbac if d and d["kind"] == "Namespace"))
        admin.ensure_namespace(NS)
        admin.ensure_device_crd()
        admin.add_gpu_node("gpu-0", gpus=2)
        webhook = WebhookProcess(certs, tmp).start()
        _register(admin, webhook.port, ca_bundle)
        wait_for("the webhooks to be called", lambda: _mutated(admin), timeout=30)
        cfg = scheduler_config(tmp / "sched.yaml", "koord-scheduler")
        kubeconfig = server.kubeconfig_path(server.token_for(SCHED_USER))
        scheduler = SchedulerProcess(kubeconfig, cfg, tmp).start()
        scheduler.wait_ready()
        yield Env(server, admin, Kube(server.url, server.user_token), webhook, scheduler)
    finally:
        for proc in (scheduler, webhook):
            if proc is not None:
                proc.stop()
        server.stop()


def _refused(server: ApiServer, token: str, method: str, path: str, body: Any) -> tuple[int, str]:
    """(status, Status.message) of a write the API server refuses (full message, untruncated)."""
    import urllib3

    ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
    resp = urllib3.PoolManager(cert_reqs="CERT_NONE").request(
        method, server.url + path, body=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": ctype}, timeout=30,
    )  # fmt: skip
    assert resp.status >= 400, resp.data[:300]
    return resp.status, str(json.loads(resp.data)["message"])


def _bound(admin: Kube, ns: str, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pod = admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return pod if pod["spec"].get("nodeName") else None

    return dict(wait_for(f"{ns}/{name} to be bound", bound, timeout=30))


def test_a_deployments_gpu_pod_goes_to_koord_scheduler(env: Env) -> None:
    template = {
        "metadata": {"labels": {"app": "train"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "cuda", "image": "busybox",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }  # fmt: skip
    deploy = env.admin.post(
        f"/apis/apps/v1/namespaces/{NS}/deployments",
        {
            "metadata": {"name": "train"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "train"}},
                     "template": template},
        },
    )  # fmt: skip
    assert "schedulerName" not in deploy["spec"]["template"]["spec"] or (
        deploy["spec"]["template"]["spec"]["schedulerName"] == "default-scheduler"
    )
    pod = copy.deepcopy(template)
    pod["metadata"].update(
        generateName="train-",
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "Deployment", "name": "train",
                          "uid": deploy["metadata"]["uid"], "controller": True}],
    )  # fmt: skip
    made = env.admin.post(f"/api/v1/namespaces/{NS}/pods", pod)
    assert made["spec"]["schedulerName"] == "koord-scheduler"
    bound = _bound(env.admin, NS, made["metadata"]["name"])
    assert bound["spec"]["nodeName"] == "gpu-0"
    cards = json.loads(bound["metadata"]["annotations"][ALLOCATED])["gpu"]
    assert len(cards) == 1 and cards[0]["resources"][GPU_CORE] == "100"


def test_an_invalid_pod_is_refused_at_create(env: Env) -> None:
    bad = gpu_pod("bad", "", {GPU_CORE: "30"})
    status, message = _refused(env.server, env.server.user_token, "POST", PODS, bad)
    assert status == 400
    assert message == (
        'admission webhook "validate.pods.koordinator.sh" denied the request: '
        "spec.containers[0] (main).resources: invalid resource device requests: "
        "[koordinator.sh/gpu-core]"
    )
    assert "bad" not in {p["metadata"]["name"] for p in env.admin.pods(NS)}


def test_only_the_scheduler_writes_allocations(env: Env) -> None:
    forged = gpu_pod("forged", "koord-scheduler", {"cpu": "100m"})
    forged["metadata"]["annotations"] = {ALLOCATED: NEGATIVE}
    forged["spec"]["nodeName"] = "gpu-0"
    guard = 'admission webhook "guard.pods.koordinator.sh" denied the request: '
    for token, user in ((env.server.user_token, "koord-user"), (env.server.admin_token,
                        "koord-admin")):  # fmt: skip
        status, message = _refused(env.server, token, "POST", PODS, forged)
        assert (status, message) == (403, guard + f"metadata.annotations[{ALLOCATED}]: user "
                f'"{user}" sets a device allocation; only koord-scheduler (through '
                "pods/binding) and the node agent write allocations"), message  # fmt: skip
    # Patching it onto (or off) an existing pod, the one the scheduler bound, is refused too.
    pods = [p for p in env.admin.pods(NS) if p["spec"].get("nodeName")]
    target = f"{PODS}/{pods[0]['metadata']['name']}"
    before = env.admin.get(target)["metadata"]["annotations"][ALLOCATED]
    for value in (NEGATIVE, None):
        patch = {"metadata": {"annotations": {ALLOCATED: value}}}
        status, message = _refused(env.server, env.server.user_token, "PATCH", target, patch)
        assert status == 403 and message.startswith(guard), message
    assert env.admin.get(target)["metadata"]["annotations"][ALLOCATED] == before
    # Other edits of the same pod pass; the scheduler's binding writes allocations.
    env.user.patch(target, {"metadata": {"labels": {"edited": "yes"}}})
    shared = gpu_pod("shared", "", {GPU_CORE: "50", "koordinator.sh/gpu-memory-ratio": "50"})
    env.user.post(PODS, shared)
    bound = _bound(env.admin, NS, "shared")
    assert bound["spec"]["schedulerName"] == "koord-scheduler"
    cards = json.loads(bound["metadata"]["annotations"][ALLOCATED])["gpu"]
    assert cards[0]["resources"][GPU_CORE] == "50"


def test_with_the_webhook_down_pod_writes_fail_closed(env: Env) -> None:
    # A pod that cannot fit yet: it is bound during the outage, once its node appears.
    env.user.post(f"/api/v1/namespaces/{NS}/pods",
                  gpu_pod("later", "", {"nvidia.com/gpu": "1"}, {"pool": "late"}))  # fmt: skip
    assert env.webhook.stop() == 0
    try:
        with pytest.raises(KubeError) as refused:
            env.user.post(f"/api/v1/namespaces/{NS}/pods", gpu_pod("down", "", {"cpu": "1"}))
        assert refused.value.status == 500 and "failed calling webhook" in str(refused.value)
        with pytest.raises(KubeError) as refused:
            env.user.patch(
                f"/api/v1/namespaces/{NS}/pods/shared", {"metadata": {"labels": {"x": "y"}}}
            )
        assert "failed calling webhook" in str(refused.value)
        # The components' own namespace never depends on the webhook.
        env.admin.post(f"/api/v1/namespaces/{SYSTEM_NS}/pods",
                       gpu_pod("component", "default-scheduler", {"cpu": "1"}))  # fmt: skip
        # Scheduling goes on: the binding subresource is not intercepted.
        env.admin.add_gpu_node("gpu-1", gpus=1, labels={"pool": "late"})
        bound = _bound(env.admin, NS, "later")
        assert (
            bound["spec"]["nodeName"] == "gpu-1" and ALLOCATED in bound["metadata"]["annotations"]
        )
    finally:
        env.webhook.start()
    wait_for("the webhooks to answer again", lambda: _mutated(env.admin), timeout=30)
    made = env.user.post(f"/api/v1/namespaces/{NS}/pods", gpu_pod("after", "", {"cpu": "1"}))
    assert made["metadata"]["name"] == "after"
