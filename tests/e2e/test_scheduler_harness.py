"""Helpers of the scheduler's end-to-end tests (no tests here): a raw JSON client for test set-up
and checks, GPU node/pod builders, and ``SchedulerProcess`` (``koord-scheduler run`` as a real
subprocess with its own config file, log file and HTTP port).

The client is deliberately independent of the code under test: plain urllib3 + JSON.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import urllib3
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "scheduling.koordinator.sh", "v1alpha1", "devices"
DEVICES = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
ALLOCATED = "scheduling.koordinator.sh/device-allocated"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_RATIO = "koordinator.sh/gpu-memory-ratio"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GIB = 1024**3

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def wait_https_ready(
    what: str, port: int, cafile: Path, timeout: float, alive: Callable[[], None] = lambda: None
) -> None:
    """Poll ``https://127.0.0.1:port/readyz`` (server certificate checked against ``cafile``)
    until it answers 200; ``alive`` may fail the wait early (a server that exited)."""
    ctx = ssl.create_default_context(cafile=str(cafile))

    def ready() -> bool:
        alive()
        try:
            url = f"https://127.0.0.1:{port}/readyz"
            with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(what, ready, timeout=timeout)


class KubeError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status


class Kube:
    """Raw JSON access to the API server with one bearer token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._pool = urllib3.PoolManager(cert_reqs="CERT_NONE", assert_hostname=False, maxsize=16)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """One request; ``body`` is JSON-encoded unless it is already ``bytes``."""
        text = self.request_text(method, path, body, content_type)
        return json.loads(text) if text else {}

    def request_text(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> str:
        """The answer's text, undecoded (an object nested deeper than ``json`` can read)."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = self._pool.request(method, self.url + path, body=data, headers=headers, timeout=30)
        text = resp.data.decode()
        if resp.status >= 300:
            raise KubeError(resp.status, text)
        return str(text)

    def get(self, path: str) -> dict[str, Any]:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path, {"gracePeriodSeconds": 0})
        except KubeError as exc:
            if exc.status != 404:
                raise

    # -- objects ----------------------------------------------------------------------------

    def ensure_namespace(self, name: str) -> str:
        try:
            self.post("/api/v1/namespaces", {"metadata": {"name": name}})
        except KubeError as exc:
            if exc.status != 409:
                raise
        return name

    def ensure_device_crd(self, replace: bool = False) -> None:
        """The Device CRD of config/crd (created if absent; other tests may have made one)."""
        crd = yaml.safe_load(
            (REPO_ROOT / "config/crd/devices.scheduling.koordinator.sh.yaml").read_text()
        )
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        try:
            self.post(path, crd)
        except KubeError as exc:
            if exc.status != 409:
                raise
        wait_for(
            "the Device CRD to be served",
            lambda: self._devices_served(),
            timeout=30,
        )

    def _devices_served(self) -> bool:
        try:
            self.get(DEVICES)
            return True
        except KubeError:
            return False

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.get(f"/api/v1/namespaces/{namespace}/pods")["items"])

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.get(f"/api/v1/namespaces/{namespace}/events")["items"])

    def create_pods(
        self, namespace: str, pods: Iterable[Mapping[str, Any]], threads: int = 8
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        path = f"/api/v1/namespaces/{namespace}/pods"
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda p: self.post(path, p), pods))

    def add_gpu_node(
        self,
        name: str,
        gpus: int = 4,
        memory: str = "80Gi",
        labels: Mapping[str, str] | None = None,
        unhealthy: Iterable[int] = (),
    ) -> None:
        """A Node advertising the GPUs as extended resources, untainted, plus its Device CR."""
        mem_bytes = int(memory.removesuffix("Gi")) * GIB
        alloc = {
            "cpu": "64",
            "memory": "512Gi",
            "pods": "500",
            GPU_CORE: str(100 * gpus),
            GPU_RATIO: str(100 * gpus),
            GPU_MEMORY: str(mem_bytes * gpus),
            "nvidia.com/gpu": str(gpus),
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "status": {"capacity": alloc, "allocatable": alloc},
        }
        self.post("/api/v1/nodes", node)
        # The API server's admission adds node.kubernetes.io/not-ready; no kubelet clears it here.
        self.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
        bad = set(unhealthy)
        device = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Device",
            "metadata": {"name": name},
            "spec": {
                "devices": [
                    {
                        "type": "gpu",
                        "id": f"GPU-{name}-{m}",
                        "minor": m,
                        "health": m not in bad,
                        "resources": {GPU_CORE: "100", GPU_MEMORY: memory, GPU_RATIO: "100"},
                    }
                    for m in range(gpus)
                ]
            },
        }
        self.post(DEVICES, device)

    def remove_node(self, name: str) -> None:
        self.delete(f"/api/v1/nodes/{name}")
        self.delete(f"{DEVICES}/{name}")


def gpu_pod(
    name: str,
    scheduler: str,
    limits: Mapping[str, str],
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod asking for device resources (extended resources: limits = requests)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": dict(limits)}}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def shared_gpu(name: str, scheduler: str, percent: int, **kw: Any) -> dict[str, Any]:
    return gpu_pod(name, scheduler, {GPU_CORE: str(percent), GPU_RATIO: str(percent)}, **kw)


def card_load(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], dict[str, int]]:
    """(node, minor) -> summed gpu-core and gpu-memory-ratio of the bound pods' annotations."""
    load: dict[tuple[str, int], dict[str, int]] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        text = (pod["metadata"].get("annotations") or {}).get(ALLOCATED)
        if not node or not text:
            continue
        for alloc in json.loads(text).get("gpu", []):
            card = load.setdefault((node, alloc["minor"]), {GPU_CORE: 0, GPU_RATIO: 0})
            for res in (GPU_CORE, GPU_RATIO):
                card[res] += int(alloc["resources"].get(res, "0"))
    return load


def condition(pod: Mapping[str, Any], kind: str = "PodScheduled") -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def go_kube_scheduler(
    go_bin: str,
    config: Mapping[str, Any],
    work: Path,
    legacy: bool,
) -> subprocess.Popen[bytes]:
    """Start Go kube-scheduler with ``config`` (a KubeSchedulerConfiguration without its
    apiVersion), as the version at hand wants it: v1.20 (``legacy``) reads
    ``kubescheduler.config.k8s.io/v1beta1`` and serves health on a bind address of the file
    (``--port=0`` turns its insecure port off); v1.37 reads ``v1``, has neither those fields nor
    ``--port``, and serves health only on ``--secure-port`` (0 here: nothing is served).
    Output goes to ``work/kube-scheduler.log``."""
    cfg = dict(config)
    cfg["apiVersion"] = "kubescheduler.config.k8s.io/" + ("v1beta1" if legacy else "v1")
    cfg.setdefault("kind", "KubeSchedulerConfiguration")
    if legacy:
        port = free_port()
        cfg["healthzBindAddress"] = cfg["metricsBindAddress"] = f"127.0.0.1:{port}"
    path = work / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(cfg))
    flags = ["--port=0", "--secure-port=0"] if legacy else ["--secure-port=0"]
    with open(work / "kube-scheduler.log", "ab") as log:
        return subprocess.Popen(
            [go_bin, f"--config={path}", *flags, "--v=1"],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def scheduler_config(
    path: Path,
    scheduler: str,
    *,
    lease: str = "",
    namespace: str = "default",
    durations: tuple[str, str, str] = ("4s", "3s", "1s"),
) -> Path:
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 2,
        "leaderElection": {"leaderElect": bool(lease)},
        "profiles": [{"schedulerName": scheduler}],
    }
    if lease:
        cfg["leaderElection"].update(
            resourceName=lease,
            resourceNamespace=namespace,
            leaseDuration=durations[0],
            renewDeadline=durations[1],
            retryPeriod=durations[2],
        )
    path.write_text(yaml.safe_dump(cfg))
    return path


class SchedulerProcess:
    """``koord-scheduler run`` (or ``command``) as a subprocess; JSON logs go to ``log_path``."""

    def __init__(
        self,
        kubeconfig: str,
        config: Path,
        workdir: Path,
        *,
        identity: str | None = None,
        extra_args: Iterable[str] = (),
        command: str = "run",
    ) -> None:
        self.identity = identity or uid("sched")
        self.port = free_port()
        self.log_path = workdir / f"{self.identity}.log"
        self.args = [
            sys.executable,
            "-m",
            "scheduler.cli",
            command,
            f"--kubeconfig={kubeconfig}",
            f"--config={config}",
            "--bind-address=127.0.0.1",
            # Plain HTTP (insecure, opt-in) is what the harness scrapes; no secure port, so
            # replicas never contend for 10259 (a test wanting it passes --secure-port).
            f"--port={self.port}",
            "--secure-port=0",
            f"--identity={self.identity}",
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SchedulerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # faulthandler: a SIGABRT (the chaos tier's answer to a replica that overran
                # its grace period) writes every thread's stack to the log before it dies.
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
            )
        finally:
            log.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    # -- HTTP -------------------------------------------------------------------------------

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if not self.running:
                raise AssertionError(f"scheduler exited:\n{self.log_tail()}")
            return self.http("/readyz")[0] == 200

        try:
            wait_for("/readyz", ready, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tail()}") from None

    def metrics(self) -> dict[str, Any]:
        code, text = self.http("/metrics")
        assert code == 200, text
        return {f.name: f for f in text_string_to_metric_families(text)}

    # -- logs -------------------------------------------------------------------------------

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        try:
            text = self.log_path.read_text()
        except OSError:
            return []
        for line in text.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def events_named(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.log_lines() if line.get("event") == event]

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"
