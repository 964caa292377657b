"""runtimehooks.hooks.gpu: a container sees exactly the GPUs an allocator of the node gave it.

Issue 45, finding 2: containers of pods without our ``device-allocated`` annotation used to be
echoed unchanged, so a CPU pod on a CUDA image (``NVIDIA_VISIBLE_DEVICES=all`` from the image),
a pod bound by ``spec.nodeName`` asking ``koordinator.sh/gpu-core: 100``, and a CPU pod setting
``NVIDIA_VISIBLE_DEVICES=1`` all saw cards nobody gave them.  Now only the kubelet's
device-plugin allocation (its checkpoint, through ``KubeletAllocations``) or our annotation
selects devices; everything else is voided.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, DeviceAllocation, encode_allocations
from runtimehooks.context import ContainerContext, ContainerMeta, HookInputError, PodMeta
from runtimehooks.hooks.gpu import (
    ANNOTATION_CDI_GPU,
    CUDA_NO_DEVICE,
    NO_GPU,
    REFUSED_CDI_DEVICE,
    GPUHook,
    GPUHookOptions,
    selected_devices,
)
from runtimehooks.ports import REASON_GPU_NOT_ALLOCATED, Denial

POD = PodMeta("job", "uid-7", "tenant-b")


class Grants:
    """``KubeletAllocations`` over a dict (pod uid, container) -> ids; or raising."""

    def __init__(self, grants: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
                 error: Exception | None = None) -> None:  # fmt: skip
        self.grants = dict(grants or {})
        self.error = error
        self.asked: list[tuple[str, str]] = []

    def gpu_devices(self, pod: PodMeta, container: str) -> tuple[str, ...]:
        self.asked.append((pod.uid, container))
        if self.error is not None:
            raise self.error
        return self.grants.get((pod.uid, container), ())


class Recorder:
    def __init__(self) -> None:
        self.denials: list[Denial] = []
        self.devices: list[tuple[str, tuple[str, ...]]] = []

    def denied(self, denial: Denial) -> None:
        self.denials.append(denial)

    def container_devices(self, pod: PodMeta, container: str, device_ids: tuple[str, ...]) -> None:
        self.devices.append((container, device_ids))


def ctx(envs: Mapping[str, str], *, container: str = "main",
        annotations: Mapping[str, str] | None = None,
        container_annotations: Mapping[str, str] | None = None) -> ContainerContext:  # fmt: skip
    return ContainerContext(
        pod_meta=POD,
        container_meta=ContainerMeta(container),
        pod_annotations=annotations or {},
        container_envs=envs,
        container_annotations=container_annotations or {},
    )


KUBELET_GAVE_GPU_A = {("uid-7", "main"): ("GPU-aaaa",)}
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
MIG = "MIG-6c9e8a2d-1111-2222-3333-444444444444"

# (request env, kubelet grant, expected NVIDIA_VISIBLE_DEVICES, expected denial?)
CASES = [
    # -- the three reproductions --------------------------------------------------------
    pytest.param({"PATH": "/bin"}, {}, NO_GPU, False,
                 id="cpu-pod-on-a-cuda-image-gets-void-silently"),
    pytest.param({"HOME": "/root"}, {}, NO_GPU, False,
                 id="nodename-pod-asking-gpu-core-without-allocation-gets-void"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "1"}, {}, NO_GPU, True,
                 id="cpu-pod-naming-card-1-gets-void-and-a-denial"),
    # -- the kubelet's device-plugin path -----------------------------------------------------
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}, KUBELET_GAVE_GPU_A, "GPU-aaaa", False,
                 id="exactly-the-kubelet-grant-is-kept"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-cccc"}, KUBELET_GAVE_GPU_A,
                 "GPU-aaaa", True, id="more-than-the-grant-is-narrowed-to-it"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "all"}, KUBELET_GAVE_GPU_A, "GPU-aaaa", True,
                 id="spec-all-over-a-grant-is-narrowed-to-it"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}, {("uid-7", "other"): ("GPU-aaaa",)},
                 NO_GPU, True, id="another-containers-grant-does-not-count"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}, {("uid-8", "main"): ("GPU-aaaa",)},
                 NO_GPU, True, id="another-pods-grant-does-not-count"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": MIG}, {("uid-7", "main"): (MIG,)}, MIG, False,
                 id="a-mig-device-grant"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-parent"}, {("uid-7", "main"): (MIG,)},
                 MIG, True, id="a-mig-grant-never-widens-to-its-parent-card"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "0"}, {("uid-7", "main"): ("GPU-aaaa",)},
                 "GPU-aaaa", True, id="an-index-is-not-the-granted-uuid"),
    pytest.param({}, KUBELET_GAVE_GPU_A, NO_GPU, False,
                 id="absent-with-a-grant-by-another-channel-gets-void"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
                 KUBELET_GAVE_GPU_A, "/var/run/nvidia-container-devices", False,
                 id="volume-mounts-marker-is-kept"),
    # -- hostile values -----------------------------------------------------------------------
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "all"}, {}, NO_GPU, True, id="all"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": " all "}, {}, NO_GPU, True, id="all-in-whitespace"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "0,all"}, {}, NO_GPU, True, id="all-in-a-list"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "ALL"}, {}, NO_GPU, True, id="all-upper-case"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "none"}, {}, "none", False, id="none-is-kept"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "void"}, {}, "void", False, id="void-is-kept"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": ""}, {}, "", False, id="empty-is-kept"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "0,void"}, {}, "0,void", False,
                 id="void-anywhere-selects-nothing"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": UUID_B}, {}, NO_GPU, True, id="a-uuid"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": MIG}, {}, NO_GPU, True, id="a-mig-id"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "0:1"}, {}, NO_GPU, True, id="a-mig-index"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": " ,1 ,, "}, {}, NO_GPU, True,
                 id="whitespace-and-commas"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": ",".join(str(i) for i in range(200_000))}, {},
                 NO_GPU, True, id="huge-value"),
    pytest.param({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-aaaa, GPU-aaaa"}, KUBELET_GAVE_GPU_A,
                 "GPU-aaaa,GPU-aaaa, GPU-aaaa", False, id="repeated-granted-id-is-kept"),
]  # fmt: skip


@pytest.mark.parametrize(("envs", "grants", "want", "denied"), CASES)
def test_a_container_sees_only_what_an_allocator_gave_it(
    envs: dict[str, str], grants: dict[tuple[str, str], tuple[str, ...]], want: str, denied: bool
) -> None:
    rec = Recorder()
    out = GPUHook(denials=rec, kubelet_allocations=Grants(grants))(ctx(envs))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == want
    assert [d.reason for d in rec.denials] == ([REASON_GPU_NOT_ALLOCATED] if denied else [])
    if denied:
        assert len(rec.denials[0].message) < 1000  # a huge value is not copied into events


def test_the_cpu_pods_other_variables_are_kept() -> None:
    out = GPUHook()(ctx({"PATH": "/bin", "A": "1"}))
    assert out.container_envs == {"PATH": "/bin", "A": "1", "NVIDIA_VISIBLE_DEVICES": NO_GPU}


def test_without_a_kubelet_port_no_id_is_kept() -> None:
    out = GPUHook()(ctx({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU


def test_an_unreadable_kubelet_allocation_closes_the_container() -> None:
    rec = Recorder()
    hook = GPUHook(denials=rec, kubelet_allocations=Grants(error=OSError("EIO")))
    out = hook(ctx({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU
    assert [d.reason for d in rec.denials] == [REASON_GPU_NOT_ALLOCATED]


def test_kept_kubelet_ids_are_reported_for_the_device_cr() -> None:
    rec = Recorder()
    hook = GPUHook(kubelet_devices=rec, kubelet_allocations=Grants(KUBELET_GAVE_GPU_A))
    hook(ctx({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}))
    hook(ctx({"NVIDIA_VISIBLE_DEVICES": "all"}))  # narrowed: the grant is what it sees
    hook(ctx({"NVIDIA_VISIBLE_DEVICES": "GPU-zzzz"}, container="other"))  # nothing given
    assert rec.devices == [("main", ("GPU-aaaa",)), ("main", ("GPU-aaaa",))]


def test_a_container_without_a_selecting_value_does_not_read_the_checkpoint() -> None:
    grants = Grants()
    GPUHook(kubelet_allocations=grants)(ctx({"PATH": "/bin"}))
    assert grants.asked == []


OTHER_VARIABLES = [
    pytest.param("NVIDIA_MIG_CONFIG_DEVICES", "all", True, id="mig-config"),
    pytest.param("NVIDIA_MIG_MONITOR_DEVICES", "0", True, id="mig-monitor"),
    pytest.param("NVIDIA_IMEX_CHANNELS", "0,1", True, id="imex-channels"),
    pytest.param("NVIDIA_IMEX_CHANNELS", "void", False, id="imex-void-is-quiet"),
    pytest.param("NVIDIA_IMEX_CHANNELS", "", False, id="imex-empty-is-voided-quietly"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "denied"), OTHER_VARIABLES)
@pytest.mark.parametrize("allocated", [False, True], ids=["no-allocation", "our-allocation"])
def test_other_device_selecting_variables_are_voided(
    name: str, value: str, denied: bool, allocated: bool
) -> None:
    annotations = {}
    if allocated:
        annotations = {ANNOTATION_DEVICE_ALLOCATED: encode_allocations(
            {"gpu": [DeviceAllocation.from_ints(0, {"koordinator.sh/gpu-core": 100})]})}
    rec = Recorder()
    out = GPUHook(denials=rec)(ctx({name: value}, annotations=annotations))
    assert out.container_envs[name] == NO_GPU
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == ("0" if allocated else NO_GPU)
    assert [d.reason for d in rec.denials] == ([REASON_GPU_NOT_ALLOCATED] if denied else [])


def test_an_rdma_only_allocation_gives_no_gpu() -> None:
    annotations = {ANNOTATION_DEVICE_ALLOCATED: encode_allocations({"rdma": [DeviceAllocation(0)]})}
    out = GPUHook()(ctx({}, annotations=annotations))
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU


@pytest.mark.parametrize(("value", "want"), [
    ("7", CUDA_NO_DEVICE), ("", CUDA_NO_DEVICE), (CUDA_NO_DEVICE, CUDA_NO_DEVICE),
])  # fmt: skip
def test_cuda_visible_devices_without_a_grant_is_none(value: str, want: str) -> None:
    out = GPUHook(kubelet_allocations=Grants())(ctx({"CUDA_VISIBLE_DEVICES": value}))
    assert out.container_envs["CUDA_VISIBLE_DEVICES"] == want


def test_cuda_visible_devices_with_a_grant_is_the_users_choice() -> None:
    hook = GPUHook(kubelet_allocations=Grants(KUBELET_GAVE_GPU_A))
    out = hook(ctx({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa", "CUDA_VISIBLE_DEVICES": "0"}))
    assert out.container_envs["CUDA_VISIBLE_DEVICES"] == "0"


CDI = [
    pytest.param({"cdi.k8s.io/x": "nvidia.com/gpu=all"}, {}, REFUSED_CDI_DEVICE, True,
                 id="all-gpus-refused"),
    pytest.param({"cdi.k8s.io/nvidia-device-plugin_1": "nvidia.com/gpu=GPU-aaaa"},
                 KUBELET_GAVE_GPU_A, "nvidia.com/gpu=GPU-aaaa", False, id="the-plugins-own-kept"),
    pytest.param({"cdi.k8s.io/x": "nvidia.com/gpu=GPU-aaaa,nvidia.com/gpu=GPU-cccc"},
                 KUBELET_GAVE_GPU_A, "nvidia.com/gpu=GPU-aaaa", True, id="extra-device-dropped"),
    pytest.param({"cdi.k8s.io/x": "vendor.com/fpga=0,nvidia.com/gpu=1"}, {},
                 "vendor.com/fpga=0", True, id="other-vendors-untouched"),
    pytest.param({"cdi.k8s.io/koordinator.sh_rdma": "koordinator.sh/rdma=uid_c"}, {},
                 "koordinator.sh/rdma=uid_c", False, id="rdma-left-to-its-hook"),
]  # fmt: skip


@pytest.mark.parametrize(("annotations", "grants", "want", "denied"), CDI)
def test_cdi_container_annotations_name_only_granted_gpus(
    annotations: dict[str, str], grants: dict[tuple[str, str], tuple[str, ...]], want: str,
    denied: bool,
) -> None:
    rec = Recorder()
    hook = GPUHook(denials=rec, kubelet_allocations=Grants(grants))
    out = hook(ctx({}, container_annotations=annotations))
    [key] = annotations
    assert out.container_annotations[key] == want
    assert bool(rec.denials) == denied


def test_a_pod_annotation_naming_nvidia_cdi_devices_refuses_the_container() -> None:
    with pytest.raises(HookInputError, match=r"cdi\.k8s\.io/gpus"):
        GPUHook()(ctx({}, annotations={"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}))


@pytest.mark.parametrize(("value", "want"), [
    (None, None), ("", None), ("void", None), ("none", None), ("1,void", None),
    ("all", ("all",)), ("1, all", ("all",)), ("0, 1,0", ("0", "1")),
    ("/var/run/nvidia-container-devices", None), ("GPU-a::1", ("GPU-a::1",)),
])  # fmt: skip
def test_selected_devices_reads_values_as_the_toolkit(
    value: str | None, want: tuple[str, ...] | None
) -> None:
    assert selected_devices(value) == want


# -- CDI delivery (the toolkit's safe configuration: variables select nothing) ---------------

def _cdi_hook() -> GPUHook:
    return GPUHook(GPUHookOptions(visible_devices_by="uuid", delivery="cdi"))  # type: ignore[arg-type]


def test_cdi_delivery_names_the_cards_by_uuid_and_voids_the_variable() -> None:
    annotations = {ANNOTATION_DEVICE_ALLOCATED: encode_allocations({"gpu": [
        DeviceAllocation.from_ints(0, {"koordinator.sh/gpu-core": 100}, id="GPU-aaaa"),
        DeviceAllocation.from_ints(1, {"koordinator.sh/gpu-core": 100}, id="GPU-bbbb"),
    ]})}  # fmt: skip
    forged = {ANNOTATION_CDI_GPU: "nvidia.com/gpu=all"}
    out = _cdi_hook()(ctx({"NVIDIA_VISIBLE_DEVICES": "all"}, annotations=annotations,
                          container_annotations=forged))  # fmt: skip
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == NO_GPU
    assert out.container_annotations[ANNOTATION_CDI_GPU] == (
        "nvidia.com/gpu=GPU-aaaa,nvidia.com/gpu=GPU-bbbb"
    )


def test_a_forged_delivery_annotation_of_a_pod_without_allocation_is_refused() -> None:
    out = _cdi_hook()(ctx({}, container_annotations={ANNOTATION_CDI_GPU: "nvidia.com/gpu=all"}))
    assert out.container_annotations[ANNOTATION_CDI_GPU] == REFUSED_CDI_DEVICE


def test_cdi_delivery_needs_uuids() -> None:
    with pytest.raises(ValueError, match="UUID"):
        GPUHookOptions(delivery="cdi")  # type: ignore[arg-type]
