"""GPU-model constraints added to a trace: the "constrained-model" test family of B3.

Role: build variants of an openb pod list in which a growing share of the GPU tasks may only
run on some GPU models, the way the FGD paper's GPU-type experiments do (§6.5; the published
``openb_pod_list_gpuspec{05,10,20,25,33}.csv`` are the default rows with ``gpu_spec`` filled in
for about that share of GPU tasks, e.g. ``V100M16|V100M32``), so that a policy can be measured
as constraints grow (``bench/b3_fragmentation.py --models 0,20,40,60,80``).

How a variant is made (``constrain``): of the GPU tasks without a ``gpu_spec``,
``round(share x count)`` are drawn at random (seeded); each gets the models of one *model
group* — the cluster's GPU models, the two V100 memory sizes together as in the published
traces — drawn with probability proportional to the group's GPU count, among the groups that
have a node able to hold the task alone (enough cards, cpu and memory), so that constrained
demand follows supply and no task is made impossible. The published gpuspec files are not
shipped here, and the paper does not spell out its draw: this is our reading of it.

Invariants: pure functions of their inputs (the same pods, nodes, share and seed give the same
variant); only ``gpu_spec`` changes, and only on GPU tasks that had none; every constrained
task has at least one node of its models that could hold it on an empty cluster.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from scheduler.simulator.trace import TraceNode, TracePod

__all__ = ["MODEL_GROUPS", "constrain", "model_groups", "write_pods"]

MODEL_GROUPS: Final = (("V100M16", "V100M32"),)
"""Models that a constrained task accepts together (the published traces' ``V100M16|V100M32``);
every other model is a group of its own."""

POD_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


def model_groups(nodes: Sequence[TraceNode]) -> dict[tuple[str, ...], int]:
    """The cluster's model groups and the GPUs each has, in a canonical order."""
    joined = {m: group for group in MODEL_GROUPS for m in group}
    gpus: dict[tuple[str, ...], int] = {}
    for node in nodes:
        if node.gpus and node.model:
            group = joined.get(node.model, (node.model,))
            gpus[group] = gpus.get(group, 0) + node.gpus
    return dict(sorted(gpus.items()))


def _can_hold(node: TraceNode, pod: TracePod) -> bool:
    return (
        node.gpus >= pod.num_gpu
        and node.cpu_milli >= pod.cpu_milli
        and node.memory_mib >= pod.memory_mib
    )


def constrain(
    pods: Sequence[TracePod], nodes: Sequence[TraceNode], share: float, seed: int
) -> list[TracePod]:
    """``pods`` with ``round(share x GPU tasks without a spec)`` of them constrained to one
    model group each (see the module docstring); ``share`` in [0, 1]."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    rng = random.Random(seed)
    groups = model_groups(nodes)
    by_group = {
        group: [n for n in nodes if n.model in group and n.gpus] for group in groups
    }
    free = [i for i, p in enumerate(pods) if p.num_gpu > 0 and not p.gpu_spec]
    chosen = sorted(rng.sample(free, round(share * len(free))))
    out = list(pods)
    for i in chosen:
        pod = pods[i]
        eligible = [g for g in groups if any(_can_hold(n, pod) for n in by_group[g])]
        if not eligible:
            continue
        group = rng.choices(eligible, weights=[groups[g] for g in eligible])[0]
        out[i] = replace(pod, gpu_spec=group)
    return out


def write_pods(path: str | os.PathLike[str], pods: Sequence[TracePod]) -> None:
    """Write ``pods`` as an openb pod list (the columns ``read_pods`` needs, and gpu_spec)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(POD_COLUMNS)
        for p in pods:
            spec = "|".join(p.gpu_spec)
            writer.writerow([p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, spec])
