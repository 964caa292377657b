"""koordlet.hookserver: the runtime-hook server as an agent service, over a real unix socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from koordlet.hookserver import HookService, HookServiceError, hook_service
from runtimehooks.api import api_pb2, api_pb2_grpc

ALLOCATED = (
    '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100",'
    '"koordinator.sh/gpu-memory":"16Gi","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-1"}]}'
)


class Observed:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, stage: str, result: str, seconds: float) -> None:
        assert seconds >= 0
        self.calls.append((stage, result))


def _request() -> api_pb2.ContainerResourceHookRequest:
    req = api_pb2.ContainerResourceHookRequest()
    req.pod_meta.name, req.pod_meta.namespace, req.pod_meta.uid = "p", "default", "uid-p"
    req.container_meta.name = "cuda"
    req.pod_annotations["scheduling.koordinator.sh/device-allocated"] = ALLOCATED
    req.container_envs["PATH"] = "/usr/bin"
    return req


@pytest.mark.parametrize(("by", "visible"), [("minor", "1"), ("uuid", "GPU-1")])
def test_serves_registers_and_cleans_up(short_dir: Path, by: str, visible: str) -> None:
    sock, hooks = short_dir / "run" / "koordlet.sock", short_dir / "hookserver.d"
    observed = Observed()
    service = hook_service(
        socket_path=str(sock), hook_dir=str(hooks), visible_devices_by=by, observe=observed
    )
    assert isinstance(service, HookService)
    service.start()
    try:
        registration = json.loads((hooks / "koordlet.json").read_text())
        assert registration == {
            "remote-endpoint": str(sock),
            "failure-policy": "Fail",
            "runtime-hooks": ["PreCreateContainer"],
        }
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            resp = stub.PreCreateContainerHook(_request(), timeout=10)
        assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == visible
        assert resp.container_envs["PATH"] == "/usr/bin"
        assert observed.calls == [("PreCreateContainer", "success")]
    finally:
        service.stop()
    assert (hooks / "koordlet.json").exists()  # Fail: the proxy refuses containers meanwhile
    assert not sock.exists()
    service.stop()  # idempotent


def test_empty_socket_disables_the_hook_server() -> None:
    assert (
        hook_service(socket_path="", hook_dir="/x", visible_devices_by="minor", observe=Observed())
        is None
    )


def test_no_hook_dir_means_no_registration(short_dir: Path) -> None:
    service = hook_service(
        socket_path=str(short_dir / "s.sock"),
        hook_dir="",
        visible_devices_by="minor",
        observe=Observed(),
    )
    assert service is not None
    service.start()
    assert service.registration is None
    service.stop()


def test_a_path_that_is_not_a_socket_is_a_start_error(short_dir: Path) -> None:
    sock = short_dir / "not-a-socket"
    sock.write_text("precious")
    service = hook_service(
        socket_path=str(sock),
        hook_dir=str(short_dir / "h"),
        visible_devices_by="minor",
        observe=Observed(),
    )
    assert service is not None
    with pytest.raises(HookServiceError, match="not a socket"):
        service.start()
    assert sock.read_text() == "precious"
    assert not (short_dir / "h" / "koordlet.json").exists()


# -- per container and fail closed, over the agent's pod cache -------------------------------------

from koordlet.pods.cache import PodCache, PodMissing  # noqa: E402
from koordlet.pods.record import ContainerRecord, PodRecord  # noqa: E402

SHARED = (
    '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"60",'
    '"koordinator.sh/gpu-memory":"12Gi","koordinator.sh/gpu-memory-ratio":"60"},"id":"GPU-1"}]}'
)


class Getter:
    def __init__(self, *pods: PodRecord) -> None:
        self.pods = {(p.namespace, p.name): p for p in pods}
        self.calls = 0

    def get_pod(self, namespace: str, name: str, timeout_s: float) -> PodRecord:
        self.calls += 1
        if (namespace, name) not in self.pods:
            raise PodMissing(f"pod {namespace}/{name} does not exist")
        return self.pods[(namespace, name)]


POD = PodRecord(
    uid="uid-p",
    namespace="default",
    name="p",
    containers=(
        ContainerRecord("setup", "init", {}),
        ContainerRecord("cuda", "app", {"koordinator.sh/gpu-core": 40,
                                        "koordinator.sh/gpu-memory-ratio": 40}),
        ContainerRecord("tool", "app", {"koordinator.sh/gpu-core": 20,
                                        "koordinator.sh/gpu-memory-ratio": 20}),
        ContainerRecord("logs", "app", {}),
    ),
)  # fmt: skip


def _container_request(container: str, annotation: str, uid: str = "uid-p") -> Any:
    req = _request()
    req.pod_meta.uid = uid
    req.container_meta.name = container
    req.pod_labels["koordinator.sh/gpu-isolation-provider"] = "HAMi-core"
    req.pod_annotations["scheduling.koordinator.sh/device-allocated"] = annotation
    req.container_envs["NVIDIA_VISIBLE_DEVICES"] = "all"  # as CUDA base images set it
    return req


CONTAINERS = [
    pytest.param("cuda", SHARED, "uid-p", {"NVIDIA_VISIBLE_DEVICES": "1",
                 "CUDA_DEVICE_MEMORY_LIMIT": str(8 << 30), "CUDA_DEVICE_SM_LIMIT": "40"},
                 None, id="gpu-container-gets-its-share"),
    pytest.param("tool", SHARED, "uid-p", {"NVIDIA_VISIBLE_DEVICES": "1",
                 "CUDA_DEVICE_MEMORY_LIMIT": str(4 << 30), "CUDA_DEVICE_SM_LIMIT": "20"},
                 None, id="second-gpu-container"),
    pytest.param("setup", SHARED, "uid-p", {"NVIDIA_VISIBLE_DEVICES": "void"}, None,
                 id="init-without-gpu"),
    pytest.param("logs", SHARED, "uid-p", {"NVIDIA_VISIBLE_DEVICES": "void"}, None,
                 id="sidecar-without-gpu"),
    pytest.param("cuda", "{broken", "uid-p", {"NVIDIA_VISIBLE_DEVICES": "void"},
                 "invalid-allocation", id="unreadable-annotation-closed"),
    pytest.param("cuda", SHARED, "uid-old", {"NVIDIA_VISIBLE_DEVICES": "void"},
                 "pod-not-found", id="re-created-pod-closed"),
]  # fmt: skip


@pytest.mark.parametrize(("container", "annotation", "uid", "want", "denied"), CONTAINERS)
def test_per_container_over_grpc(
    short_dir: Path,
    container: str,
    annotation: str,
    uid: str,
    want: dict[str, str],
    denied: str | None,
) -> None:
    sock = short_dir / "koordlet.sock"
    denials: list[tuple[str, ...]] = []
    service = hook_service(
        socket_path=str(sock),
        hook_dir="",
        visible_devices_by="minor",
        observe=Observed(),
        pods=PodCache(Getter(POD)),
        on_denied=lambda *args: denials.append(args),
    )
    assert service is not None
    service.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            resp = stub.PreCreateContainerHook(
                _container_request(container, annotation, uid), timeout=10
            )
    finally:
        service.stop()
    envs = dict(resp.container_envs)
    assert {k: v for k, v in envs.items() if k in want} == want
    assert envs["PATH"] == "/usr/bin"
    assert ("CUDA_DEVICE_MEMORY_LIMIT" in envs) == ("CUDA_DEVICE_MEMORY_LIMIT" in want)
    assert [d[4] for d in denials] == ([denied] if denied else [])
    if denied:
        assert denials[0][:4] == ("default", "p", uid, container)


@pytest.mark.parametrize(("granted", "want"), [
    (("GPU-1::0",), "GPU-1::0"),  # what the kubelet gave: unchanged, reported
    ((), "void"),  # the kubelet gave it nothing: no GPU, nothing reported
])  # fmt: skip
def test_device_plugin_ids_are_checked_and_reported(
    short_dir: Path, granted: tuple[str, ...], want: str
) -> None:
    sock = short_dir / "koordlet.sock"
    seen: list[tuple[str, str, tuple[str, ...]]] = []
    service = hook_service(
        socket_path=str(sock), hook_dir="", visible_devices_by="minor", observe=Observed(),
        pods=PodCache(Getter()), on_kubelet_devices=lambda *a: seen.append(a),
        kubelet_gpus=lambda uid, c: granted if (uid, c) == ("uid-p", "cuda") else (),
    )  # fmt: skip
    assert service is not None
    service.start()
    try:
        req = _request()
        del req.pod_annotations["scheduling.koordinator.sh/device-allocated"]
        req.container_envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-1::0"
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            resp = api_pb2_grpc.RuntimeHookServiceStub(channel).PreCreateContainerHook(
                req, timeout=10
            )
    finally:
        service.stop()
    assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == want
    assert seen == ([("uid-p", "cuda", granted)] if granted else [])


# -- Gemini fair share through the hook ---------------------------------------------------

GEMINI_SHARED = (
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"30",'
    '"koordinator.sh/gpu-memory":"2Gi","koordinator.sh/gpu-memory-ratio":"10"}}]}'
)


def _gemini_request() -> api_pb2.ContainerResourceHookRequest:
    req = _request()
    req.pod_labels["koordinator.sh/gpu-isolation-provider"] = "Gemini"
    req.pod_annotations["scheduling.koordinator.sh/device-allocated"] = GEMINI_SHARED
    return req


def test_gemini_pod_gets_a_working_relay_through_the_hook(short_dir: Path) -> None:
    from apis.fairshare import DefaultLimit
    from koordlet.fairshare.client import GeminiClient
    from koordlet.fairshare.server import FairShareServer
    from koordlet.hookserver import FairShareWiring

    server = FairShareServer()
    server.start()
    sock = short_dir / "koordlet.sock"
    service = hook_service(
        socket_path=str(sock),
        hook_dir="",
        visible_devices_by="minor",
        observe=Observed(),
        fairshare=FairShareWiring(server, "/opt/gem/libgemhook.so.1", DefaultLimit.FULL),
    )
    assert service is not None
    service.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            env = stub.PreCreateContainerHook(_gemini_request(), timeout=10).container_envs
        assert env["LD_PRELOAD"] == "/opt/gem/libgemhook.so.1"
        assert env["POD_NAME"] == "uid-p" and env["NVIDIA_VISIBLE_DEVICES"] == "0"
        port = int(env["POD_MANAGER_PORT"])
        with GeminiClient(env["POD_MANAGER_IP"], port, env["POD_NAME"]) as client:
            assert client.mem_limit() == (0, 2 * 2**30)  # the pod's allocation
            assert client.quota() == 250.0
    finally:
        service.stop()
        server.stop()


def test_gemini_pod_refused_when_fair_share_is_off(short_dir: Path) -> None:
    from apis.fairshare import DefaultLimit
    from koordlet.hookserver import FairShareWiring

    sock = short_dir / "koordlet.sock"
    denied: list[tuple[str, ...]] = []
    service = hook_service(
        socket_path=str(sock),
        hook_dir="",
        visible_devices_by="minor",
        observe=Observed(),
        fairshare=FairShareWiring(None, "/lib.so", DefaultLimit.FULL),
        pods=PodCache(Getter(POD)),
        on_denied=lambda *a: denied.append(a),
    )
    assert service is not None
    service.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            # an error answer would start the container unchanged (failure policy Ignore)
            rsp = stub.PreCreateContainerHook(_gemini_request(), timeout=10)
            assert rsp.container_envs["NVIDIA_VISIBLE_DEVICES"] == "void"
            assert "LD_PRELOAD" not in rsp.container_envs
            assert len(denied) == 1 and "fair share is off" in denied[0][5]
            plain = stub.PreCreateContainerHook(_request(), timeout=10)  # others unaffected
            assert plain.container_envs["NVIDIA_VISIBLE_DEVICES"] == "1"
    finally:
        service.stop()


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param("{broken", id="unreadable"),
        pytest.param('{"gpu":[{"minor":1,"resources":{}}]}', id="no-id-with-uuid"),
    ],
)
def test_without_the_pod_cache_a_bad_allocation_is_still_closed(
    short_dir: Path, annotation: str
) -> None:
    # HookService as an embedding builds it: no agent pod cache. The proxy's failure policy is
    # Ignore, so an error reply would start the container with the image's
    # NVIDIA_VISIBLE_DEVICES=all: the answer must be OK with "void".
    sock = short_dir / "koordlet.sock"
    service = HookService(
        socket_path=sock, hook_dir="", visible_devices_by="uuid", observe=Observed()
    )
    service.start()
    try:
        req = _request()
        req.pod_annotations["scheduling.koordinator.sh/device-allocated"] = annotation
        req.container_envs["NVIDIA_VISIBLE_DEVICES"] = "all"
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            resp = api_pb2_grpc.RuntimeHookServiceStub(channel).PreCreateContainerHook(
                req, timeout=10
            )
        assert resp.container_envs["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert resp.container_envs["PATH"] == "/usr/bin"
    finally:
        service.stop()


def test_two_pods_on_one_card_only_the_first_sees_it(short_dir: Path) -> None:
    from koordlet.admission import NodeAdmission, Refusal, gpu_devices
    from koordlet.devices.library import GPU

    sock = short_dir / "koordlet.sock"
    pods = [PodRecord(uid=f"uid-{n}", namespace="default", name=n,
                      containers=(ContainerRecord("cuda", "app", {"koordinator.sh/gpu-core": 60}),))
            for n in ("p", "q")]  # fmt: skip
    refused: list[Refusal] = []
    admission = NodeAdmission(
        lambda: gpu_devices([GPU("GPU-1", 1, memory_total=80 << 30)]), on_refused=refused.append
    )
    admission.observe([], listed_at=0.0)
    denials: list[tuple[str, ...]] = []
    service = hook_service(socket_path=str(sock), hook_dir="", visible_devices_by="minor",
                           observe=Observed(), pods=PodCache(Getter(*pods)),
                           on_denied=lambda *args: denials.append(args),
                           admission=admission)  # fmt: skip
    assert service is not None
    service.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            seen = {}
            for uid in ("uid-p", "uid-q", "uid-p"):  # p's second container is still admitted
                req = _container_request("cuda", SHARED, uid)
                req.pod_meta.name = uid.removeprefix("uid-")
                resp = stub.PreCreateContainerHook(req, timeout=10)
                seen[uid] = dict(resp.container_envs)["NVIDIA_VISIBLE_DEVICES"]
    finally:
        service.stop()
    assert seen == {"uid-p": "1", "uid-q": "void"}
    assert [(d[1], d[4]) for d in denials] == [("q", "device-overcommit")]
    assert [(r.uid, r.name) for r in refused] == [("uid-q", "q")]
