"""runtimehooks.hooks.gpu: allocation annotation -> GPU environment (pure)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, DeviceAllocation, encode_allocations
from runtimehooks.context import ContainerContext, HookInputError
from runtimehooks.hooks.gpu import (
    DEFAULT_HAMI_CORE_LIBRARY,
    GPUHook,
    GPUHookOptions,
    VisibleDevicesBy,
    gpu_env_delta,
)

GI = 1 << 30
UUIDS = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
HAMI = {"koordinator.sh/gpu-isolation-provider": "HAMi-core"}


def card(minor: int, core: int = 100, ratio: int = 100, memory: int = 16 * GI) -> DeviceAllocation:
    resources = {
        "koordinator.sh/gpu-core": core,
        "koordinator.sh/gpu-memory": memory,
        "koordinator.sh/gpu-memory-ratio": ratio,
    }
    return DeviceAllocation.from_ints(minor, resources, id=UUIDS[minor])


def allocated(*cards: DeviceAllocation, **other: list[DeviceAllocation]) -> dict[str, str]:
    allocs: dict[str, list[DeviceAllocation]] = {"gpu": list(cards), **other} if cards else other
    return {ANNOTATION_DEVICE_ALLOCATED: encode_allocations(allocs)}


CASES = [
    pytest.param({}, {}, GPUHookOptions(), {}, id="no-annotation"),
    pytest.param(allocated(rdma=[DeviceAllocation(0)]), {}, GPUHookOptions(), {},
                 id="no-gpu-allocation"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[]}'}, {}, GPUHookOptions(), {},
                 id="empty-gpu-list"),
    pytest.param(allocated(card(1)), {}, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "1"}, id="one-card"),
    pytest.param(allocated(card(2), card(0), card(1)), {}, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "2,0,1"}, id="several-cards-annotation-order"),
    pytest.param(allocated(card(2), card(0)), {}, GPUHookOptions(visible_devices_by="uuid"),  # type: ignore[arg-type]
                 {"NVIDIA_VISIBLE_DEVICES": "GPU-cccc,GPU-aaaa"}, id="uuid-mode"),
    pytest.param(allocated(card(0, core=50, ratio=50, memory=8 * GI)), {}, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "0"}, id="shared-without-hami-label"),
    pytest.param(allocated(card(0, core=50, ratio=50, memory=8 * GI)), HAMI, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_MEMORY_LIMIT": str(8 * GI),
                  "CUDA_DEVICE_SM_LIMIT": "50", "LD_PRELOAD": DEFAULT_HAMI_CORE_LIBRARY},
                 id="hami-shared"),
    pytest.param(allocated(card(1, core=25, ratio=25, memory=4 * GI),
                             card(2, core=25, ratio=25, memory=4 * GI)),
                 HAMI, GPUHookOptions(hami_core_library="/opt/hami/libvgpu.so"),
                 {"NVIDIA_VISIBLE_DEVICES": "1,2", "CUDA_DEVICE_MEMORY_LIMIT": str(4 * GI),
                  "CUDA_DEVICE_SM_LIMIT": "25", "LD_PRELOAD": "/opt/hami/libvgpu.so"},
                 id="hami-shared-over-two-cards-custom-library"),
    pytest.param(allocated(card(0), card(1)), HAMI, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "0,1"}, id="hami-whole-cards"),
    pytest.param(allocated(card(0, core=50, ratio=100)), HAMI, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "0"}, id="hami-full-memory-is-not-shared"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":0,"resources":{'
                  '"koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}'},
                 HAMI, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_MEMORY_LIMIT": str(8 * GI),
                  "LD_PRELOAD": DEFAULT_HAMI_CORE_LIBRARY}, id="hami-memory-only"),
    pytest.param(allocated(card(0, core=50, ratio=50)),
                 {"koordinator.sh/gpu-isolation-provider": "other"}, GPUHookOptions(),
                 {"NVIDIA_VISIBLE_DEVICES": "0"}, id="other-isolation-provider"),
]  # fmt: skip


@pytest.mark.parametrize(("pod_annotations", "pod_labels", "options", "want"), CASES)
def test_gpu_env_delta(
    pod_annotations: Mapping[str, str],
    pod_labels: Mapping[str, str],
    options: GPUHookOptions,
    want: dict[str, str],
) -> None:
    assert gpu_env_delta(pod_annotations, pod_labels, options) == want


ERRORS = [
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: "{not json"}, {}, GPUHookOptions(),
                 "invalid scheduling.koordinator.sh/device-allocated annotation", id="bad-json"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: ""}, {}, GPUHookOptions(),
                 "invalid scheduling.koordinator.sh/device-allocated annotation", id="empty"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":"zero"}]}'}, {},
                 GPUHookOptions(), r"gpu\[0\]\.minor", id="minor-not-an-integer"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}'}, {},
                 GPUHookOptions(visible_devices_by=VisibleDevicesBy.UUID),
                 r"gpu\[0\] \(minor 0\) has no id", id="uuid-mode-without-id"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":0,"resources":{}}]}'}, HAMI,
                 GPUHookOptions(), "no koordinator.sh/gpu-memory-ratio", id="hami-without-ratio"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":0,"resources":'
                  '{"koordinator.sh/gpu-memory-ratio":"50"}}]}'}, HAMI,
                 GPUHookOptions(), "no koordinator.sh/gpu-memory,", id="hami-without-memory"),
]  # fmt: skip


@pytest.mark.parametrize(("pod_annotations", "pod_labels", "options", "match"), ERRORS)
def test_gpu_env_delta_errors(
    pod_annotations: Mapping[str, str],
    pod_labels: Mapping[str, str],
    options: GPUHookOptions,
    match: str,
) -> None:
    with pytest.raises(HookInputError, match=match):
        gpu_env_delta(pod_annotations, pod_labels, options)


def test_hook_merges_into_existing_envs() -> None:
    ctx = ContainerContext(
        pod_annotations=allocated(card(0)),
        container_envs={"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": "all"},
    )
    out = GPUHook()(ctx)
    assert out.container_envs == {"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": "0"}
    assert ctx.container_envs["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_hook_without_allocation_returns_same_context() -> None:
    ctx = ContainerContext(container_envs={"A": "1"})
    assert GPUHook()(ctx) is ctx


def test_options_validate() -> None:
    with pytest.raises(ValueError):
        GPUHookOptions(visible_devices_by="index")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        GPUHookOptions(hami_core_library="")
