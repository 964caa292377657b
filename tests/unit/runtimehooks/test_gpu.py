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


def test_hook_without_allocation_gives_no_gpu() -> None:
    ctx = ContainerContext(container_envs={"A": "1"})
    assert GPUHook()(ctx).container_envs == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "void"}


def test_options_validate() -> None:
    with pytest.raises(ValueError):
        GPUHookOptions(visible_devices_by="index")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        GPUHookOptions(hami_core_library="")


# -- per container, fail closed (a PodSource wired, as koordlet run does) -------------------------

from runtimehooks.context import ContainerMeta, PodMeta  # noqa: E402
from runtimehooks.hooks.gpu import NO_GPU, container_env_delta, device_plugin_ids  # noqa: E402
from runtimehooks.ports import (  # noqa: E402
    REASON_INTERNAL_ERROR,
    REASON_INVALID_ALLOCATION,
    REASON_POD_LOOKUP_ERROR,
    REASON_POD_NOT_FOUND,
    ContainerKind,
    ContainerSpec,
    Denial,
    PodLookupError,
    PodSpec,
)

POD = PodMeta("train", "uid-1", "ns")
INIT, SIDECAR, APP = ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP


def c(name: str, kind: ContainerKind = APP, **gpu: int) -> ContainerSpec:
    names = {"core": "koordinator.sh/gpu-core", "ratio": "koordinator.sh/gpu-memory-ratio",
             "memory": "koordinator.sh/gpu-memory", "nvidia": "nvidia.com/gpu",
             "koord": "koordinator.sh/gpu", "aliyun": "aliyun.com/gpu-mem"}  # fmt: skip
    return ContainerSpec(name, kind, {names[k]: v for k, v in gpu.items()})


class FakePods:
    """A PodSource of our port: answers from a dict, or raises what it is told to."""

    def __init__(self, *pods: PodSpec, error: Exception | None = None) -> None:
        self.pods = {p.uid: p for p in pods}
        self.error = error
        self.asked: list[PodMeta] = []

    def pod_spec(self, pod: PodMeta) -> PodSpec:
        self.asked.append(pod)
        if self.error is not None:
            raise self.error
        if pod.uid not in self.pods:
            raise PodLookupError(REASON_POD_NOT_FOUND, f"pod {pod.uid} not found")
        return self.pods[pod.uid]


class Recorder:
    def __init__(self) -> None:
        self.denials: list[Denial] = []
        self.devices: list[tuple[PodMeta, str, tuple[str, ...]]] = []

    def denied(self, denial: Denial) -> None:
        self.denials.append(denial)

    def container_devices(self, pod: PodMeta, container: str, device_ids: tuple[str, ...]) -> None:
        self.devices.append((pod, container, device_ids))


def ctx_of(container: str, annotations: Mapping[str, str], labels: Mapping[str, str] = HAMI,
           envs: Mapping[str, str] | None = None) -> ContainerContext:  # fmt: skip
    return ContainerContext(
        pod_meta=POD,
        container_meta=ContainerMeta(container),
        pod_annotations=annotations,
        pod_labels=labels,
        container_envs=envs if envs is not None else {"NVIDIA_VISIBLE_DEVICES": "all"},
    )


SHARED = allocated(card(0, core=60, ratio=60, memory=12 * GI), card(1, core=60, ratio=60,
                   memory=12 * GI))  # fmt: skip


def hami(visible: str, memory: int, core: int) -> dict[str, str]:
    return {"NVIDIA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_MEMORY_LIMIT": str(memory),
            "CUDA_DEVICE_SM_LIMIT": str(core), "LD_PRELOAD": DEFAULT_HAMI_CORE_LIBRARY}  # fmt: skip


VOID = {"NVIDIA_VISIBLE_DEVICES": NO_GPU}

PER_CONTAINER = [
    pytest.param([c("main", core=120, ratio=120)], "main", hami("0,1", 12 * GI, 60),
                 id="one-container-gets-the-pod-share"),
    pytest.param([c("a", core=80, ratio=40), c("b", core=40, ratio=80)], "a",
                 hami("0,1", 4 * GI, 40), id="two-gpu-containers-first"),
    pytest.param([c("a", core=80, ratio=40), c("b", core=40, ratio=80)], "b",
                 hami("0,1", 8 * GI, 20), id="two-gpu-containers-second"),
    pytest.param([c("a", core=60, ratio=60), c("b", memory=6 * GI)], "b",  # card: 20Gi
                 hami("0,1", 4 * GI, 20), id="bytes-weighed-with-the-card-size"),
    pytest.param([c("a", ratio=30), c("b", ratio=90)], "a",
                 hami("0,1", 3 * GI, 15), id="core-split-like-memory-when-core-not-requested"),
    pytest.param([c("init", INIT), c("main", core=120, ratio=120)], "init", VOID,
                 id="init-container-without-gpu-gets-void"),
    pytest.param([c("init", INIT, core=60, ratio=30), c("main", core=120, ratio=120)], "init",
                 hami("0,1", 12 * GI, 60), id="init-container-with-gpu-runs-alone"),
    pytest.param([c("init", INIT, core=60, ratio=30), c("main", core=120, ratio=120)], "main",
                 hami("0,1", 12 * GI, 60), id="app-not-shared-with-earlier-init"),
    pytest.param([c("proxy", SIDECAR), c("main", core=120, ratio=120)], "proxy", VOID,
                 id="sidecar-without-gpu-gets-void"),
    pytest.param([c("main", core=120, ratio=120), c("logs")], "logs", VOID,
                 id="app-sidecar-without-gpu-gets-void"),
    pytest.param([c("mon", SIDECAR, core=30, ratio=30), c("main", core=90, ratio=90)], "mon",
                 hami("0,1", 3 * GI, 15), id="gpu-sidecar-shares-with-apps"),
    pytest.param([c("mon", SIDECAR, core=30, ratio=30), c("init", INIT, core=30, ratio=30),
                  c("main", core=90, ratio=90)], "init",
                 hami("0,1", 9 * GI, 45), id="init-gets-what-earlier-sidecars-leave"),
    pytest.param([c("mon", SIDECAR, core=30, ratio=30), c("init", INIT, core=30, ratio=30)],
                 "init", VOID, id="init-after-sidecars-holding-everything-gets-void"),
    pytest.param([c("main", core=120, ratio=120)], "debugger", VOID,
                 id="container-not-in-spec-gets-void"),
]  # fmt: skip


@pytest.mark.parametrize(("containers", "name", "want"), PER_CONTAINER)
def test_per_container_environment(
    containers: list[ContainerSpec], name: str, want: dict[str, str]
) -> None:
    pods = FakePods(PodSpec("uid-1", tuple(containers)))
    assert container_env_delta(ctx_of(name, SHARED), pods) == want


def test_whole_cards_go_to_every_gpu_container_only() -> None:
    pods = FakePods(PodSpec("uid-1", (c("a", nvidia=1), c("b", nvidia=1), c("side"))))
    whole = allocated(card(0), card(1))
    assert container_env_delta(ctx_of("a", whole), pods) == {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert container_env_delta(ctx_of("side", whole), pods) == VOID


def test_running_containers_never_exceed_the_pod_share() -> None:
    pods = FakePods(PodSpec("uid-1", (c("a", core=1, ratio=40), c("b", core=1, ratio=40),
                                       c("d", core=118, ratio=40))))  # fmt: skip
    got = [container_env_delta(ctx_of(n, SHARED), pods) for n in "abd"]
    assert sum(int(e["CUDA_DEVICE_MEMORY_LIMIT"]) for e in got) <= 12 * GI
    assert [e["CUDA_DEVICE_SM_LIMIT"] for e in got] == ["1", "1", "59"]  # floored, at least 1


DENIALS = [
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: "{not json"}, FakePods(PodSpec("uid-1")),
                 REASON_INVALID_ALLOCATION, id="unreadable-annotation"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":0,"resources":{}}]}'},
                 FakePods(PodSpec("uid-1", (c("main", core=50, ratio=50),))),
                 REASON_INVALID_ALLOCATION, id="hami-allocation-without-ratio"),
    pytest.param(SHARED, FakePods(), REASON_POD_NOT_FOUND, id="pod-not-found"),
    pytest.param(SHARED, FakePods(error=PodLookupError(REASON_POD_LOOKUP_ERROR, "timed out")),
                 REASON_POD_LOOKUP_ERROR, id="pod-lookup-timed-out"),
    pytest.param(SHARED, FakePods(error=RuntimeError("bug")), REASON_INTERNAL_ERROR,
                 id="unexpected-error"),
]  # fmt: skip


@pytest.mark.parametrize(("annotations", "pods", "reason"), DENIALS)
def test_failures_close_the_container(
    annotations: Mapping[str, str], pods: FakePods, reason: str
) -> None:
    rec = Recorder()
    hook = GPUHook(pods=pods, denials=rec)
    out = hook(ctx_of("main", annotations, envs={"NVIDIA_VISIBLE_DEVICES": "all", "A": "1"}))
    assert out.container_envs == {"NVIDIA_VISIBLE_DEVICES": NO_GPU, "A": "1"}
    assert [(d.pod, d.container, d.reason) for d in rec.denials] == [(POD, "main", reason)]


def test_a_failing_denial_sink_still_closes() -> None:
    class Broken:
        def denied(self, denial: Denial) -> None:
            raise OSError("queue full")

    out = GPUHook(pods=FakePods(), denials=Broken())(ctx_of("main", SHARED))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU


def test_pods_without_allocation_are_not_looked_up() -> None:
    pods = FakePods()
    ctx = ctx_of("main", {}, envs={"PATH": "/bin"})
    out = GPUHook(pods=pods)(ctx)
    assert out.container_envs == {"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": NO_GPU}
    assert pods.asked == []


KUBELET_IDS = [
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-a::1,GPU-b"}, ("GPU-a::1", "GPU-b"), id="ids"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "0, 1,0"}, ("0", "1"), id="indexes-deduplicated"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "all"}, (), id="all-is-not-an-id"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "void"}, (), id="void"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "none"}, (), id="none"),
    pytest.param({}, (), id="absent"),
]  # fmt: skip


@pytest.mark.parametrize(("envs", "want"), KUBELET_IDS)
def test_device_plugin_ids(envs: Mapping[str, str], want: tuple[str, ...]) -> None:
    assert device_plugin_ids(envs) == want


def test_kubelet_allocated_gpus_are_reported_and_env_unchanged() -> None:
    class Kubelet:
        def gpu_devices(self, pod: PodMeta, container: str) -> tuple[str, ...]:
            return ("MIG-1234",) if (pod.uid, container) == ("uid-1", "cuda") else ()

    rec = Recorder()
    ctx = ctx_of("cuda", {}, envs={"NVIDIA_VISIBLE_DEVICES": "MIG-1234"})
    hook = GPUHook(pods=FakePods(), kubelet_devices=rec, kubelet_allocations=Kubelet())
    assert hook(ctx) is ctx
    assert rec.devices == [(POD, "cuda", ("MIG-1234",))]


def gpushare_annotations(idx: int, pod_units: int, dev_units: int = 16) -> dict[str, str]:
    return {
        **allocated(card(idx, core=0, ratio=100 * pod_units // dev_units, memory=pod_units * GI)),
        "ALIYUN_COM_GPU_MEM_IDX": str(idx),
        "ALIYUN_COM_GPU_MEM_POD": str(pod_units),
        "ALIYUN_COM_GPU_MEM_DEV": str(dev_units),
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
    }


def test_gpushare_pods_of_the_same_size_each_get_their_own_card() -> None:
    # gpushare's Allocate matches pods by size and can swap these two; the hook knows the pod.
    a = PodSpec("uid-a", (c("main", aliyun=4),))
    b = PodSpec("uid-b", (c("main", aliyun=4),))
    pods = FakePods(a, b)
    envs = {}
    for uid, idx in (("uid-a", 0), ("uid-b", 1)):
        ctx = ContainerContext(
            pod_meta=PodMeta(uid, uid, "ns"),
            container_meta=ContainerMeta("main"),
            pod_annotations=gpushare_annotations(idx, 4),
            pod_labels={},
            container_envs={},
        )
        envs[uid] = container_env_delta(ctx, pods)
    assert envs["uid-a"] == {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_POD": "4",
        "ALIYUN_COM_GPU_MEM_DEV": "16",
        "ALIYUN_COM_GPU_MEM_CONTAINER": "4",
    }
    assert envs["uid-b"]["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert envs["uid-b"]["ALIYUN_COM_GPU_MEM_IDX"] == "1"


def test_gpushare_multi_container_pods_get_each_containers_own_units() -> None:
    pods = FakePods(PodSpec("uid-1", (c("a", aliyun=2), c("b", aliyun=6), c("side"))))
    ann = gpushare_annotations(1, 8)
    got = {name: container_env_delta(ctx_of(name, ann, labels={}), pods) for name in "ab"}
    assert got["a"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
    assert got["b"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "6"
    assert got["a"]["ALIYUN_COM_GPU_MEM_POD"] == got["b"]["ALIYUN_COM_GPU_MEM_POD"] == "8"
    assert container_env_delta(ctx_of("side", ann, labels={}), pods) == VOID


def test_a_malformed_gpushare_annotation_closes_the_container() -> None:
    pods = FakePods(PodSpec("uid-1", (c("main", aliyun=2),)))
    ann = {**gpushare_annotations(0, 2), "ALIYUN_COM_GPU_MEM_IDX": "zero"}
    recorder = Recorder()
    hook = GPUHook(pods=pods, denials=recorder)
    out = hook(ctx_of("main", ann, labels={}))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU
    assert "ALIYUN_COM_GPU_MEM_IDX" in recorder.denials[0].message


# -- node-side admission (a PodAdmission wired, as koordlet run does) ----------------------------

from runtimehooks.ports import (  # noqa: E402
    REASON_ADMISSION_NOT_READY,
    REASON_DEVICE_OVERCOMMIT,
    AdmissionRefused,
)


class FakeAdmission:
    """Admits the uids it is given; refuses every other pod with ``reason``."""

    def __init__(self, *admit: str, reason: str = REASON_DEVICE_OVERCOMMIT) -> None:
        self.admit_uids = set(admit)
        self.reason = reason
        self.asked: list[tuple[PodMeta, str]] = []

    def admit(self, pod: PodMeta, allocation: str) -> None:
        self.asked.append((pod, allocation))
        if pod.uid not in self.admit_uids:
            raise AdmissionRefused(self.reason, f"card 0 over-committed by {pod.name}")


TRAIN = PodSpec("uid-1", (c("setup", INIT), c("main", core=60, ratio=60)))


@pytest.mark.parametrize("reason", [REASON_DEVICE_OVERCOMMIT, REASON_ADMISSION_NOT_READY])
def test_a_refused_pod_container_gets_no_gpu(reason: str) -> None:
    rec, admission = Recorder(), FakeAdmission(reason=reason)
    hook = GPUHook(pods=FakePods(TRAIN), denials=rec, admission=admission)
    out = hook(ctx_of("main", SHARED, labels={}))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU
    assert [(d.pod, d.container, d.reason) for d in rec.denials] == [(POD, "main", reason)]
    assert "over-committed" in rec.denials[0].message
    assert admission.asked == [(POD, SHARED["scheduling.koordinator.sh/device-allocated"])]


def test_an_admitted_pod_container_gets_its_cards() -> None:
    rec, admission = Recorder(), FakeAdmission("uid-1")
    hook = GPUHook(pods=FakePods(TRAIN), denials=rec, admission=admission)
    out = hook(ctx_of("main", SHARED, labels={}))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert rec.denials == []


def test_a_container_that_gets_no_card_does_not_ask_admission() -> None:
    admission = FakeAdmission()
    hook = GPUHook(pods=FakePods(TRAIN), denials=Recorder(), admission=admission)
    out = hook(ctx_of("setup", SHARED, labels={}))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU
    assert admission.asked == []


def test_a_failing_admission_closes_the_container() -> None:
    class Broken:
        def admit(self, pod: PodMeta, allocation: str) -> None:
            raise RuntimeError("bug")

    rec = Recorder()
    out = GPUHook(pods=FakePods(TRAIN), denials=rec, admission=Broken())(
        ctx_of("main", SHARED, labels={})
    )
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU
    assert [d.reason for d in rec.denials] == [REASON_INTERNAL_ERROR]
