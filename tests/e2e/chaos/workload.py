"""The chaos tier's cluster and workload, and the checks made from API objects alone.

Cluster: ``NODES`` nodes x 8 GPUs (16/40/80 GiB cards by node, as B1), each with its Device CR;
every 20th node's Device carries a ``node.koordinator.sh/devices-checkpoints`` entry that holds
card 0 for a kubelet-allocated pod (the scheduler must treat that card as full).

Pods: the B1 GPU mix (30% gpu-core 50 + ratio 50, 20% gpu-core 25 + gpu-memory 4Gi, 30%
nvidia.com/gpu 1, 10% nvidia.com/gpu 2, 10% CPU-only), each with cpu 1 and memory 4Gi. A GPU
pod names no scheduler (koord-webhook's mutate gives it the tier's); a CPU-only pod names the
scheduler itself, because mutate leaves pods that ask for no GPU alone by design (the API
server would default them to ``default-scheduler``, which the tier does not run).

Checks (``card_usage``, ``over_committed``, ``fits_somewhere``) read only the API objects:
bound pods' ``scheduling.koordinator.sh/device-allocated`` annotations and the Device CRs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.test_scheduler_harness import (
    ALLOCATED,
    DEVICES,
    GIB,
    GPU_CORE,
    GPU_MEMORY,
    GPU_RATIO,
    Kube,
    gpu_pod,
)

CHECKPOINTS = "node.koordinator.sh/devices-checkpoints"
GPUS_PER_NODE = 8
CARD_GI = (16, 40, 80)
WHOLE_GPU = "nvidia.com/gpu"


def node_name(run: str, i: int) -> str:
    return f"{run}-n{i:03d}"


def card_gi(i: int) -> int:
    return CARD_GI[i % 3]


def has_checkpoint(i: int) -> bool:
    return i % 20 == 7


def add_node(kube: Kube, run: str, i: int, labels: Mapping[str, str]) -> None:
    name = node_name(run, i)
    kube.add_gpu_node(name, gpus=GPUS_PER_NODE, memory=f"{card_gi(i)}Gi", labels=labels)
    if has_checkpoint(i):
        entry = {
            "podUID": f"kubelet-held-{name}",
            "containerName": "main",
            "resourceName": WHOLE_GPU,
            "deviceIDs": [f"GPU-{name}-0"],
        }
        kube.patch(
            f"{DEVICES}/{name}",
            {"metadata": {"annotations": {CHECKPOINTS: json.dumps([entry])}}},
        )


def b1_limits(rng: random.Random) -> dict[str, str]:
    base = {"cpu": "1", "memory": "4Gi"}
    r = rng.random()
    if r < 0.3:
        return base | {GPU_CORE: "50", GPU_RATIO: "50"}
    if r < 0.5:
        return base | {GPU_CORE: "25", GPU_MEMORY: "4Gi"}
    if r < 0.8:
        return base | {WHOLE_GPU: "1"}
    if r < 0.9:
        return base | {WHOLE_GPU: "2"}
    return base


CPU_MEMORY = ("cpu", "memory")


def asks_for_gpu(limits: Mapping[str, str]) -> bool:
    """Whether a B1 pod asks for a device (anything beyond cpu and memory); decided here, not
    by the webhook's own policy, so that the tier checks the webhook instead of trusting it."""
    return any(name not in CPU_MEMORY for name in limits)


def b1_pod(
    name: str, scheduler: str, limits: Mapping[str, str], selector: Mapping[str, str]
) -> dict[str, Any]:
    """A workload pod: ``scheduler`` named only when it asks for no GPU (see the module doc)."""
    pod = gpu_pod(name, scheduler, limits, node_selector=selector)
    if asks_for_gpu(limits):
        del pod["spec"]["schedulerName"]  # the webhook's to give
    return pod


@dataclass
class Card:
    node: str
    minor: int
    memory: int  # bytes
    checkpointed: bool
    core: int = 0
    ratio: int = 0
    used_memory: int = 0
    pods: list[str] = field(default_factory=list)

    @property
    def free(self) -> bool:
        return not self.checkpointed and self.core == 0 and self.ratio == 0 and not self.pods

    def over(self) -> list[str]:
        out = []
        if self.core > 100:
            out.append(f"gpu-core {self.core}/100")
        if self.ratio > 100:
            out.append(f"gpu-memory-ratio {self.ratio}/100")
        if self.used_memory > self.memory:
            out.append(f"gpu-memory {self.used_memory // GIB}Gi/{self.memory // GIB}Gi")
        if self.checkpointed and self.pods:
            out.append("held by a kubelet checkpoint and allocated to pods")
        return out


def cards_from_devices(devices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Card]:
    cards: dict[tuple[str, int], Card] = {}
    for dev in devices:
        node = dev["metadata"]["name"]
        held: set[str] = set()
        text = (dev["metadata"].get("annotations") or {}).get(CHECKPOINTS)
        if text:
            for entry in json.loads(text):
                held.update(entry.get("deviceIDs") or [])
        for d in dev["spec"]["devices"]:
            if d.get("type") != "gpu":
                continue
            mem = int(str(d["resources"][GPU_MEMORY]).removesuffix("Gi")) * GIB
            cards[(node, int(d["minor"]))] = Card(node, int(d["minor"]), mem, d["id"] in held)
    return cards


def _quantity(text: str) -> int:
    text = str(text)
    for suffix, mult in (("Gi", GIB), ("Mi", 1024**2), ("Ki", 1024)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(float(text))


def card_usage(
    devices: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, int], Card]:
    """Every card with the sum of the live bound pods' allocations on it."""
    cards = cards_from_devices(devices)
    for pod in pods:
        node = pod["spec"].get("nodeName")
        text = (pod["metadata"].get("annotations") or {}).get(ALLOCATED)
        if not node or not text or pod["metadata"].get("deletionTimestamp"):
            continue
        for alloc in json.loads(text).get("gpu", []):
            card = cards.get((node, int(alloc["minor"])))
            if card is None:
                name = pod["metadata"]["name"]
                raise AssertionError(f"{name} has a card that does not exist: {node}/{alloc}")
            res = alloc.get("resources") or {}
            card.core += int(res.get(GPU_CORE, "0"))
            card.ratio += int(res.get(GPU_RATIO, "0"))
            card.used_memory += _quantity(res.get(GPU_MEMORY, "0"))
            card.pods.append(pod["metadata"]["name"])
    return cards


def over_committed(cards: Mapping[tuple[str, int], Card]) -> dict[str, list[str]]:
    return {f"{c.node}/{c.minor}": c.over() for c in cards.values() if c.over()}


def fits_somewhere(pod: Mapping[str, Any], cards: Mapping[tuple[str, int], Card]) -> bool:
    """Whether a pending pod's GPU request fits the cluster as the API objects describe it
    (cpu, memory and pod count never bind in this workload: ~10 pods per 64-core node)."""
    limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    by_node: dict[str, list[Card]] = {}
    for card in cards.values():
        by_node.setdefault(card.node, []).append(card)
    whole = int(limits.get(WHOLE_GPU, "0"))
    if whole:
        return any(sum(c.free for c in cs) >= whole for cs in by_node.values())
    core = int(limits.get(GPU_CORE, "0"))
    if not core:
        return True
    for card in cards.values():
        if card.checkpointed:
            continue
        if GPU_RATIO in limits:
            ratio = int(limits[GPU_RATIO])
            need_mem = card.memory * ratio // 100
        else:
            need_mem = _quantity(limits[GPU_MEMORY])
            ratio = -(-need_mem * 100 // card.memory)
        if (
            card.core + core <= 100
            and card.ratio + ratio <= 100
            and card.used_memory + need_mem <= card.memory
        ):
            return True
    return False
