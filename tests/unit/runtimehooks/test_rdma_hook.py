"""The RDMA hook on a fake sysfs tree: rdma_cm plus the verbs device of each allocated VF (or
of the NIC itself), in every container of the pod; no device at all when the allocation cannot
be served (fails closed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    encode_allocations,
)
from runtimehooks.context import ContainerContext, ContainerMeta, LinuxDevice, PodMeta
from runtimehooks.hooks import new_default_registry
from runtimehooks.hooks.rdma import REASON_RDMA_UNAVAILABLE, RDMAHook
from runtimehooks.ports import Denial
from runtimehooks.registry import Stage
from tests.fake_sysfs import RDMA_CM, UVERBS_MAJOR, FakeSysfs

CM = LinuxDevice("/dev/infiniband/rdma_cm", *RDMA_CM)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    fs = FakeSysfs(tmp_path)
    fs.nic("0000:18:00.0", 0, vfs=2)  # uverbs0 (PF), uverbs1, uverbs2 (VFs .2, .3)
    fs.nic("0000:5e:00.0", 1)  # uverbs3
    return tmp_path


def _annotation(*entries: tuple[int, str, tuple[str, ...]]) -> str:
    return encode_allocations({"rdma": [
        DeviceAllocation.from_ints(minor, {"koordinator.sh/rdma": 1}, pf, AllocationExtension(
            vfs=tuple(AllocatedVF(-1, b) for b in vfs)) if vfs else None)
        for minor, pf, vfs in entries
    ]})


def _ctx(annotations: dict[str, str], container: str = "main") -> ContainerContext:
    return ContainerContext(pod_meta=PodMeta("ns", "p", "uid-1"),
                            container_meta=ContainerMeta(container),
                            pod_annotations=annotations)


def _uverbs(n: int) -> LinuxDevice:
    return LinuxDevice(f"/dev/infiniband/uverbs{n}", UVERBS_MAJOR, 192 + n)


def test_each_container_gets_rdma_cm_and_the_allocated_vfs(sysfs: Path) -> None:
    hook = RDMAHook(sysfs)
    ann = {ANNOTATION_DEVICE_ALLOCATED: _annotation((0, "0000:18:00.0", ("0000:18:00.3",)))}
    for container in ("main", "sidecar", "init"):
        assert hook(_ctx(ann, container)).devices == (CM, _uverbs(2)), container


def test_an_entry_without_vfs_gets_the_nics_own_verbs_device(sysfs: Path) -> None:
    ann = {ANNOTATION_DEVICE_ALLOCATED: _annotation(
        (0, "0000:18:00.0", ("0000:18:00.2", "0000:18:00.3")), (1, "0000:5e:00.0", ()))}
    assert RDMAHook(sysfs)(_ctx(ann)).devices == (CM, _uverbs(1), _uverbs(2), _uverbs(3))


def test_pods_without_rdma_are_untouched(sysfs: Path) -> None:
    gpu_only = encode_allocations({"gpu": [DeviceAllocation.from_ints(0, {
        "koordinator.sh/gpu-core": 100})]})
    for ann in ({}, {ANNOTATION_DEVICE_ALLOCATED: gpu_only}):
        ctx = _ctx(ann)
        assert RDMAHook(sysfs)(ctx) is ctx


@pytest.mark.parametrize("raw", [
    _annotation((0, "0000:18:00.0", ("0000:99:00.2",))),  # a VF this node does not have
    _annotation((1, "../../etc", ())),  # a path, not a bus id
], ids=["unknown-vf", "hostile-id"])
def test_fails_closed_with_one_denial(sysfs: Path, raw: str) -> None:
    denials: list[Denial] = []

    class Sink:
        def denied(self, denial: Denial) -> None:
            denials.append(denial)

    out = RDMAHook(sysfs, denials=Sink())(_ctx({ANNOTATION_DEVICE_ALLOCATED: raw}))
    assert out.devices == ()
    assert [(d.container, d.reason) for d in denials] == [("main", REASON_RDMA_UNAVAILABLE)]


def test_an_undecodable_annotation_gives_no_device_and_leaves_the_denial_to_the_gpu_hook(
    sysfs: Path,
) -> None:
    """Whether the pod asked for RDMA is unknown: nothing is given; the GPU hook, which reads
    the same annotation, reports it once (invalid-allocation), so the pod gets one event for
    one cause, not one per hook."""
    denials: list[Denial] = []

    class Sink:
        def denied(self, denial: Denial) -> None:
            denials.append(denial)

    ctx = dataclasses.replace(
        _ctx({ANNOTATION_DEVICE_ALLOCATED: '{"rdma":[{"minor":"x"}]}'}), devices=(CM,)
    )  # an RDMA device the request carried is taken away too
    out = RDMAHook(sysfs, denials=Sink())(ctx)
    assert out.devices == () and denials == []


def test_registered_after_the_gpu_hook(sysfs: Path) -> None:
    registry = new_default_registry(rdma=RDMAHook(sysfs))
    names = [h.name for h in registry.hooks(Stage.PRE_CREATE_CONTAINER)]
    assert names == ["gpu-env-inject", "rdma device inject"]
    ann = {ANNOTATION_DEVICE_ALLOCATED: _annotation((1, "0000:5e:00.0", ()))}
    out = registry.run_container(Stage.PRE_CREATE_CONTAINER, _ctx(ann))
    assert out.devices == (CM, _uverbs(3))
