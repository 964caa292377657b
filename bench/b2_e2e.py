"""Benchmark B2 (BENCHMARKS.md): end to end against a real kube-apiserver.

1,000 nodes (plain Node objects plus Device CRs, B1's 8 mixed GPUs each), 5,000 pods created as
fast as the client allows (B1's GPU mix), ``koord-scheduler run`` as a separate process bound to
the API server over HTTPS. Reports pods/s from the first create to the last bind (seen on a
watch of the benchmark's own), the create rate alone, p50/p99 of
``scheduler_pod_scheduling_sli_duration_seconds`` (from its buckets, like PromQL's
``histogram_quantile``; exact counts) and of the attempt duration, and API writes per pod.

Usage: python bench/b2_e2e.py [--nodes 1000] [--pods 5000] [--threads 16]
                              [--scheduler-args "--kube-api-qps 1000 ..."]
Needs kube-apiserver v1.20.2 and etcd (hack/kube-apiserver.sh provides them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
from apiserver import ApiServer  # noqa: E402
from b1_throughput import device_obj, node_obj, pod_requests  # noqa: E402

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
NS = "bench"


class Client:
    def __init__(self, url: str, token: str, pool: int) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.pool = urllib3.PoolManager(cert_reqs="CERT_NONE", assert_hostname=False, maxsize=pool)

    def call(self, method: str, path: str, body: Any = None, ctype: str = "") -> dict[str, Any]:
        headers = dict(self.headers)
        if ctype:
            headers["Content-Type"] = ctype
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        resp = self.pool.request(method, self.url + path, body=data, headers=headers, timeout=60)
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {resp.data[:200]!r}")
        return json.loads(resp.data) if resp.data else {}


def binaries() -> tuple[str, str]:
    out = subprocess.run(
        ["bash", str(ROOT / "hack" / "kube-apiserver.sh")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return values["KUBE_APISERVER_BIN"], values["ETCD_BIN"]


def setup_cluster(c: Client, nodes: int, threads: int) -> float:
    start = time.perf_counter()
    crd = yaml.safe_load((ROOT / "config/crd/devices.scheduling.koordinator.sh.yaml").read_text())
    c.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    deadline = time.monotonic() + 30
    while True:
        try:
            c.call("GET", DEVICES)
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    c.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})

    def one(i: int) -> None:
        node = node_obj(i)
        node["status"]["capacity"] = node["status"]["allocatable"]
        c.call("POST", "/api/v1/nodes", node)
        c.call(
            "PATCH",
            f"/api/v1/nodes/{node['metadata']['name']}",
            {"spec": {"taints": None}},
            "application/merge-patch+json",
        )
        c.call("POST", DEVICES, device_obj(i))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(nodes)))
    return time.perf_counter() - start


class BindWatch(threading.Thread):
    """Counts pods of the namespace that have a nodeName, with the time of the last one."""

    def __init__(self, c: Client, expected: int) -> None:
        super().__init__(daemon=True)
        self.c, self.expected = c, expected
        self.bound: set[str] = set()
        self.last_bind = 0.0
        self.done = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        rv = self.c.call("GET", f"/api/v1/namespaces/{NS}/pods?limit=1")["metadata"][
            "resourceVersion"
        ]
        resp = self.c.pool.request(
            "GET",
            f"{self.c.url}/api/v1/namespaces/{NS}/pods?watch=1&resourceVersion={rv}",
            headers=self.c.headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=600),
        )
        self.ready.set()
        buf = b""
        for chunk in resp.stream(amt=None):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                obj = json.loads(line)["object"]
                if obj.get("spec", {}).get("nodeName"):
                    name = obj["metadata"]["name"]
                    if name not in self.bound:
                        self.bound.add(name)
                        self.last_bind = time.perf_counter()
                        if len(self.bound) >= self.expected:
                            self.done.set()
                            resp.release_conn()
                            return


def quantile(q: float, family: Any) -> tuple[float, int]:
    """histogram_quantile over the summed buckets of a family; (value, count)."""
    buckets: dict[float, float] = {}
    for s in family.samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
    les = sorted(buckets)
    total = buckets[les[-1]] if les else 0.0
    if not total:
        return 0.0, 0
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in les:
        if buckets[le] >= rank:
            if le == float("inf"):
                return prev_le, int(total)
            span = buckets[le] - prev_count
            frac = (rank - prev_count) / span if span else 1.0
            return prev_le + (le - prev_le) * frac, int(total)
        prev_le, prev_count = le, buckets[le]
    return les[-1], int(total)


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux), seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=16, help="pod-creating threads")
    parser.add_argument(
        "--scheduler-args",
        default="",
        help="extra arguments of koord-scheduler run (default: none, the defaults)",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    srv = ApiServer(*binaries()).start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        c = Client(srv.url, srv.admin_token, pool=args.threads + 4)
        setup_s = setup_cluster(c, args.nodes, args.threads)
        print(f"cluster: {args.nodes} nodes + Device CRs in {setup_s:.1f}s", flush=True)

        cfg = ROOT / "config" / "scheduler-config.yaml"
        port = 10251 + random.Random().randrange(1, 5000)
        log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "b2-scheduler.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "scheduler.cli", "run",
                f"--kubeconfig={srv.kubeconfig_path()}", f"--config={cfg}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--port={port}",
                "--log-level=warning", *shlex.split(args.scheduler_args),
            ],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("scheduler did not become ready (see b2-scheduler.log)")
            time.sleep(0.2)

        rng = random.Random(args.seed)
        bodies = []
        for i in range(args.pods):
            req = pod_requests(rng, "gpu")
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p-{i:05d}", "namespace": NS},
                "spec": {
                    "schedulerName": "koord-scheduler",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"requests": req, "limits": req}}
                    ],
                },
            }
            bodies.append(json.dumps(pod).encode())
        watch = BindWatch(c, args.pods)
        watch.start()
        watch.ready.wait(30)
        path = f"/api/v1/namespaces/{NS}/pods"
        first_create = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda b: c.call("POST", path, b), bodies))
        created = time.perf_counter()
        if not watch.done.wait(900):
            raise RuntimeError(f"only {len(watch.bound)} of {args.pods} pods bound")
        elapsed = watch.last_bind - first_create
        cpu_s = _cpu_seconds(proc.pid)
        fams = scrape(port)
        sli50, n = quantile(0.5, fams["scheduler_pod_scheduling_sli_duration_seconds"])
        sli99, _ = quantile(0.99, fams["scheduler_pod_scheduling_sli_duration_seconds"])
        att = fams["scheduler_scheduling_attempt_duration_seconds"]
        att50, _ = quantile(0.5, att)
        att99, _ = quantile(0.99, att)
        results = {
            s.labels["result"]: int(s.value)
            for s in fams["scheduler_schedule_attempts"].samples
            if s.name.endswith("_total")
        }
        print(
            json.dumps(
                {
                    "machine": f"{platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} cpus, {platform.python_version()}",
                    "nodes": args.nodes,
                    "pods": args.pods,
                    "scheduler_args": args.scheduler_args,
                    "create_s": round(created - first_create, 2),
                    "create_pods_per_s": round(args.pods / (created - first_create), 1),
                    "first_create_to_last_bind_s": round(elapsed, 2),
                    "pods_per_s": round(args.pods / elapsed, 1),
                    "sli_p50_s": round(sli50, 3),
                    "sli_p99_s": round(sli99, 3),
                    "sli_count": n,
                    "attempt_p50_ms": round(1000 * att50, 2),
                    "attempt_p99_ms": round(1000 * att99, 2),
                    "attempts": results,
                    "scheduler_cpu_s": round(cpu_s, 1),
                },
                indent=2,
            )
        )
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
