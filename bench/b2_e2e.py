"""Benchmark B2 (BENCHMARKS.md): koord-scheduler and Go kube-scheduler side by side.

Both schedulers run on the same workload against a real kube-apiserver (+ etcd) of each control
plane of ``--kube-versions`` (default both: v1.20.2 with Go kube-scheduler v1.20.2, v1.37.2 with
Go kube-scheduler v1.37.2), one after the other, each on a fresh API server, alternating which
goes first, for ``--rounds`` rounds. Nodes are B1's (64 cores, 512Gi, 8 GPUs as
``nvidia.com/gpu`` allocatable and a Device CR each). Workloads: ``backlog`` (all pods created
before the scheduler starts) and ``rate`` (pods created at ``--rate`` pods/s after the scheduler
is ready); pod kinds: ``gpu`` (``nvidia.com/gpu: 1``), ``cpu`` (cpu and memory only) and
``share`` (half a card through ``koordinator.sh/gpu-core``/``gpu-memory-ratio``; for koord's
figures, e.g. memory at 5,000 nodes x 50,000 pods). For each run it prints pods/s from the first
to the last bind (on a watch of its own; column ``pods/s``, the issue-29 harness's figure),
pods/s from the scheduler's process start to the last bind (``start/s``: start-up inside the
window), the time to the first bind (``1st bind``, from process start), the wall time from
process start to the last bind, the scheduler's CPU per bound pod (``/proc``; whole run, read
once its Event writes have settled), its CPU seconds at the first bind (``cpu@1st``: start-up)
and its CPU per pod after the first bind (``ms/pod>1st``), the scheduling SLI p50/p99 from the
scheduler's own /metrics (koord: ``scheduler_pod_scheduling_sli_duration_seconds``, as Go
v1.37's; Go v1.20: ``scheduler_pod_scheduling_duration_seconds``), the API writes per pod (the
API server's ``apiserver_request_total`` for write verbs, less the benchmark's own), and the
ratio koord/Go of pods/s. Afterwards it checks that no GPU card is over-committed (koord: the
summed device-allocated annotations per card; Go: ``nvidia.com/gpu`` per node).

Both get the same client QPS/burst (``--qps``/``--burst``, default 5000/10000: high enough
not to bind either) and the same ``percentageOfNodesToScore`` (``--percentage``, default 0,
kube-scheduler's adaptive rule, which is also koord's shipped config); leader election off.

Usage: python bench/b2_e2e.py [--sizes 200x1000,1000x5000] [--workloads backlog,rate]
                              [--kinds gpu,cpu] [--rounds 2] [--schedulers koord,go]
                              [--schedulers koord,base --base-tree DIR]  (old-vs-new A/B)
                              [--schedulers koord,base --koord-args=X --base-args=Y]  (flags)
                              [--kube-versions 1.20,1.37]
Needs hack/kube-apiserver.sh and hack/kube-scheduler.sh (v1.20.2) and hack/kube-1.37.sh
(v1.37.2), each built on first use.
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import json
import os
import platform
import shlex
import signal
import socket
import ssl
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
sys.path.insert(0, str(ROOT))  # the e2e harness imports tests.ports
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
from apiserver import ApiServer  # noqa: E402
from b1_throughput import device_obj, node_obj  # noqa: E402

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


def _hack(script: str) -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(ROOT / "hack" / script)], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


KUBE_VERSIONS = ("v1.20.2", "v1.37.2")


def kube_version(word: str) -> str:
    """``1.20``/``v1.37``/``v1.37.2`` -> the control plane's full version."""
    for version in KUBE_VERSIONS:
        if version == word or version.startswith("v" + word.lstrip("v") + "."):
            return version
    raise SystemExit(f"b2: unknown Kubernetes version {word!r} (known: {', '.join(KUBE_VERSIONS)})")


def legacy(version: str) -> bool:
    """Go kube-scheduler v1.20: kubescheduler.config.k8s.io/v1beta1, an insecure port."""
    return version == KUBE_VERSIONS[0]


def binaries(version: str = KUBE_VERSIONS[0]) -> tuple[str, str]:
    values = _hack("kube-apiserver.sh" if legacy(version) else "kube-1.37.sh")
    return values["KUBE_APISERVER_BIN"], values["ETCD_BIN"]


def go_scheduler_bin(version: str) -> str:
    return _hack("kube-scheduler.sh" if legacy(version) else "kube-1.37.sh")["KUBE_SCHEDULER_BIN"]


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
    """Counts pods of the namespace that have a nodeName, with the times of the first and the
    last one."""

    def __init__(self, c: Client, expected: int) -> None:
        super().__init__(daemon=True)
        self.c, self.expected = c, expected
        self.bound: set[str] = set()
        self.first_bind = 0.0
        self.last_bind = 0.0
        self.done = threading.Event()
        self.ready = threading.Event()
        self.pid = 0
        """The scheduler's process id, once started: its CPU time is read at the first bind."""
        self.cpu_at_first_bind = float("nan")

    def run(self) -> None:
        rv = self._list()
        first = True
        while not self.done.is_set():
            # The API server closes a watch it finds slow to read ("Forcing ... watcher close
            # due to unresponsiveness", seen on v1.37 with 16 threads creating pods on two
            # cores): watch again from the last version seen, or relist when that is too old.
            rv = self._watch(rv, first)
            first = False
            if not rv:
                rv = self._list()

    def _list(self) -> str:
        doc = self.c.call("GET", f"/api/v1/namespaces/{NS}/pods")
        for obj in doc["items"]:
            self._seen(obj)
        return str(doc["metadata"]["resourceVersion"])

    def _watch(self, rv: str, first: bool) -> str:
        """One watch from ``rv``; the last version seen when it ends, "" when ``rv`` is too
        old (410)."""
        resp = self.c.pool.request(
            "GET",
            f"{self.c.url}/api/v1/namespaces/{NS}/pods?watch=1&resourceVersion={rv}",
            headers=self.c.headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=600),
        )
        if first:
            self.ready.set()
        buf = b""
        try:
            for chunk in resp.stream(amt=None):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event.get("type") == "ERROR":
                        return "" if obj.get("code") == 410 else rv
                    rv = obj["metadata"].get("resourceVersion", rv)
                    self._seen(obj)
                    if self.done.is_set():
                        return rv
        finally:
            resp.close()  # a watch's connection never goes back to the pool
        return rv

    def _seen(self, obj: dict[str, Any]) -> None:
        if not obj.get("spec", {}).get("nodeName"):
            return
        name = obj["metadata"]["name"]
        if name in self.bound:
            return
        self.bound.add(name)
        self.last_bind = time.perf_counter()
        if len(self.bound) == 1:
            self.first_bind = self.last_bind
            if self.pid:
                self.cpu_at_first_bind = _cpu_seconds(self.pid)
        if len(self.bound) >= self.expected:
            self.done.set()


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


def _status_mib(pid: int, field: str) -> float:
    """A ``/proc/PID/status`` memory field (``VmRSS``, ``VmHWM``) in MiB; NaN when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class RssSampler(threading.Thread):
    """The scheduler's resident set every ``interval`` s, kept as a maximum. ``VmHWM`` alone
    is not enough: the kernel updates it lazily from per-thread counters, and it was seen
    200 MiB below a sampled ``VmRSS`` at the end of a run."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = 0.0
        self.stop = threading.Event()

        self.series: list[tuple[float, float]] = []
        """(``perf_counter`` time, VmRSS MiB) of every sample, for ``--rss-trace``."""

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            rss = _status_mib(self.pid, "VmRSS")
            if rss == rss:  # not NaN
                self.peak = max(self.peak, rss)
                self.series.append((time.perf_counter(), rss))

    def finish(self) -> float:
        """Stop sampling; the peak seen, or ``VmHWM`` when that is higher."""
        self.stop.set()
        self.join(5)
        return max(self.peak, _status_mib(self.pid, "VmHWM"))


def _url(port: int, path: str, tls: bool) -> str:
    return f"{'https' if tls else 'http'}://127.0.0.1:{port}{path}"


def _insecure() -> ssl.SSLContext:
    """Go kube-scheduler v1.37 serves only HTTPS, with a self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def scrape(port: int, tls: bool = False) -> dict[str, Any]:
    ctx = _insecure() if tls else None
    with urllib.request.urlopen(_url(port, "/metrics", tls), timeout=30, context=ctx) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "CREATE", "UPDATE", "APPLY"}


def api_writes(c: Client) -> int:
    """Write requests the API server has answered so far (every client)."""
    resp = c.pool.request("GET", c.url + "/metrics", headers=c.headers, timeout=60)
    total = 0.0
    for fam in text_string_to_metric_families(resp.data.decode()):
        if fam.name != "apiserver_request":
            continue
        for sample in fam.samples:
            if sample.name.endswith("_total") and sample.labels.get("verb") in WRITE_VERBS:
                total += sample.value
    return int(total)


def settled_writes(c: Client, quiet_s: float = 2.0, limit_s: float = 60.0) -> int:
    """``api_writes`` once it has not moved for ``quiet_s`` (events are written after the
    bind, asynchronously, by both schedulers), or after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    last = api_writes(c)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = api_writes(c)
        if now == last:
            break
        last = now
    return last


SCHEDULER_NAME = "koord-scheduler"


def pod_body(i: int, kind: str) -> bytes:
    req = {"cpu": "1", "memory": "4Gi"}
    if kind == "gpu":
        req["nvidia.com/gpu"] = "1"
    elif kind == "share":  # half a card (koord's memory figure at 50,000 pods on 40,000 GPUs)
        req["koordinator.sh/gpu-core"] = "50"
        req["koordinator.sh/gpu-memory-ratio"] = "50"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i:05d}", "namespace": NS},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": req, "limits": req}}
            ],
        },
    }
    return json.dumps(pod).encode()


def go_config(
    srv: Any, workdir: Path, qps: float, burst: int, percentage: int, port: int, version: str
) -> Path:
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": srv.kubeconfig_path(), "qps": qps, "burst": burst},
        "leaderElection": {"leaderElect": False},
        "percentageOfNodesToScore": percentage,
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
    }
    if legacy(version):  # v1beta1: health and metrics on plain HTTP at these addresses
        cfg["apiVersion"] = "kubescheduler.config.k8s.io/v1beta1"
        cfg["healthzBindAddress"] = cfg["metricsBindAddress"] = f"127.0.0.1:{port}"
    path = workdir / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def koord_config(workdir: Path, percentage: int) -> Path:
    cfg = yaml.safe_load((ROOT / "config" / "scheduler-config.yaml").read_text())
    cfg["percentageOfNodesToScore"] = percentage
    cfg["leaderElection"] = {"leaderElect": False}
    path = workdir / "koord-scheduler.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


PACKAGES = ("apis", "scheduler")


def byte_compile(tree: Path) -> None:
    """Write the bytecode of the scheduler's packages in ``tree``, as installing the wheel
    does (pip compiles on install; the image sets PYTHONDONTWRITEBYTECODE only against
    writes at run time). Run from a source tree under PYTHONDONTWRITEBYTECODE=1 (this
    machine's default), every start would compile ~150 modules again: ~0.13 s of CPU that
    an installed scheduler does not spend."""
    for pkg in PACKAGES:
        compileall.compile_dir(str(tree / pkg), quiet=1)


def start_scheduler(
    which: str, srv: Any, args: argparse.Namespace, workdir: Path, go_bin: str, version: str
) -> tuple[subprocess.Popen[bytes], int, float]:
    """(process, metrics port, start time) once the process is spawned."""
    with socket.socket() as sock:  # a free loopback port for its health and metrics
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(workdir / f"{which}.log", "wb")  # noqa: SIM115
    tree = ROOT
    if which == "base" and args.base_tree:  # another source tree (an old commit), for A/B
        tree = Path(args.base_tree).resolve()
    if which in ("koord", "base"):
        cmd = [
            sys.executable, "-m", "scheduler.cli", "run",
            f"--kubeconfig={srv.kubeconfig_path()}",
            f"--config={koord_config(workdir, args.percentage)}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--port={port}",
            "--secure-port=0",  # plain HTTP on --port (insecure) is what this bench scrapes
            f"--kube-api-qps={args.qps}", f"--kube-api-burst={args.burst}",
            # Go kube-scheduler's events share its client QPS: the same budget for ours.
            f"--event-qps={args.qps}", f"--event-burst={args.burst}",
            "--log-level=warning",
        ]  # fmt: skip
    elif legacy(version):
        config = go_config(srv, workdir, args.qps, args.burst, args.percentage, port, version)
        cmd = [
            go_bin, f"--config={config}",
            "--address=127.0.0.1", f"--port={port}", "--secure-port=0", "--v=0",
        ]  # fmt: skip
    else:  # v1.37: no insecure port; health and metrics over HTTPS, scraped without a token
        config = go_config(srv, workdir, args.qps, args.burst, args.percentage, port, version)
        cmd = [
            go_bin, f"--config={config}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={workdir / 'go-certs'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--v=0",
        ]  # fmt: skip
    extra = args.base_args if which == "base" and args.base_args is not None else args.koord_args
    if which in ("koord", "base") and extra:
        cmd = [*cmd, *shlex.split(extra)]  # e.g. --bind-workers=16
    if which == "koord" and args.koord_wrap:
        cmd = [*shlex.split(args.koord_wrap), *cmd]  # e.g. a sampling profiler
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, port, start


def wait_ready(proc: subprocess.Popen[bytes], port: int, which: str, tls: bool = False) -> None:
    path = "/healthz" if which == "go" else "/readyz"
    deadline = time.monotonic() + 120
    ctx = _insecure() if tls else None
    while True:
        try:
            with urllib.request.urlopen(_url(port, path, tls), timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{which} scheduler did not become ready (see its log)")
        time.sleep(0.1)


def overcommitted_cards(c: Client, which: str) -> int:
    """Cards (koord) or nodes (Go) given more GPU than they have."""
    pods = c.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
    if which == "go":
        per_node: dict[str, int] = {}
        for p in pods:
            node = p["spec"].get("nodeName")
            if node:
                n = int(
                    p["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", 0)
                )
                per_node[node] = per_node.get(node, 0) + n
        return sum(1 for v in per_node.values() if v > 8)
    core: dict[tuple[str, int], int] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        ann = p["metadata"].get("annotations", {}).get("scheduling.koordinator.sh/device-allocated")
        if not node or not ann:
            continue
        for alloc in json.loads(ann).get("gpu", []):
            key = (node, int(alloc["minor"]))
            core[key] = core.get(key, 0) + int(
                alloc["resources"].get("koordinator.sh/gpu-core", "0")
            )
    return sum(1 for v in core.values() if v > 100)


def run_one(
    which: str,
    nodes: int,
    pods: int,
    workload: str,
    kind: str,
    args: argparse.Namespace,
    go_bin: str,
    version: str,
) -> dict[str, Any]:
    srv = ApiServer(*binaries(version)).start()
    tls = which == "go" and not legacy(version)
    proc: subprocess.Popen[bytes] | None = None
    workdir = Path(srv.dir or "/tmp")
    try:
        c = Client(srv.url, srv.admin_token, pool=args.threads + 4)
        setup_cluster(c, nodes, args.threads)
        bodies = [pod_body(i, kind) for i in range(pods)]
        path = f"/api/v1/namespaces/{NS}/pods"
        watch = BindWatch(c, pods)
        watch.start()
        watch.ready.wait(30)
        own_writes = 0
        if workload == "backlog":
            with ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(lambda b: c.call("POST", path, b), bodies))
        writes_before = api_writes(c)
        proc, port, started = start_scheduler(which, srv, args, workdir, go_bin, version)
        watch.pid = proc.pid
        sampler = RssSampler(proc.pid)
        sampler.start()
        if workload == "rate":
            wait_ready(proc, port, which, tls)
            own_writes = pods
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.threads) as pool:
                for i, body in enumerate(bodies):
                    delay = t0 + i / args.rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    pool.submit(c.call, "POST", path, body)
        deadline = time.monotonic() + args.timeout
        while not watch.done.wait(1.0):
            if proc.poll() is not None:
                raise RuntimeError(f"{which} scheduler exited with {proc.returncode} (see its log)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{which}: only {len(watch.bound)} of {pods} pods bound")
        writes = settled_writes(c) - writes_before - own_writes
        # After the writes settle: both schedulers write their Events asynchronously, after
        # the bind; CPU read at the last bind would leave out the Events still queued then.
        cpu_s = _cpu_seconds(proc.pid)
        scraped = time.perf_counter()
        fams = scrape(port, tls)
        rss_mib = sampler.finish()  # sampled; one /metrics scrape included, as in production
        if args.rss_trace:
            marks = {"first_bind": watch.first_bind, "last_bind": watch.last_bind}
            trace = {
                "scheduler": which,
                "size": f"{nodes}x{pods}",
                "marks_s": {
                    k: round(v - started, 2) for k, v in {**marks, "scrape": scraped}.items()
                },
                "rss_mib": [(round(t - started, 2), round(r, 1)) for t, r in sampler.series],
            }
            out = Path(f"{args.rss_trace}.{which}.{nodes}x{pods}.{os.getpid()}.json")
            out.write_text(json.dumps(trace))
        sli_name = (
            "scheduler_pod_scheduling_duration_seconds"  # Go v1.20's; since removed
            if which == "go" and legacy(version)
            else "scheduler_pod_scheduling_sli_duration_seconds"
        )
        sli = fams.get(sli_name)
        p50 = quantile(0.5, sli)[0] if sli is not None else float("nan")
        p99 = quantile(0.99, sli)[0] if sli is not None else float("nan")
        span = watch.last_bind - watch.first_bind
        cpu_first = watch.cpu_at_first_bind
        return {
            "scheduler": which,
            "kube": version,
            "nodes": nodes,
            "pods": pods,
            "workload": workload,
            "kind": kind,
            "pods_per_s": pods / span if span > 0 else float("inf"),
            "wall_s": watch.last_bind - started,
            "pods_per_s_from_start": pods / (watch.last_bind - started),
            "first_bind_s": watch.first_bind - started,
            "cpu_ms_per_pod": 1000 * cpu_s / pods,
            "startup_cpu_s": cpu_first,
            "cpu_ms_per_pod_after_first": 1000 * (cpu_s - cpu_first) / max(pods - 1, 1),
            "sli_p50_s": p50,
            "sli_p99_s": p99,
            "writes_per_pod": writes / pods,
            "overcommitted": overcommitted_cards(c, which),
            "peak_rss_mib": rss_mib,
        }
    finally:
        if proc is not None:
            # A wrapping profiler writes its report on SIGINT (Ctrl-C), not on SIGTERM.
            wrapped = which == "koord" and args.koord_wrap
            proc.send_signal(signal.SIGINT if wrapped else signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        srv.stop()


HEADER = (
    f"{'size':>10} {'workload':>8} {'kind':>4} {'sched':>5} {'round':>5} {'pods/s':>8} "
    f"{'start/s':>8} {'1st bind':>8} {'wall s':>7} {'cpu ms/pod':>10} {'cpu@1st':>7} "
    f"{'ms/pod>1st':>10} {'sli p50':>8} {'sli p99':>8} {'writes/pod':>10} "
    f"{'overcommit':>10} {'peak RSS MiB':>12}"
)


def fmt(r: dict[str, Any], rnd: int) -> str:
    return (
        f"{r['nodes']:>5}x{r['pods']:<4} {r['workload']:>8} {r['kind']:>4} {r['scheduler']:>5} "
        f"{rnd:>5} {r['pods_per_s']:>8.1f} {r['pods_per_s_from_start']:>8.1f} "
        f"{r['first_bind_s']:>8.2f} {r['wall_s']:>7.2f} {r['cpu_ms_per_pod']:>10.2f} "
        f"{r['startup_cpu_s']:>7.2f} {r['cpu_ms_per_pod_after_first']:>10.2f} "
        f"{r['sli_p50_s']:>8.3f} {r['sli_p99_s']:>8.3f} {r['writes_per_pod']:>10.2f} "
        f"{r['overcommitted']:>10} {r['peak_rss_mib']:>12.0f}"
    )


def run_matrix(
    args: argparse.Namespace, schedulers: list[str], version: str, go_bin: str
) -> list[dict[str, Any]]:
    """Every size x workload x kind on one control plane, ``--rounds`` rounds each, the
    schedulers alternating who goes first; prints each run and the koord/Go ratios."""
    results: list[dict[str, Any]] = []
    for size, workload, kind in itertools.product(
        args.sizes.split(","), args.workloads.split(","), args.kinds.split(",")
    ):
        nodes, pods = (int(x) for x in size.split("x"))
        got: dict[str, list[float]] = {s: [] for s in schedulers}
        got_start: dict[str, list[float]] = {s: [] for s in schedulers}
        for rnd in range(1, args.rounds + 1):
            order = schedulers if rnd % 2 else list(reversed(schedulers))
            for which in order:
                r = run_one(which, nodes, pods, workload, kind, args, go_bin, version)
                r["round"] = rnd
                results.append(r)
                got[which].append(r["pods_per_s"])
                got_start[which].append(r["pods_per_s_from_start"])
                print(fmt(r, rnd), flush=True)
        for other in ("go", "base"):
            if "koord" not in got or not got.get(other):
                continue
            ratios = [k / g for k, g in zip(got["koord"], got[other], strict=True)]
            from_start = [k / g for k, g in zip(got_start["koord"], got_start[other], strict=True)]
            print(
                f"# {version} {size} {workload} {kind}: koord/{other} pods/s first->last bind "
                "per round "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f"; of the means {sum(got['koord']) / sum(got[other]):.2f}"
                + "; from process start (start-up included) per round "
                + ", ".join(f"{x:.2f}" for x in from_start)
                + f"; of the means {sum(got_start['koord']) / sum(got_start[other]):.2f}",
                flush=True,
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200x1000,1000x5000", help="NODESxPODS,...")
    parser.add_argument("--workloads", default="backlog,rate")
    parser.add_argument("--kinds", default="gpu,cpu")
    parser.add_argument("--schedulers", default="koord,go")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="arrival rate (rate workload)")
    parser.add_argument("--qps", type=float, default=5000.0)
    parser.add_argument("--burst", type=int, default=10000)
    parser.add_argument("--percentage", type=int, default=0, help="percentageOfNodesToScore")
    parser.add_argument("--threads", type=int, default=16, help="pod-creating threads")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument(
        "--rss-trace",
        help="write each run's scheduler VmRSS samples (0.1 s) with its first/last bind and "
        "scrape times to FILE.N.json",
    )
    parser.add_argument(
        "--base-tree",
        default="",
        help="a source tree (e.g. a git worktree of an older commit) whose koord-scheduler runs "
        "as scheduler 'base' (--schedulers koord,base) for an old-vs-new A/B; without it "
        "'base' is this tree's",
    )
    parser.add_argument(
        "--base-args",
        default=None,
        help="base's run flags instead of --koord-args, for a flag A/B in one tree, e.g. "
        "--koord-args=--kube-transport=http11 --base-args=",
    )
    parser.add_argument(
        "--kube-versions",
        default="1.20,1.37",
        help="control planes, each with its own Go kube-scheduler (default: 1.20,1.37)",
    )
    parser.add_argument(
        "--koord-args", default="", help="more koord-scheduler run flags, e.g. --bind-workers=16"
    )
    parser.add_argument(
        "--koord-wrap",
        default="",
        help='prefix of the koord-scheduler command, e.g. "py-spy record -f raw -o prof.txt --"'
        " (its CPU figures then include the profiler's)",
    )
    args = parser.parse_args(argv)
    schedulers = args.schedulers.split(",")
    versions = [kube_version(w.strip()) for w in args.kube_versions.split(",") if w.strip()]
    if "koord" in schedulers:
        byte_compile(ROOT)
    if "base" in schedulers:
        byte_compile(Path(args.base_tree).resolve() if args.base_tree else ROOT)
    print(
        f"# B2 side by side {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}; qps {args.qps:g} burst {args.burst}, "
        f"percentageOfNodesToScore {args.percentage}, rate {args.rate:g}/s",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    for version in versions:
        go_bin = go_scheduler_bin(version) if "go" in schedulers else ""
        print(f"# kube-apiserver {version}, Go kube-scheduler {version}", flush=True)
        print(HEADER, flush=True)
        results += run_matrix(args, schedulers, version, go_bin)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
