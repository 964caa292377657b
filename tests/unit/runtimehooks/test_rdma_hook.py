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
from runtimehooks.cdi import ANNOTATION_KEY, CDISpecs
from runtimehooks.context import ContainerContext, ContainerMeta, LinuxDevice, PodMeta
from runtimehooks.hooks import new_default_registry
from runtimehooks.hooks.rdma import REASON_RDMA_UNAVAILABLE, RDMAHook
from runtimehooks.ports import (
    REASON_ADMISSION_NOT_READY,
    REASON_DEVICE_OVERCOMMIT,
    AdmissionRefused,
    Denial,
)
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
    return ContainerContext(pod_meta=PodMeta(name="p", uid="uid-1", namespace="ns"),
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


# -- node-side admission (a PodAdmission wired, as koordlet run does) ----------------------------


class FakeAdmission:
    """Admits the uids it is given; refuses every other pod with ``reason``."""

    def __init__(self, *admit: str, reason: str = REASON_DEVICE_OVERCOMMIT) -> None:
        self.admit_uids = set(admit)
        self.reason = reason
        self.asked: list[tuple[str, str]] = []

    def admit(self, pod: PodMeta, allocation: str) -> None:
        self.asked.append((pod.uid, allocation))
        if pod.uid not in self.admit_uids:
            raise AdmissionRefused(self.reason, "VF 0000:18:00.3 is held by ns/first")


class Sink:
    def __init__(self) -> None:
        self.denials: list[Denial] = []

    def denied(self, denial: Denial) -> None:
        self.denials.append(denial)


@pytest.mark.parametrize("reason", [REASON_DEVICE_OVERCOMMIT, REASON_ADMISSION_NOT_READY])
def test_a_pod_the_node_refuses_gets_no_rdma_device_and_no_cdi_name(
    sysfs: Path, tmp_path: Path, reason: str
) -> None:
    cdi, sink, admission = CDISpecs(tmp_path / "cdi"), Sink(), FakeAdmission(reason=reason)
    raw = _annotation((0, "0000:18:00.0", ("0000:18:00.3",)))
    ctx = dataclasses.replace(_ctx({ANNOTATION_DEVICE_ALLOCATED: raw}), devices=(CM,))
    out = RDMAHook(sysfs, denials=sink, cdi=cdi, admission=admission)(ctx)
    assert out.devices == () and ANNOTATION_KEY not in out.container_annotations
    assert admission.asked == [("uid-1", raw)]
    assert list((tmp_path / "cdi").glob("*.json")) == []  # nothing delivered
    assert [(d.container, d.reason) for d in sink.denials] == [("main", REASON_RDMA_UNAVAILABLE)]
    assert sink.denials[0].message == (
        f"refused by the node's admission ({reason}): VF 0000:18:00.3 is held by ns/first"
    )


def test_an_admitted_pod_gets_its_vf_and_pods_without_rdma_do_not_ask(sysfs: Path) -> None:
    admission = FakeAdmission("uid-1")
    hook = RDMAHook(sysfs, admission=admission)
    raw = _annotation((0, "0000:18:00.0", ("0000:18:00.3",)))
    assert hook(_ctx({ANNOTATION_DEVICE_ALLOCATED: raw})).devices == (CM, _uverbs(2))
    gpu_only = encode_allocations({"gpu": [DeviceAllocation.from_ints(0, {
        "koordinator.sh/gpu-core": 100})]})  # fmt: skip
    hook(_ctx({ANNOTATION_DEVICE_ALLOCATED: gpu_only}))
    hook(_ctx({}))
    # an allocation the hook cannot serve anyway is denied before admission is asked
    hook(_ctx({ANNOTATION_DEVICE_ALLOCATED: _annotation((0, "0000:18:00.0", ("0000:99:00.2",)))}))
    assert admission.asked == [("uid-1", raw)]


def test_a_failing_admission_closes_the_container(sysfs: Path) -> None:
    class Broken:
        def admit(self, pod: PodMeta, allocation: str) -> None:
            raise RuntimeError("ledger bug")

    sink = Sink()
    raw = _annotation((0, "0000:18:00.0", ("0000:18:00.3",)))
    hook = RDMAHook(sysfs, denials=sink, admission=Broken())
    out = hook(_ctx({ANNOTATION_DEVICE_ALLOCATED: raw}))
    assert out.devices == ()
    assert [d.reason for d in sink.denials] == [REASON_RDMA_UNAVAILABLE]
