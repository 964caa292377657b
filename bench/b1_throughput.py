"""Benchmark B1 (BENCHMARKS.md): in-process scheduling throughput, no API server.

N nodes with 64 cores, 512Gi and 8 GPUs each (16Gi/40Gi/80Gi cards mixed by node), 2 x N pods,
the in-memory cluster as binder. Reports pods/s from the first pod popped to the last pod bound,
p50/p99 of the scheduling-attempt duration, the process's peak RSS, and beside pods/s the
ceiling: the bare numpy pass (fit, score, pick over the same arrays, ``bare_pass_ms``) timed in
the same run, as pods/s, and B1's share of it.

Usage: python bench/b1_throughput.py [--nodes 500,1000,5000] [--mix gpu|cpu] [--prefill]
       python bench/b1_throughput.py --case fill [--nodes 5000] [--fill-pods 50000]
       python bench/b1_throughput.py --case unsched [--nodes 5000]
The ``gpu`` mix (the default when the DeviceShare plugin is registered) is BENCHMARKS.md's:
30% gpu-core 50 + ratio 50, 20% gpu-core 25 + 4Gi, 30% nvidia.com/gpu 1, 10% nvidia.com/gpu 2,
10% CPU-only. The ``cpu`` mix requests cpu and memory only.

``--case fill`` fills the cluster to full: the pods arrive in ten chunks of 10 % and each
chunk's pods/s is printed with the GPU core allocation reached (unschedulable pods included,
each attempted once per chunk as they come back). ``--case unsched`` runs 2 x N pods of the mix
of which 10 % fit nowhere (a card with more memory than any node has: DeviceShare rejects
every node, the expensive diagnosis). Both print the mean cost of a scheduled and of an
unschedulable attempt and their ratio.
"""

from __future__ import annotations

import argparse
import platform
import random
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

from apis.core import decode_pod
from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.devices.allocator import feasible_rows
from scheduler.devices.request import parse_request
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock

GPU_MEMORY_GI = (16, 40, 80)


def node_obj(i: int) -> dict[str, Any]:
    mem = GPU_MEMORY_GI[i % 3]
    alloc = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": "8",
        "koordinator.sh/gpu-core": "800",
        "koordinator.sh/gpu-memory-ratio": "800",
        "koordinator.sh/gpu-memory": f"{8 * mem}Gi",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "labels": {"node.koordinator.sh/gpu-model": f"G{mem}"},
        },
        "status": {"allocatable": alloc},
    }


def device_obj(i: int) -> dict[str, Any]:
    mem = GPU_MEMORY_GI[i % 3]
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": f"node-{i:05d}"},
        "spec": {
            "devices": [
                {
                    "type": "gpu",
                    "id": f"GPU-{i:08x}-{m:04x}",
                    "minor": m,
                    "health": True,
                    "resources": {
                        "koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": f"{mem}Gi",
                        "koordinator.sh/gpu-memory-ratio": "100",
                    },
                    "topology": {
                        "socketID": m // 4,
                        "nodeID": m // 4,
                        "pcieID": f"pci{m // 2}",
                        "busID": f"0000:{m:02x}:00.0",
                    },
                }
                for m in range(8)
            ]
        },
    }


def pod_requests(rng: random.Random, mix: str) -> dict[str, str]:
    base = {"cpu": "1", "memory": "4Gi"}
    if mix == "cpu":
        return base
    r = rng.random()
    if r < 0.3:
        return base | {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    if r < 0.5:
        return base | {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory": "4Gi"}
    if r < 0.8:
        return base | {"nvidia.com/gpu": "1"}
    if r < 0.9:
        return base | {"nvidia.com/gpu": "2"}
    return base


def pod_obj(name: str, requests: dict[str, str], node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "koord-scheduler",
        "containers": [{"name": "c", "resources": {"requests": requests}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": spec,
    }


UNFIT_REQUESTS = {
    "cpu": "1",
    "memory": "4Gi",
    "koordinator.sh/gpu-core": "100",
    "koordinator.sh/gpu-memory": "96Gi",
}
"""Fits on no node of the bench cluster: no card has 96Gi (DeviceShare rejects every node)."""


class AttemptRecorder:
    def __init__(self) -> None:
        self.durations: list[float] = []
        self.results: dict[str, int] = {}
        self.by_result: dict[str, list[float]] = {}
        self.filter_seconds: list[float] = []

    def extension_point(self, profile: str, ep: str, status: str, seconds: float) -> None:
        if ep == "Filter":
            self.filter_seconds.append(seconds)

    def plugin(self, plugin: str, ep: str, status: str, seconds: float) -> None:
        pass

    def attempt(self, result: str, profile: str, seconds: float) -> None:
        self.durations.append(seconds)
        self.results[result] = self.results.get(result, 0) + 1
        self.by_result.setdefault(result, []).append(seconds)

    def clear(self) -> None:
        self.durations.clear()
        self.results.clear()
        self.by_result.clear()
        self.filter_seconds.clear()

    def mean_ms(self, result: str) -> float:
        d = self.by_result.get(result)
        return 1000 * statistics.fmean(d) if d else float("nan")

    def scheduled(self, attempts: int, sli_seconds: float) -> None:
        pass

    def preemption(self, victims: int | None) -> None:
        pass


def build(nodes: int, mix: str, seed: int) -> tuple[InMemoryCluster, Scheduler, AttemptRecorder]:
    cluster = InMemoryCluster()
    for i in range(nodes):
        cluster.apply_node(node_obj(i))
        if mix == "gpu":
            cluster.apply_device(device_obj(i))
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "percentageOfNodesToScore": 100,
            "profiles": [{"schedulerName": "koord-scheduler"}],
        }
    )
    recorder = AttemptRecorder()
    sched = Scheduler(
        config,
        cluster,
        in_tree_registry(),
        default_plugins(),
        clock=SimulatedClock(),
        rng=random.Random(seed),
        observer=recorder,
    )
    return cluster, sched, recorder


def gpu_core_allocated(sched: Scheduler) -> float:
    """Fraction of the cluster's gpu-core allocated, read from DeviceShare's ledger."""
    plugin = next(iter(sched.profiles.values())).plugin("DeviceShare")
    tbl = plugin.ledger.table("gpu")
    total = int(tbl.sum_total[0].sum())
    return int(tbl.sum_alloc[0].sum()) / total if total else 0.0


def bare_pass_ms(sched: Scheduler, mix: str, seed: int, count: int = 300) -> float:
    """The ceiling: one bare numpy pass per pod over the same nodes x cards arrays.

    Fit (pods, cpu, memory columns and DeviceShare's per-card feasibility), score (least
    allocated cpu/memory and DeviceShare's card score) and pick (argmax) for ``count`` pods of
    the mix against the scheduler's current snapshot and ledger, nothing else: no queue, no
    cycle state, no plugin calls, no reserve or bind. Mean milliseconds per pod.
    """
    snapshot = sched.cache.snapshot
    fwk = next(iter(sched.profiles.values()))
    ds = fwk.plugin("DeviceShare") if "DeviceShare" in fwk.plugins_at("filter") else None
    rng = random.Random(seed + 7)
    pods = [decode_pod(pod_obj(f"c-{i}", pod_requests(rng, mix))) for i in range(count)]
    requests = [parse_request(p) if ds is not None else None for p in pods]
    size = snapshot.size
    cpu_alloc, mem_alloc = snapshot.allocatable("cpu"), snapshot.allocatable("memory")
    start = time.perf_counter()
    for pod, req in zip(pods, requests, strict=True):
        ok = snapshot.pod_count[:size] < snapshot.allocatable("pods")
        score = np.zeros(size, np.int64)
        for alloc, used, name in (
            (cpu_alloc, snapshot.non_zero_cpu[:size], "cpu"),
            (mem_alloc, snapshot.non_zero_memory[:size], "memory"),
        ):
            want = pod.requests.get(name, 0)
            ok &= alloc - snapshot.requested(name) >= want
            cap = np.maximum(alloc, 1)
            score += np.maximum(cap - used - want, 0) * 100 // cap
        if req is not None and ds is not None:
            rows = ds._slot_rows(snapshot)
            ok &= feasible_rows(ds.ledger, req)[rows]
            score += ds.scorer.score_rows(ds.ledger, req)[rows]
        int(np.argmax(np.where(ok, score, -1)))
    return 1000 * (time.perf_counter() - start) / count


def run_case(nodes: int, mix: str, prefill: bool, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster, sched, recorder = build(nodes, mix, seed)
    if prefill:
        # Half of the cluster already taken by running pods (placed by the scheduler first).
        if mix == "gpu":
            fill = [{"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}] * (nodes * 4)
        else:
            fill = [{"cpu": "32", "memory": "256Gi"}] * nodes
        for j, req in enumerate(fill):
            cluster.apply_pod(pod_obj(f"pre-{j}", req))
        sched.run_until_idle(timeout=3600)
        recorder.clear()
    count = 2 * nodes
    for j in range(count):
        cluster.apply_pod(pod_obj(f"p-{j}", pod_requests(rng, mix)))
    sched.drain()
    binds_before = cluster.binds
    ceiling_before = bare_pass_ms(sched, mix, seed)
    start = time.perf_counter()
    sched.run_until_idle(timeout=3600)
    elapsed = time.perf_counter() - start
    # The ceiling measured before and after (emptier and fuller arrays), averaged.
    ceiling_ms = (ceiling_before + bare_pass_ms(sched, mix, seed)) / 2
    sched.close()
    bound = cluster.binds - binds_before
    d = sorted(recorder.durations)
    return {
        "nodes": nodes,
        "mix": mix,
        "prefill": prefill,
        "pods": count,
        "bound": bound,
        "seconds": elapsed,
        "pods_per_s": count / elapsed,
        "ceiling_pods_per_s": 1000 / ceiling_ms,
        "p50_ms": 1000 * statistics.median(d) if d else 0.0,
        "p99_ms": 1000 * d[int(0.99 * (len(d) - 1))] if d else 0.0,
        "filter_ms": 1000 * statistics.mean(recorder.filter_seconds)
        if recorder.filter_seconds
        else 0.0,
        "results": dict(recorder.results),
    }


def run_unsched(nodes: int, seed: int = 1) -> dict[str, Any]:
    """2 x N pods of the GPU mix, every tenth one unschedulable."""
    rng = random.Random(seed)
    cluster, sched, recorder = build(nodes, "gpu", seed)
    count = 2 * nodes
    for j in range(count):
        req = UNFIT_REQUESTS if j % 10 == 9 else pod_requests(rng, "gpu")
        cluster.apply_pod(pod_obj(f"p-{j}", req))
    sched.drain()
    start = time.perf_counter()
    sched.run_until_idle(timeout=3600)
    elapsed = time.perf_counter() - start
    sched.close()
    return {
        "nodes": nodes,
        "pods": count,
        "bound": cluster.binds,
        "seconds": elapsed,
        "pods_per_s": count / elapsed,
        "scheduled_ms": recorder.mean_ms("scheduled"),
        "unschedulable_ms": recorder.mean_ms("unschedulable"),
        "results": dict(recorder.results),
    }


def run_fill(nodes: int, pods: int, seed: int = 1) -> None:
    """Fill to full in ten chunks; prints one line per chunk and the overall figures."""
    rng = random.Random(seed)
    cluster, sched, recorder = build(nodes, "gpu", seed)
    chunk = max(1, pods // 10)
    print(
        f"{'chunk':>5} {'pods':>6} {'bound':>6} {'unsched':>7} {'gpu %':>6} {'pods/s':>8} "
        f"{'sched ms':>8} {'unsch ms':>8} {'seconds':>8}"
    )
    total_s = 0.0
    sched_all: list[float] = []
    unsched_all: list[float] = []
    made = 0
    for c in range(10):
        n = chunk if c < 9 else pods - made
        for j in range(made, made + n):
            cluster.apply_pod(pod_obj(f"p-{j}", pod_requests(rng, "gpu")))
        made += n
        sched.drain()
        binds = cluster.binds
        recorder.clear()
        start = time.perf_counter()
        sched.run_until_idle(timeout=3600)
        elapsed = time.perf_counter() - start
        total_s += elapsed
        sched_all += recorder.by_result.get("scheduled", [])
        unsched_all += recorder.by_result.get("unschedulable", [])
        print(
            f"{c + 1:>5} {n:>6} {cluster.binds - binds:>6} "
            f"{recorder.results.get('unschedulable', 0):>7} "
            f"{100 * gpu_core_allocated(sched):>6.1f} {n / elapsed:>8.0f} "
            f"{recorder.mean_ms('scheduled'):>8.3f} {recorder.mean_ms('unschedulable'):>8.3f} "
            f"{elapsed:>8.2f}",
            flush=True,
        )
    sched.close()
    s_ms = 1000 * statistics.fmean(sched_all) if sched_all else float("nan")
    u_ms = 1000 * statistics.fmean(unsched_all) if unsched_all else float("nan")
    print(
        f"# fill {nodes} nodes x 8 GPUs, {pods} pods: {pods / total_s:.0f} pods/s overall "
        f"({total_s:.1f} s), {cluster.binds} bound; attempt mean: scheduled {s_ms:.3f} ms, "
        f"unschedulable {u_ms:.3f} ms, ratio {u_ms / s_ms:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="500,1000,5000")
    has_deviceshare = "DeviceShare" in in_tree_registry()
    parser.add_argument(
        "--mix", choices=("gpu", "cpu"), default="gpu" if has_deviceshare else "cpu"
    )
    parser.add_argument("--prefill", action="store_true", help="start half allocated")
    parser.add_argument("--case", choices=("b1", "fill", "unsched"), default="b1")
    parser.add_argument("--fill-pods", type=int, default=50_000)
    args = parser.parse_args(argv)
    if args.case == "fill":
        nodes = int(args.nodes.split(",")[-1])
        print(f"# B1 fill to full {time.strftime('%Y-%m-%d')} python {platform.python_version()}")
        run_fill(nodes, args.fill_pods)
        print(f"# peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        return 0
    if args.case == "unsched":
        print(f"# B1 10% unschedulable {time.strftime('%Y-%m-%d')}")
        print(
            f"{'nodes':>6} {'pods':>6} {'bound':>6} {'pods/s':>8} {'sched ms':>8} "
            f"{'unsch ms':>8} {'ratio':>6}"
        )
        for n in (int(x) for x in args.nodes.split(",")):
            r = run_unsched(n)
            print(
                f"{r['nodes']:>6} {r['pods']:>6} {r['bound']:>6} {r['pods_per_s']:>8.0f} "
                f"{r['scheduled_ms']:>8.3f} {r['unschedulable_ms']:>8.3f} "
                f"{r['unschedulable_ms'] / r['scheduled_ms']:>6.2f}",
                flush=True,
            )
        return 0
    print(
        f"# B1 {time.strftime('%Y-%m-%d')} python {platform.python_version()} "
        f"{platform.machine()} mix={args.mix}"
    )
    print(
        f"{'nodes':>6} {'pods':>6} {'bound':>6} {'prefill':>7} {'pods/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'filter ms':>9} {'seconds':>8} {'ceiling':>8} {'of ceil':>7}"
    )
    for n in (int(x) for x in args.nodes.split(",")):
        r = run_case(n, args.mix, args.prefill)
        print(
            f"{r['nodes']:>6} {r['pods']:>6} {r['bound']:>6} {r['prefill']!s:>7} "
            f"{r['pods_per_s']:>8.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['filter_ms']:>9.3f} {r['seconds']:>8.2f} {r['ceiling_pods_per_s']:>8.0f} "
            f"{r['pods_per_s'] / r['ceiling_pods_per_s']:>7.0%}",
            flush=True,
        )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"# peak RSS {peak_mb:.0f} MiB (whole run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
