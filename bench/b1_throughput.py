"""Benchmark B1 (BENCHMARKS.md): in-process scheduling throughput, no API server.

N nodes with 64 cores, 512Gi and 8 GPUs each (16Gi/40Gi/80Gi cards mixed by node), 2 x N pods,
the in-memory cluster as binder. Reports pods/s from the first pod popped to the last pod bound,
p50/p99 of the scheduling-attempt duration, and the process's peak RSS.

Usage: python bench/b1_throughput.py [--nodes 500,1000,5000] [--mix gpu|cpu] [--prefill]
The ``gpu`` mix (the default when the DeviceShare plugin is registered) is BENCHMARKS.md's:
30% gpu-core 50 + ratio 50, 20% gpu-core 25 + 4Gi, 30% nvidia.com/gpu 1, 10% nvidia.com/gpu 2,
10% CPU-only. The ``cpu`` mix requests cpu and memory only.
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

from scheduler.config import parse_config
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.scheduler import Scheduler
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


class AttemptRecorder:
    def __init__(self) -> None:
        self.durations: list[float] = []
        self.results: dict[str, int] = {}
        self.filter_seconds: list[float] = []

    def extension_point(self, profile: str, ep: str, status: str, seconds: float) -> None:
        if ep == "Filter":
            self.filter_seconds.append(seconds)

    def plugin(self, plugin: str, ep: str, status: str, seconds: float) -> None:
        pass

    def attempt(self, result: str, profile: str, seconds: float) -> None:
        self.durations.append(seconds)
        self.results[result] = self.results.get(result, 0) + 1

    def scheduled(self, attempts: int, sli_seconds: float) -> None:
        pass


def run_case(nodes: int, mix: str, prefill: bool, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
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
    if prefill:
        # Half of the cluster already taken by running pods (placed by the scheduler first).
        if mix == "gpu":
            fill = [{"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}] * (nodes * 4)
        else:
            fill = [{"cpu": "32", "memory": "256Gi"}] * nodes
        for j, req in enumerate(fill):
            cluster.apply_pod(pod_obj(f"pre-{j}", req))
        sched.run_until_idle(timeout=3600)
        recorder.durations.clear()
        recorder.results.clear()
        recorder.filter_seconds.clear()
    count = 2 * nodes
    for j in range(count):
        cluster.apply_pod(pod_obj(f"p-{j}", pod_requests(rng, mix)))
    sched.drain()
    binds_before = cluster.binds
    start = time.perf_counter()
    sched.run_until_idle(timeout=3600)
    elapsed = time.perf_counter() - start
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
        "p50_ms": 1000 * statistics.median(d) if d else 0.0,
        "p99_ms": 1000 * d[int(0.99 * (len(d) - 1))] if d else 0.0,
        "filter_ms": 1000 * statistics.mean(recorder.filter_seconds)
        if recorder.filter_seconds
        else 0.0,
        "results": dict(recorder.results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="500,1000,5000")
    has_deviceshare = "DeviceShare" in in_tree_registry()
    parser.add_argument(
        "--mix", choices=("gpu", "cpu"), default="gpu" if has_deviceshare else "cpu"
    )
    parser.add_argument("--prefill", action="store_true", help="start half allocated")
    args = parser.parse_args(argv)
    print(
        f"# B1 {time.strftime('%Y-%m-%d')} python {platform.python_version()} "
        f"{platform.machine()} mix={args.mix}"
    )
    print(
        f"{'nodes':>6} {'pods':>6} {'bound':>6} {'prefill':>7} {'pods/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'filter ms':>9} {'seconds':>8}"
    )
    for n in (int(x) for x in args.nodes.split(",")):
        r = run_case(n, args.mix, args.prefill)
        print(
            f"{r['nodes']:>6} {r['pods']:>6} {r['bound']:>6} {r['prefill']!s:>7} "
            f"{r['pods_per_s']:>8.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['filter_ms']:>9.3f} {r['seconds']:>8.2f}",
            flush=True,
        )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"# peak RSS {peak_mb:.0f} MiB (whole run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
