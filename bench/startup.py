"""Where ``koord-scheduler run``'s start-up CPU goes, step by step, against B2's cluster.

Starts a kube-apiserver (+ etcd) holding B2's cluster (``--nodes`` nodes with 8 GPUs and a
Device CR each, ``--pods`` pending ``nvidia.com/gpu: 1`` pods), then ``--runs`` times a fresh
interpreter that does what ``run`` does up to its first scheduling cycle — the imports, the
credentials, the adapter and the scheduler built, the informers synced, the first drain of
every Node, Device CR and Pod into the core — and prints its CPU seconds
(``time.process_time()``) between those steps.

Usage: python bench/startup.py [--nodes 200] [--pods 1000] [--runs 3] [--trees DIR,DIR]
The child imports ``scheduler`` from this tree, or from each of ``--trees`` in turn (an A/B,
alternating per run); every tree is byte-compiled first, as an installed wheel is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from b2_e2e import NS, ROOT, ApiServer, Client, binaries, byte_compile, pod_body, setup_cluster

CHILD = r"""
import os, sys, time
marks = [("interpreter start", time.process_time())]
import scheduler.cli, scheduler.commands.run
marks.append(("imports of cli and run", time.process_time()))
from scheduler.commands.common import load_config_or_fail
from scheduler.core import Scheduler
from scheduler.kube.cluster import KubeCluster
from scheduler.kube.credentials import load_credentials
from scheduler.kube.events import EventRecorder
from scheduler.kube.http11 import Http11Transport
from scheduler.kube.ratelimit import TokenBucket
from scheduler.kube.rest import RestClient
from scheduler.observability.health import HealthServer
from scheduler.observability.metrics import SchedulerMetrics
from scheduler.plugins.registry import default_plugins, in_tree_registry
marks.append(("imports run makes when it starts", time.process_time()))
from scheduler.observability import logs
logs.configure("json", "warning", sys.stderr)  # as run --log-level=warning does
creds = load_credentials(sys.argv[1])
marks.append(("credentials", time.process_time()))
rest = RestClient(Http11Transport(creds, pool_size=80), token=creds.token,
                  limiter=TokenBucket(5000, 10000))
recorder = EventRecorder(rest.with_limiter(None), qps=5000, burst=10000, host="startup")
cluster = KubeCluster(rest, recorder, fence=lambda: True)
sched = Scheduler(load_config_or_fail(None), cluster, in_tree_registry(), default_plugins(),
                  observer=SchedulerMetrics(), bind_workers=64)
marks.append(("metrics, adapter and scheduler built", time.process_time()))
cluster.start()
if not cluster.wait_for_sync(120):
    raise SystemExit("informers did not sync")
marks.append(("informers synced (LISTs decoded)", time.process_time()))
n = sched.drain()
marks.append((f"first drain ({n} changes into the core)", time.process_time()))
prev = 0.0
for name, t in marks:
    print(f"{t - prev:7.3f}  {name}")
    prev = t
print(f"{prev:7.3f}  total", flush=True)
os._exit(0)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trees", default="", help="source trees to alternate (default: this)")
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",") if t] or [ROOT]
    for tree in trees:
        byte_compile(tree)
    srv = ApiServer(*binaries()).start()
    try:
        c = Client(srv.url, srv.admin_token, pool=20)
        setup_cluster(c, args.nodes, 16)
        bodies = [pod_body(i, "gpu") for i in range(args.pods)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda b: c.call("POST", f"/api/v1/namespaces/{NS}/pods", b), bodies))
        print(f"# start-up CPU seconds by step, {args.nodes} nodes x {args.pods} pods", flush=True)
        for run in range(1, args.runs + 1):
            for tree in trees:
                print(f"# run {run}, {tree}", flush=True)
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, srv.kubeconfig_path()],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    cwd=tree,
                    env={**os.environ, "PYTHONPATH": str(tree)},
                )
                print(out.stdout, end="", flush=True)
                if out.returncode != 0:
                    print(out.stderr[-2000:], file=sys.stderr)
                    return 1
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
