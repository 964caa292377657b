"""RDMA devices through CDI, end to end over gRPC: the hook server as ``koordlet run`` builds it
(``hook_service`` with ``--sysfs-root`` and ``--cdi-dir``) on a unix socket, a fake sysfs tree
of RDMA NICs and VFs, and a temporary CDI directory read back as a CDI runtime would."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc

from apis.allocation import (
    ANNOTATION_DEVICE_ALLOCATED,
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    encode_allocations,
)
from koordlet.cli import build_parser
from koordlet.hookserver import DEFAULT_CDI_DIR, HookService, hook_service
from runtimehooks.api import api_pb2, api_pb2_grpc
from tests.fake_sysfs import RDMA_CM, UVERBS_MAJOR, FakeSysfs

KEY = "cdi.k8s.io/koordinator.sh_rdma"


def _allocation(pf: str, *vfs: str) -> str:
    ext = AllocationExtension(vfs=tuple(AllocatedVF(-1, b) for b in vfs)) if vfs else None
    return encode_allocations({"rdma": [
        DeviceAllocation.from_ints(0, {"koordinator.sh/rdma": 1}, pf, ext)]})


def _create(uid: str, container: str, allocation: str) -> api_pb2.ContainerResourceHookRequest:
    req = api_pb2.ContainerResourceHookRequest()
    req.pod_meta.name, req.pod_meta.namespace, req.pod_meta.uid = f"pod-{uid}", "default", uid
    req.container_meta.name = container
    req.pod_annotations[ANNOTATION_DEVICE_ALLOCATED] = allocation
    req.container_annotations["io.kubernetes.container.hash"] = "abc"
    req.container_envs["PATH"] = "/usr/bin"
    return req


def _stop(uid: str) -> api_pb2.PodSandboxHookRequest:
    req = api_pb2.PodSandboxHookRequest()
    req.pod_meta.name, req.pod_meta.namespace, req.pod_meta.uid = f"pod-{uid}", "default", uid
    return req


def _runtime_view(cdi_dir: Path) -> dict[str, list[tuple[str, str, int, int]]]:
    """qualified device name -> its device nodes, from every spec file in the directory."""
    out: dict[str, list[tuple[str, str, int, int]]] = {}
    for f in sorted(cdi_dir.glob("*.json")):
        spec = json.loads(f.read_text())
        for dev in spec["devices"]:
            out[f"{spec['kind']}={dev['name']}"] = [
                (n["path"], n["type"], n["major"], n["minor"])
                for n in dev["containerEdits"]["deviceNodes"]]
    return out


def test_cdi_delivery_over_grpc(short_dir: Path) -> None:
    fs = FakeSysfs(short_dir / "sys")
    nic_a = fs.nic("0000:18:00.0", 0, vfs=2)  # PF uverbs0, VFs .2 uverbs1, .3 uverbs2
    nic_b = fs.nic("0000:5e:00.0", 1, vfs=1)  # PF uverbs3, VF .2 uverbs4
    cdi_dir, hooks, sock = short_dir / "cdi", short_dir / "hookserver.d", short_dir / "k.sock"
    service = hook_service(socket_path=str(sock), hook_dir=str(hooks),
                           visible_devices_by="minor", observe=lambda *a: None,
                           sysfs_root=short_dir / "sys", cdi_dir=str(cdi_dir))
    assert isinstance(service, HookService)
    service.start()
    try:
        registration = json.loads((hooks / "koordlet.json").read_text())
        assert registration["runtime-hooks"] == ["PostStopPodSandbox", "PreCreateContainer"]
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            a = stub.PreCreateContainerHook(
                _create("uid-a", "trainer", _allocation("0000:18:00.0", "0000:18:00.3")),
                timeout=10)
            b = stub.PreCreateContainerHook(
                _create("uid-b", "worker", _allocation("0000:5e:00.0", "0000:5e:00.2")),
                timeout=10)
            bad = stub.PreCreateContainerHook(  # a VF of NIC b claimed under NIC a
                _create("uid-c", "evil", _allocation("0000:18:00.0", "0000:5e:00.2")),
                timeout=10)
            assert dict(a.container_annotations) == {
                "io.kubernetes.container.hash": "abc",
                KEY: "koordinator.sh/rdma=uid-a_trainer"}
            assert dict(b.container_annotations)[KEY] == "koordinator.sh/rdma=uid-b_worker"
            assert KEY not in bad.container_annotations
            assert a.container_envs["PATH"] == "/usr/bin"
            cm = ("/dev/infiniband/rdma_cm", "c", *RDMA_CM)
            uverbs = {bus: ("/dev/infiniband/" + name, "c", UVERBS_MAJOR,
                            192 + int(name.removeprefix("uverbs")))
                      for bus, name in {**nic_a, **nic_b}.items()}
            assert _runtime_view(cdi_dir) == {
                "koordinator.sh/rdma=uid-a_trainer": [cm, uverbs["0000:18:00.3"]],
                "koordinator.sh/rdma=uid-b_worker": [cm, uverbs["0000:5e:00.2"]],
            }
            stub.PostStopPodSandboxHook(_stop("uid-a"), timeout=10)
            assert list(_runtime_view(cdi_dir)) == ["koordinator.sh/rdma=uid-b_worker"]
        service.pods_listed(frozenset({"uid-a"}), time.monotonic())  # uid-b left the node
        assert _runtime_view(cdi_dir) == {}
    finally:
        service.stop()


def test_empty_cdi_dir_disables_delivery(short_dir: Path) -> None:
    FakeSysfs(short_dir / "sys").nic("0000:18:00.0", 0, vfs=1)
    service = hook_service(socket_path=str(short_dir / "k.sock"), hook_dir="",
                           visible_devices_by="minor", observe=lambda *a: None,
                           sysfs_root=short_dir / "sys", cdi_dir="")
    assert service is not None and service.cdi is None
    service.pods_listed(frozenset(), 0.0)  # nothing to do


def test_the_cdi_dir_flag() -> None:
    args = build_parser().parse_args(["run", "--cdi-dir", "/run/cdi"])
    assert args.cdi_dir == "/run/cdi"
    assert build_parser().parse_args(["run"]).cdi_dir == DEFAULT_CDI_DIR == "/var/run/cdi"


def test_two_pods_given_the_same_vf_only_the_first_gets_it(short_dir: Path) -> None:
    """Issue 45 (DUPLICATE-VF): a foreign binder gave two pods VF .3 of NIC a. The node admits
    the first; the second is refused (its containers get no RDMA device, no CDI name)."""
    from koordlet.admission import NodeAdmission, Refusal, nic_devices
    from koordlet.devices.rdma import discover_rdma
    from koordlet.pods.cache import PodCache

    fs = FakeSysfs(short_dir / "sys")
    fs.nic("0000:18:00.0", 0, vfs=2)
    refused: list[Refusal] = []
    admission = NodeAdmission(lambda: nic_devices(discover_rdma(short_dir / "sys")),
                              device_types=("gpu", "rdma"), on_refused=refused.append)
    admission.observe([], listed_at=0.0)
    denials: list[tuple[str, ...]] = []
    cdi_dir, sock = short_dir / "cdi", short_dir / "k.sock"
    service = hook_service(socket_path=str(sock), hook_dir="", visible_devices_by="minor",
                           observe=lambda *a: None, sysfs_root=short_dir / "sys",
                           cdi_dir=str(cdi_dir), pods=PodCache(None),
                           on_denied=lambda *args: denials.append(args), admission=admission)
    assert service is not None
    service.start()
    try:
        same_vf = _allocation("0000:18:00.0", "0000:18:00.3")
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            first = stub.PreCreateContainerHook(_create("uid-a", "main", same_vf), timeout=10)
            second = stub.PreCreateContainerHook(_create("uid-b", "main", same_vf), timeout=10)
    finally:
        service.stop()
    assert dict(first.container_annotations)[KEY] == "koordinator.sh/rdma=uid-a_main"
    assert KEY not in second.container_annotations
    assert list(_runtime_view(cdi_dir)) == ["koordinator.sh/rdma=uid-a_main"]
    assert [(r.uid, r.name) for r in refused] == [("uid-b", "pod-uid-b")]
    assert [(d[1], d[4]) for d in denials] == [("pod-uid-b", "rdma-unavailable")]
