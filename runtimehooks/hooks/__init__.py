"""The node agent's runtime hooks and the default wiring of them.

Role: ``new_default_registry`` is what ``koordlet run`` registers: the GPU hook at
PreCreateContainer, the RDMA hook (when the agent gives it a sysfs root; with a CDI directory
also its spec cleanup at PostStopPodSandbox), and after them the
fair-share (Gemini) hook when the agent serves one.
Each hook lives in its own module and depends only on ``runtimehooks.context`` and ``apis``
(never on protobuf or grpc).

Invariants: importing this package registers nothing; every call builds a fresh registry.
"""

from __future__ import annotations

from runtimehooks.hooks.fairshare import HOOK_NAME as FAIRSHARE_HOOK_NAME
from runtimehooks.hooks.fairshare import FairShareHook
from runtimehooks.hooks.gpu import HOOK_NAME as GPU_HOOK_NAME
from runtimehooks.hooks.gpu import GPUHook, GPUHookOptions
from runtimehooks.hooks.rdma import CLEANUP_HOOK_NAME as RDMA_CLEANUP_HOOK_NAME
from runtimehooks.hooks.rdma import HOOK_NAME as RDMA_HOOK_NAME
from runtimehooks.hooks.rdma import RDMAHook
from runtimehooks.ports import (
    DenialSink,
    KubeletAllocations,
    KubeletDeviceSink,
    PodAdmission,
    PodSource,
)
from runtimehooks.registry import FailurePolicy, HookObserver, HookRegistry, Stage

__all__ = ["new_default_registry"]


def new_default_registry(
    gpu: GPUHookOptions | None = None,
    observer: HookObserver | None = None,
    gpu_policy: FailurePolicy = FailurePolicy.FAIL,
    fairshare: FairShareHook | None = None,
    *,
    pods: PodSource | None = None,
    denials: DenialSink | None = None,
    kubelet_devices: KubeletDeviceSink | None = None,
    admission: PodAdmission | None = None,
    rdma: RDMAHook | None = None,
    kubelet_allocations: KubeletAllocations | None = None,
) -> HookRegistry:
    """A registry with the default hooks: the GPU hook at PreCreateContainer (per container
    and failing closed when ``pods`` is given, see ``runtimehooks.hooks.gpu``)."""
    registry = HookRegistry(observer=observer)
    hook = GPUHook(
        gpu, pods=pods, denials=denials, kubelet_devices=kubelet_devices, admission=admission,
        kubelet_allocations=kubelet_allocations,
    )
    registry.register_container_hook(Stage.PRE_CREATE_CONTAINER, GPU_HOOK_NAME, hook, gpu_policy)
    if rdma is not None:  # fails closed itself: no device rather than a wrong one
        registry.register_container_hook(
            Stage.PRE_CREATE_CONTAINER, RDMA_HOOK_NAME, rdma, FailurePolicy.FAIL
        )
        if rdma.cdi is not None:  # the pod's CDI specs go with its sandbox
            registry.register_sandbox_hook(
                Stage.POST_STOP_POD_SANDBOX, RDMA_CLEANUP_HOOK_NAME, rdma.stop_sandbox,
                FailurePolicy.IGNORE,
            )
    if fairshare is not None:  # fail closed: an opted-in pod is never run unthrottled
        registry.register_container_hook(
            Stage.PRE_CREATE_CONTAINER, FAIRSHARE_HOOK_NAME, fairshare, FailurePolicy.FAIL
        )
    return registry
