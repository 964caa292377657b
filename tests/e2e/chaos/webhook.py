"""koord-webhook in the chaos tier: one ``koord-scheduler webhook serve`` process registered
with the shipped webhook configurations, killed, restarted and frozen by the fault schedule,
and the workload user's forgeries of allocations.

``ChaosWebhook`` makes its certificate with ``koord-scheduler webhook certs`` (loopback IP in
the SANs), registers config/webhook/configurations.yaml with each webhook's service reference
swapped for ``https://127.0.0.1:<port><path>`` (everything else as shipped: rules, selectors,
failurePolicy, timeoutSeconds), and sends GPU pods that name no scheduler to the tier's
scheduler; the replicas' API users are the allocation writers.

``Forger`` is the ordinary workload user trying what the guard exists to stop: a pod created
with ``spec.nodeName`` and a device-allocated claim on a card, and a device-allocated patched
onto a live pod (``pods`` and ``pods/status``). Every answer is recorded; any 2xx is a forgery
admitted.
"""

from __future__ import annotations

import copy
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.test_scheduler_harness import (
    ALLOCATED,
    REPO_ROOT,
    Kube,
    KubeError,
    free_port,
    wait_for,
    wait_https_ready,
)

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
FORGED_PREFIX = "forged-"
CLAIM = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100",'
    '"koordinator.sh/gpu-memory-ratio":"100"}}]}'
)
NEGATIVE = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-100",'
    '"koordinator.sh/gpu-memory-ratio":"-100"}}]}'
)


class ChaosWebhook:
    def __init__(self, workdir: Path, scheduler_name: str, writers: list[str]) -> None:
        self.workdir = workdir
        self.certs = workdir / "webhook-certs"
        made = subprocess.run(
            [sys.executable, "-m", "scheduler.cli", "webhook", "certs", f"--out={self.certs}",
             "--host=127.0.0.1"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        self.ca_bundle = made.stdout.strip()
        self.scheduler_name = scheduler_name
        self.port = free_port()
        self.args = [
            sys.executable, "-m", "scheduler.cli", "webhook", "serve",
            "--bind-address=127.0.0.1", f"--port={self.port}",
            f"--tls-cert-file={self.certs / 'tls.crt'}",
            f"--tls-private-key-file={self.certs / 'tls.key'}",
            f"--scheduler-name={scheduler_name}",
            f"--allocation-writers={','.join(writers)}", "--shutdown-grace=2s",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.starts = 0
        self.outages = 0

    @property
    def log(self) -> Path:
        return self.workdir / f"webhook-{self.starts}.log"

    def start(self) -> ChaosWebhook:
        with self.lock:
            self.starts += 1
            with open(self.log, "ab") as sink:
                self.proc = subprocess.Popen(
                    self.args, cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT
                )
        wait_https_ready("the webhook's /readyz", self.port, self.certs / "ca.crt", timeout=60)
        return self

    def signal(self, sig: signal.Signals) -> None:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(15)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def register(self, admin: Kube, user: Kube, namespace: str) -> None:
        """The shipped configurations, pointed at this process; returns once the API server
        calls them (a dry-run GPU pod of ``user`` in ``namespace`` gets the scheduler's name)."""
        path = REPO_ROOT / "config/webhook/configurations.yaml"
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            doc = copy.deepcopy(doc)
            for hook in doc["webhooks"]:
                route = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{self.port}{route}",
                    "caBundle": self.ca_bundle,
                }
            admin.post(f"{ADMISSION}/{doc['kind'].lower()}s", doc)
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "webhook-probe"},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }  # fmt: skip

        def mutated() -> bool:
            try:
                made = user.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
            except KubeError:
                return False
            return bool(made["spec"].get("schedulerName") == self.scheduler_name)

        wait_for("the API server to call the webhooks", mutated, timeout=60)


class Forger:
    """The workload's ordinary user forging allocations (see the module doc)."""

    def __init__(self, user: Kube, namespace: str, nodes: list[str], rng: random.Random) -> None:
        self.user = user
        self.ns = namespace
        self.nodes = nodes
        self.rng = rng
        self.serial = 0
        self.answers: Counter[int] = Counter()
        self.admitted: list[str] = []

    def _try(self, what: str, fn: Any) -> None:
        try:
            fn()
        except KubeError as exc:
            self.answers[exc.status] += 1
        except Exception:  # the API server restarting
            self.answers[0] += 1
        else:
            self.answers[201] += 1
            self.admitted.append(what)

    def attempt(self, live: list[str]) -> None:
        self.serial += 1
        name = f"{FORGED_PREFIX}{self.serial:04d}"
        node = self.rng.choice(self.nodes)
        claim = self.rng.choice((CLAIM, NEGATIVE))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": {ALLOCATED: claim}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }
        self._try(f"create {name} on {node}", lambda: self.user.post(
            f"/api/v1/namespaces/{self.ns}/pods", pod))  # fmt: skip
        if live:
            victim = self.rng.choice(live)
            sub = self.rng.choice(("", "/status"))
            body = {"metadata": {"annotations": {ALLOCATED: claim}}}
            self._try(f"patch {victim}{sub}", lambda: self.user.patch(
                f"/api/v1/namespaces/{self.ns}/pods/{victim}{sub}", body))  # fmt: skip

    def during(self, seconds: float, live: Any) -> None:
        """Attempts every ~0.5 s for ``seconds`` (``live()``: names of live pods)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.attempt(live())
            time.sleep(0.5)
