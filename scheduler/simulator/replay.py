"""Trace replay by the FGD paper's method, through the real scheduler (SPEC §9, BENCHMARKS B3).

Role: one replay = one trace, one scheduler configuration (a policy), one seed:

1. ``arrival``: shuffle the trace's pods with the seed, then append pods sampled with
   replacement (named ``<name>-tuned-<i>``) as long as the arrived GPU request stays within
   ``inflate`` x the cluster's GPU capacity — the first sample that would go over ends it, as
   in the paper's artifact (``tuneUpPods``). An ``inflate`` below the trace's own request
   removes random pods instead (``tuneDownPods``).
2. ``node_order``: the nodes, shuffled with the seed too (the artifact gives every node a
   random name prefix per run), so that "the earliest node" tie-breaks differ between seeds.
3. ``replay``: the nodes and Device CRs go into an in-memory cluster, then the pods one by one:
   each is created and gets exactly one scheduling attempt by the same ``Scheduler``, plugins
   and profiles as every other mode (no departures); a pod that fits nowhere is deleted, so it
   is never retried. After each pod the ``FragmentationMeter`` records the arrived GPU request,
   the allocated GPU, the fragmented GPU for the trace's typical shapes and the occupied nodes.
4. ``prepare_config``: a policy's configuration with the trace's pod-shape distribution (and
   the seed) given to GPUFragmentation wherever a profile uses it — or, to measure the live
   estimate, the profile's own learned window left in place.

Invariants: the same trace, configuration and seed give the same arrival order, the same
placements and the same curves; ``arrived`` is non-decreasing and ``allocated <= arrived``.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from apis.core import CPU
from scheduler.config import PluginConfig, Plugins, SchedulerConfiguration
from scheduler.framework.interfaces import PluginFactory
from scheduler.plugins.gpufragmentation import NAME as GPU_FRAGMENTATION
from scheduler.plugins.gpufragmentation.args import workload_args
from scheduler.plugins.gpufragmentation.measure import PodShape, Workload, typical_shapes
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.fragmentation import FragmentationMeter, uses_from_annotation
from scheduler.simulator.run import simulated_scheduler
from scheduler.simulator.trace import (
    TraceNode,
    TracePod,
    device_object,
    node_object,
    pod_object,
)

__all__ = [
    "ArrivingPod",
    "ReplayResult",
    "arrival",
    "capacity_milli",
    "node_order",
    "prepare_config",
    "replay",
    "trace_shapes",
]

ProgressFn = Callable[[int, int], None]
"""Called as ``progress(pods_done, pods_total)`` during a replay."""


@dataclass(frozen=True, slots=True)
class ArrivingPod:
    name: str
    pod: TracePod


def capacity_milli(nodes: Sequence[TraceNode]) -> int:
    return sum(n.gpu_milli for n in nodes)


def arrival(
    pods: Sequence[TracePod], capacity: int, seed: int, inflate: float
) -> list[ArrivingPod]:
    """The paper's arrival order: shuffled with ``seed``, then inflated (or deflated) to
    ``inflate`` x ``capacity`` of GPU request (milli)."""
    rng = random.Random(seed)
    order = [ArrivingPod(p.name, p) for p in sorted(pods, key=lambda p: p.name)]
    rng.shuffle(order)
    if inflate <= 0 or not pods:
        return order
    target = inflate * capacity
    total = sum(a.pod.total_gpu_milli for a in order)
    if total > target:
        while total > target and order:
            gone = order.pop(rng.randrange(len(order)))
            total -= gone.pod.total_gpu_milli
        return order
    population = sorted(pods, key=lambda p: p.name)
    if not any(p.total_gpu_milli for p in population):
        return order  # nothing to inflate with: no pod asks for a GPU
    i = 0
    while True:
        sample = population[rng.randrange(len(population))]
        if total + sample.total_gpu_milli > target:
            return order
        order.append(ArrivingPod(f"{sample.name}-tuned-{i}", sample))
        total += sample.total_gpu_milli
        i += 1


def node_order(nodes: Sequence[TraceNode], seed: int) -> list[TraceNode]:
    """The nodes in the seed's order (independent of the pods' shuffle)."""
    order = list(nodes)
    random.Random(f"nodes-{seed}").shuffle(order)
    return order


def trace_shapes(pods: Sequence[TracePod]) -> dict[PodShape, float]:
    """The trace's pod-shape distribution (counts per shape; CPU-only tasks included)."""
    counts = Counter(
        PodShape(p.cpu_milli, p.gpu_milli if p.num_gpu else 0, p.num_gpu, p.gpu_spec) for p in pods
    )
    return {shape: float(n) for shape, n in counts.items()}


def prepare_config(
    config: SchedulerConfiguration,
    shapes: Mapping[PodShape, float] | None,
    seed: int,
) -> SchedulerConfiguration:
    """``config`` with GPUFragmentation's target workload fixed to ``shapes`` (no learning
    window; ``None`` keeps the profile's own, learned from the pods as they arrive) and its
    random seed set, in every profile that configures or enables it."""
    profiles = []
    for profile in config.profiles:
        if not _uses(profile.plugins, GPU_FRAGMENTATION) and not any(
            c.name == GPU_FRAGMENTATION for c in profile.plugin_config
        ):
            profiles.append(profile)
            continue
        args: dict[str, Any] = dict(profile.args_for(GPU_FRAGMENTATION))
        if shapes is not None:
            old = dict(args.get("targetWorkload") or {})
            keep = {k: old[k] for k in ("popularity",) if k in old}
            args["targetWorkload"] = workload_args(shapes, window=0, **keep)
        args["randomSeed"] = seed
        others = tuple(c for c in profile.plugin_config if c.name != GPU_FRAGMENTATION)
        profiles.append(
            dataclasses.replace(
                profile, plugin_config=(*others, PluginConfig(GPU_FRAGMENTATION, args))
            )
        )
    return dataclasses.replace(config, profiles=tuple(profiles))


def _uses(plugins: Plugins, name: str) -> bool:
    return any(
        ref.name == name
        for ep in (*Plugins.EXTENSION_POINTS, "multi_point")
        for ref in getattr(plugins, ep).enabled
    )


@dataclass(slots=True)
class ReplayResult:
    """Per arriving pod (in arrival order): the meter's readings after it, and where it went."""

    capacity_milli: int
    arrived: npt.NDArray[np.int64]
    allocated: npt.NDArray[np.int64]
    fragmented: npt.NDArray[np.float64]
    occupied: npt.NDArray[np.int64]
    nodes: list[str] = field(default_factory=list)
    """The node of each pod, "" when it fitted nowhere."""
    seconds: float = 0.0

    @property
    def scheduled(self) -> int:
        return sum(1 for n in self.nodes if n)

    @property
    def failed(self) -> int:
        return len(self.nodes) - self.scheduled


def replay(
    nodes: Sequence[TraceNode],
    pods: Sequence[ArrivingPod],
    config: SchedulerConfiguration,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
    metric_shapes: Mapping[PodShape, float],
    *,
    seed: int = 0,
    popularity: float = 0.95,
    progress: ProgressFn | None = None,
) -> ReplayResult:
    """Schedule ``pods`` one at a time on ``nodes`` with ``config``'s first profile."""
    scheduler_name = config.profiles[0].scheduler_name
    cluster = InMemoryCluster()
    for node in nodes:
        cluster.apply_node(node_object(node))
        device = device_object(node)
        if device is not None:
            cluster.apply_device(device)
    workload = Workload.of(typical_shapes(metric_shapes, popularity))
    meter = FragmentationMeter(list(cluster.nodes.values()), cluster.devices, workload)
    sched = simulated_scheduler(config, cluster, registry, default_plugins, seed)
    n = len(pods)
    arrived = np.zeros(n, np.int64)
    allocated = np.zeros(n, np.int64)
    fragmented = np.zeros(n, np.float64)
    occupied = np.zeros(n, np.int64)
    placed: list[str] = []
    total_arrived = 0
    start = time.perf_counter()
    try:
        for i, item in enumerate(pods):
            pod = cluster.apply_pod(pod_object(item.pod, scheduler_name, name=item.name))
            sched.run_until_idle()
            bound = cluster.pods[pod.key]
            if bound.node_name:
                raw = bound.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
                uses = uses_from_annotation(raw) if raw else ()
                meter.place(bound.node_name, bound.requests.get(CPU, 0), uses)
            else:
                cluster.delete_pod(pod.key)
            placed.append(bound.node_name)
            total_arrived += item.pod.total_gpu_milli
            arrived[i] = total_arrived
            allocated[i] = meter.allocated_milli
            fragmented[i] = meter.fragmented_milli
            occupied[i] = meter.occupied_nodes
            if progress is not None:
                progress(i + 1, n)
    finally:
        sched.close()
    seconds = time.perf_counter() - start
    return ReplayResult(
        meter.capacity_milli, arrived, allocated, fragmented, occupied, placed, seconds
    )
