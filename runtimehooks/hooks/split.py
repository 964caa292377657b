"""PURE: which containers of a pod are GPU containers, and their share of the pod's cards.

Role: the per-container rule of the GPU hook (``docs/node.md``, "Per-container GPUs").  The
scheduler allocates per pod; a pod's cards go to the containers that request GPU resources,
and under HAMi-core the pod's per-card memory and compute are split among the GPU containers
that can run at the same time, in proportion to their requests.

Invariants:

- A container is a GPU container when its requests (or limits) name a GPU resource with a
  positive amount (``GPU_RESOURCES``); any other container gets no GPU.
- Containers that run together: the app containers and the sidecars (init containers with
  ``restartPolicy: Always``) form one group and split the pod's amounts (shares sum to 1).
  A plain init container runs alone, next to the sidecars declared before it only: it gets
  what those sidecars leave (1 minus their shares; possibly 0).  So the containers running at
  any moment never exceed what the pod was given on a card.
- Within the group a dimension (memory, compute) is split by the containers' requests of that
  dimension when every container of the group has one; otherwise by their requests of the
  other dimension when every container has that; otherwise equally.
- Memory requests are compared in percent of a card: ``gpu-memory`` bytes (and
  ``aliyun.com/gpu-mem`` GiB) are converted with the card size the allocation implies
  (``gpu-memory * 100 / gpu-memory-ratio``).  Exact fractions, no floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from apis.resources import GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, KOORD_GPU, NVIDIA_GPU
from runtimehooks.ports import ContainerKind, ContainerSpec, PodSpec

__all__ = ["ALIYUN_GPU_MEM", "GPU_RESOURCES", "Share", "container_share", "gpu_containers"]

ALIYUN_GPU_MEM: Final = "aliyun.com/gpu-mem"
GPU_RESOURCES: Final = frozenset(
    {
        NVIDIA_GPU,
        KOORD_GPU,
        "koordinator.sh/gpu.shared",
        GPU_CORE,
        GPU_MEMORY,
        GPU_MEMORY_RATIO,
        ALIYUN_GPU_MEM,
    }
)
"""Container resources that ask for a GPU (SPEC sections 3 and 10)."""

_GIB: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class Share:
    """A container's fraction of the pod's per-card memory and compute (0 <= x <= 1; 0 only
    for an init container whose earlier sidecars hold everything)."""

    memory: Fraction
    core: Fraction


def gpu_containers(pod: PodSpec) -> tuple[ContainerSpec, ...]:
    """The pod's GPU containers, in pod order."""
    return tuple(c for c in pod.containers if c.requests_gpu)


def _long_running(pod: PodSpec) -> list[ContainerSpec]:
    return [c for c in gpu_containers(pod) if c.kind is not ContainerKind.INIT]


def _memory_weight(req: Mapping[str, int], card_bytes: Fraction | None) -> Fraction | None:
    for name, scale in ((NVIDIA_GPU, 100), (KOORD_GPU, 1), (GPU_MEMORY_RATIO, 1)):
        if req.get(name, 0) > 0:
            return Fraction(req[name] * scale)
    if card_bytes:
        if req.get(GPU_MEMORY, 0) > 0:
            return Fraction(req[GPU_MEMORY] * 100) / card_bytes
        if req.get(ALIYUN_GPU_MEM, 0) > 0:
            return Fraction(req[ALIYUN_GPU_MEM] * _GIB * 100) / card_bytes
    return None


def _core_weight(req: Mapping[str, int]) -> Fraction | None:
    for name, scale in ((NVIDIA_GPU, 100), (KOORD_GPU, 1), (GPU_CORE, 1)):
        if req.get(name, 0) > 0:
            return Fraction(req[name] * scale)
    return None


def _fractions(weights: list[Fraction | None], fallback: list[Fraction | None]) -> list[Fraction]:
    for ws in (weights, fallback):
        if all(w is not None for w in ws):
            full = [w for w in ws if w is not None]
            total = sum(full, Fraction(0))
            return [w / total for w in full]
    return [Fraction(1, len(weights))] * len(weights)


def _group_share(
    group: list[ContainerSpec], container: ContainerSpec, card_bytes: Fraction | None
) -> Share:
    i = next(k for k, c in enumerate(group) if c is container)
    mem = [_memory_weight(c.gpu_requests, card_bytes) for c in group]
    core = [_core_weight(c.gpu_requests) for c in group]
    return Share(memory=_fractions(mem, core)[i], core=_fractions(core, mem)[i])


def container_share(pod: PodSpec, container: ContainerSpec, card_bytes: Fraction | None) -> Share:
    """``container``'s share (it must be a GPU container of ``pod``); ``card_bytes`` is the
    card size the allocation implies (None when unknown: byte requests then weigh nothing)."""
    group = _long_running(pod)
    if container.kind is not ContainerKind.INIT:
        return _group_share(group, container, card_bytes)
    memory, core = Fraction(1), Fraction(1)
    for c in pod.containers:
        if c is container:
            break
        if c.kind is ContainerKind.SIDECAR and c.requests_gpu:
            taken = _group_share(group, c, card_bytes)
            memory, core = memory - taken.memory, core - taken.core
    return Share(memory=max(memory, Fraction(0)), core=max(core, Fraction(0)))
