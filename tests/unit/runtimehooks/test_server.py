"""runtimehooks.server: a real gRPC client over a unix socket; socket and registration files."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, DeviceAllocation, encode_allocations
from runtimehooks import protocol
from runtimehooks.api import api_pb2, api_pb2_grpc
from runtimehooks.context import (
    ContainerContext,
    ContainerMeta,
    HookInputError,
    PodMeta,
    Resources,
)
from runtimehooks.hooks import new_default_registry
from runtimehooks.hooks.gpu import GPUHookOptions
from runtimehooks.registry import FailurePolicy, HookRegistry, Stage
from runtimehooks.server import (
    REGISTRATION_FILE,
    HookServer,
    SocketPathError,
    remove_registration,
    write_registration,
)

GI = 1 << 30
TIMEOUT = 5.0
CONTAINER_RPCS = [
    "PreCreateContainerHook",
    "PreStartContainerHook",
    "PostStartContainerHook",
    "PostStopContainerHook",
    "PreUpdateContainerResourcesHook",
]
SANDBOX_RPCS = ["PreRunPodSandboxHook", "PostStopPodSandboxHook"]


def serve(registry: HookRegistry, sock: Path) -> HookServer:
    server = HookServer(registry, sock, max_workers=16)
    server.start()
    return server


@pytest.fixture
def gpu_server(short_dir: Path) -> Iterator[HookServer]:
    server = serve(new_default_registry(), short_dir / "run" / "koordlet.sock")
    yield server
    server.stop(None)


@pytest.fixture
def stub(gpu_server: HookServer) -> Iterator[api_pb2_grpc.RuntimeHookServiceStub]:
    with grpc.insecure_channel(f"unix:{gpu_server.socket_path}") as channel:
        yield api_pb2_grpc.RuntimeHookServiceStub(channel)


def gpu_annotation(*cards: DeviceAllocation) -> dict[str, str]:
    return {ANNOTATION_DEVICE_ALLOCATED: encode_allocations({"gpu": list(cards)})}


def card(minor: int, ratio: int = 100, core: int = 100) -> DeviceAllocation:
    return DeviceAllocation.from_ints(
        minor,
        {
            "koordinator.sh/gpu-core": core,
            "koordinator.sh/gpu-memory": ratio * 16 * GI // 100,
            "koordinator.sh/gpu-memory-ratio": ratio,
        },
        id=f"GPU-{minor:04d}",
    )


def request(
    pod_annotations: dict[str, str] | None = None, pod_labels: dict[str, str] | None = None
) -> api_pb2.ContainerResourceHookRequest:
    return protocol.container_request(
        ContainerContext(
            pod_meta=PodMeta("p", "uid-1", "ns"),
            container_meta=ContainerMeta("main", 0, "cid"),
            pod_labels=pod_labels or {},
            pod_annotations=pod_annotations or {},
            container_annotations={"io.kubernetes.container.name": "main"},
            container_envs={"PATH": "/usr/bin", "HOME": "/root"},
            container_resources=Resources(cpu_shares=512, memory_limit_in_bytes=GI),
            pod_resources=Resources(cpu_shares=1024),
            pod_cgroup_parent="/kubepods/pod-uid-1",
        )
    )


def envs(resp: api_pb2.ContainerResourceHookResponse) -> dict[str, str]:
    return dict(resp.container_envs)


# -- RPCs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", CONTAINER_RPCS)
def test_container_rpcs_echo(stub: api_pb2_grpc.RuntimeHookServiceStub, rpc: str) -> None:
    req = request()
    resp = getattr(stub, rpc)(req, timeout=TIMEOUT)
    added = {"NVIDIA_VISIBLE_DEVICES": "void"} if rpc == "PreCreateContainerHook" else {}
    assert dict(resp.container_envs) == {**req.container_envs, **added}  # no GPU given
    assert dict(resp.container_annotations) == dict(req.container_annotations)
    assert resp.container_resources == req.container_resources
    assert resp.pod_cgroup_parent == req.pod_cgroup_parent


@pytest.mark.parametrize("rpc", SANDBOX_RPCS)
def test_sandbox_rpcs_echo(stub: api_pb2_grpc.RuntimeHookServiceStub, rpc: str) -> None:
    req = api_pb2.PodSandboxHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="p", uid="u", namespace="ns"),
        labels={"app": "x"},
        annotations={"a": "1"},
        cgroup_parent="/kubepods/pod-u",
        resources=api_pb2.LinuxContainerResources(cpu_shares=2),
    )
    resp = getattr(stub, rpc)(req, timeout=TIMEOUT)
    assert dict(resp.labels) == {"app": "x"}
    assert dict(resp.annotations) == {"a": "1"}
    assert resp.cgroup_parent == "/kubepods/pod-u"
    assert resp.resources == req.resources


@pytest.mark.parametrize("rpc", [r for r in CONTAINER_RPCS if r != "PreCreateContainerHook"])
def test_gpu_hook_only_at_pre_create(stub: api_pb2_grpc.RuntimeHookServiceStub, rpc: str) -> None:
    resp = getattr(stub, rpc)(request(gpu_annotation(card(0))), timeout=TIMEOUT)
    assert "NVIDIA_VISIBLE_DEVICES" not in resp.container_envs


GPU_CASES = [
    pytest.param(gpu_annotation(card(3)), {}, {"NVIDIA_VISIBLE_DEVICES": "3"}, id="one-card"),
    pytest.param(gpu_annotation(card(5), card(1), card(3)), {},
                 {"NVIDIA_VISIBLE_DEVICES": "5,1,3"}, id="several-cards"),
    pytest.param(gpu_annotation(card(0, ratio=50, core=30)),
                 {"koordinator.sh/gpu-isolation-provider": "HAMi-core"},
                 {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_MEMORY_LIMIT": str(8 * GI),
                  "CUDA_DEVICE_SM_LIMIT": "30", "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so"},
                 id="hami-core"),
    pytest.param({}, {}, {"NVIDIA_VISIBLE_DEVICES": "void"}, id="no-allocation"),
]  # fmt: skip


@pytest.mark.parametrize(("pod_annotations", "labels", "added"), GPU_CASES)
def test_pre_create_sets_gpu_envs(
    stub: api_pb2_grpc.RuntimeHookServiceStub,
    pod_annotations: dict[str, str],
    labels: dict[str, str],
    added: dict[str, str],
) -> None:
    req = request(pod_annotations, labels)
    resp = stub.PreCreateContainerHook(req, timeout=TIMEOUT)
    assert envs(resp) == {**req.container_envs, **added}
    assert resp.container_resources == req.container_resources
    assert dict(resp.container_annotations) == dict(req.container_annotations)
    assert resp.pod_cgroup_parent == req.pod_cgroup_parent


def test_uuid_mode(short_dir: Path) -> None:
    registry = new_default_registry(GPUHookOptions(visible_devices_by="uuid"))  # type: ignore[arg-type]
    server = serve(registry, short_dir / "k.sock")
    try:
        with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            req = request(gpu_annotation(card(2), card(0)))
            resp = stub.PreCreateContainerHook(req, timeout=TIMEOUT)
    finally:
        server.stop(None)
    assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0002,GPU-0000"


def test_malformed_annotation_closes_the_container_and_server_keeps_serving(
    stub: api_pb2_grpc.RuntimeHookServiceStub,
) -> None:
    # an error reply would refuse the container (Fail) or start it unchanged with the image's
    # NVIDIA_VISIBLE_DEVICES=all (an operator's Ignore): the GPU hook answers OK with "void"
    resp = stub.PreCreateContainerHook(
        request({ANNOTATION_DEVICE_ALLOCATED: '{"gpu":[{"minor":-1}]}'}), timeout=TIMEOUT
    )
    assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == "void"
    resp = stub.PreCreateContainerHook(request(gpu_annotation(card(1))), timeout=TIMEOUT)
    assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == "1"


def _bad_input(ctx: ContainerContext) -> ContainerContext:
    raise HookInputError("gpu[0].minor: must not be negative")


def test_a_hook_input_error_is_invalid_argument_and_server_keeps_serving(
    short_dir: Path,
) -> None:
    registry = HookRegistry()
    registry.register_container_hook(
        Stage.PRE_CREATE_CONTAINER, "strict", _bad_input, FailurePolicy.FAIL
    )
    server = serve(registry, short_dir / "k.sock")
    try:
        with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as ei:
                    stub.PreCreateContainerHook(request({}), timeout=TIMEOUT)
                assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "gpu[0].minor" in ei.value.details()
    finally:
        server.stop(None)


def _boom(ctx: ContainerContext) -> ContainerContext:
    raise RuntimeError("device plugin gone")


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        pytest.param(FailurePolicy.FAIL, grpc.StatusCode.INTERNAL, id="fail"),
        pytest.param(FailurePolicy.IGNORE, None, id="ignore"),
    ],
)
def test_hook_failure_policy_over_grpc(
    short_dir: Path, policy: FailurePolicy, want: grpc.StatusCode | None
) -> None:
    registry = HookRegistry()
    registry.register_container_hook(Stage.PRE_START_CONTAINER, "boom", _boom, policy)
    server = serve(registry, short_dir / "k.sock")
    try:
        with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            req = request()
            if want is None:
                assert envs(stub.PreStartContainerHook(req, timeout=TIMEOUT)) == dict(
                    req.container_envs
                )
            else:
                with pytest.raises(grpc.RpcError) as ei:
                    stub.PreStartContainerHook(req, timeout=TIMEOUT)
                assert ei.value.code() == want
                assert "device plugin gone" in ei.value.details()
            # still serving
            stub.PostStopContainerHook(req, timeout=TIMEOUT)
    finally:
        server.stop(None)


def test_concurrent_calls(stub: api_pb2_grpc.RuntimeHookServiceStub) -> None:
    def call(i: int) -> str:
        cards = [card(i % 8), card((i + 1) % 8)]
        resp: api_pb2.ContainerResourceHookResponse = stub.PreCreateContainerHook(
            request(gpu_annotation(*cards)), timeout=TIMEOUT
        )
        return resp.container_envs["NVIDIA_VISIBLE_DEVICES"]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(call, range(16)))
    assert got == [f"{i % 8},{(i + 1) % 8}" for i in range(16)]


# -- the socket -----------------------------------------------------------------------------------


def test_socket_mode_and_parent_created(gpu_server: HookServer) -> None:
    st = os.lstat(gpu_server.socket_path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert gpu_server.socket_path.parent.name == "run"


def test_stop_removes_socket_and_is_idempotent(short_dir: Path) -> None:
    server = serve(HookRegistry(), short_dir / "k.sock")
    assert server.running
    server.stop(0)
    server.stop(0)
    assert not server.running
    assert not server.socket_path.exists()


def test_stale_socket_replaced(short_dir: Path) -> None:
    sock = short_dir / "k.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # the file stays, nobody listens
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    server = serve(HookRegistry(), sock)
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            stub.PreStartContainerHook(request(), timeout=TIMEOUT)
    finally:
        server.stop(None)


def test_live_socket_not_replaced(gpu_server: HookServer) -> None:
    second = HookServer(HookRegistry(), gpu_server.socket_path)
    with pytest.raises(SocketPathError, match="another server is listening"):
        second.start()
    assert stat.S_ISSOCK(os.lstat(gpu_server.socket_path).st_mode)


def test_regular_file_at_socket_path_refused(short_dir: Path) -> None:
    path = short_dir / "k.sock"
    path.write_text("precious")
    with pytest.raises(SocketPathError, match="not a socket"):
        HookServer(HookRegistry(), path).start()
    assert path.read_text() == "precious"


def test_symlink_at_socket_path_refused(short_dir: Path) -> None:
    target = short_dir / "target"
    target.write_text("x")
    link = short_dir / "k.sock"
    link.symlink_to(target)
    with pytest.raises(SocketPathError, match="not a socket"):
        HookServer(HookRegistry(), link).start()
    assert link.is_symlink()


def test_too_long_socket_path_refused(short_dir: Path) -> None:
    with pytest.raises(SocketPathError, match="longer than"):
        HookServer(HookRegistry(), short_dir / ("x" * 120)).start()


def test_start_twice_refused(gpu_server: HookServer) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        gpu_server.start()


def test_context_manager(short_dir: Path) -> None:
    with HookServer(HookRegistry(), short_dir / "k.sock") as server:
        assert server.socket_path.exists()
    assert not server.socket_path.exists()


# -- the registration file ------------------------------------------------------------------------


def test_registration_written_and_removed(short_dir: Path) -> None:
    hook_dir = short_dir / "etc" / "hookserver.d"
    path = write_registration(
        hook_dir, "/var/run/koordlet/koordlet.sock", new_default_registry().stages()
    )
    assert path == hook_dir / REGISTRATION_FILE
    text = path.read_text()
    assert text == (
        "{\n"
        '\t"remote-endpoint": "/var/run/koordlet/koordlet.sock",\n'
        '\t"failure-policy": "Fail",\n'
        '\t"runtime-hooks": [\n'
        '\t\t"PreCreateContainer"\n'
        "\t]\n"
        "}"
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in hook_dir.iterdir()] == [REGISTRATION_FILE]  # no temp file left
    assert remove_registration(hook_dir) is True
    assert not path.exists()
    assert remove_registration(hook_dir) is False


def test_registration_replaces_existing_file(short_dir: Path) -> None:
    write_registration(short_dir, "/a.sock", ["PreCreateContainer"])
    write_registration(
        short_dir, "/b.sock", ["PreCreateContainer", "PostStopContainer"], failure_policy="Fail"
    )
    assert json.loads((short_dir / REGISTRATION_FILE).read_text()) == {
        "remote-endpoint": "/b.sock",
        "failure-policy": "Fail",
        "runtime-hooks": ["PreCreateContainer", "PostStopContainer"],
    }


def test_registration_rejects_unknown_stage(short_dir: Path) -> None:
    with pytest.raises(ValueError):
        write_registration(short_dir, "/a.sock", ["PreCreate"])
    assert not (short_dir / REGISTRATION_FILE).exists()


def test_registration_omits_empty_stages(short_dir: Path) -> None:
    write_registration(short_dir, "/a.sock", [])
    assert json.loads((short_dir / REGISTRATION_FILE).read_text()) == {
        "remote-endpoint": "/a.sock",
        "failure-policy": "Fail",
    }
