"""``--query-kubelet``: the device plugin's candidate pods from the kubelet's ``/pods``.

A fake kubelet on loopback (real HTTP and HTTPS with a generated certificate) serves PodLists,
errors, garbage and a huge body; the API server is a fake ``PodSource`` that records each list.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from apis.jsonload import MAX_DEPTH
from koordlet.cli import UserError, _gpushare_pods, build_parser, cmd_run
from koordlet.deviceplugin.api import api_pb2
from koordlet.deviceplugin.gpushare import (
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_IDX,
    ANNOTATION_POD,
    Card,
    MemoryUnit,
    PendingPod,
    PodConflict,
    pending_pods,
)
from koordlet.deviceplugin.kubeletpods import KubeletPodsConfig, KubeletPodSource
from koordlet.deviceplugin.server import GPUSharePlugin
from scheduler.observability.tls import self_signed, server_context
from tests.deepjson import chain, deep_list_page, with_deep_managed_fields

NODE = "node-a"
GI = 1 << 30


def pod_obj(
    name: str,
    units: list[int],
    *,
    node: str = NODE,
    phase: str = "Pending",
    assigned: str = "false",
    idx: int = 0,
    uid: str = "",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "resourceVersion": "7",
            "annotations": {
                ANNOTATION_ASSIGNED: assigned,
                ANNOTATION_IDX: str(idx),
                ANNOTATION_POD: str(sum(units)),
                ANNOTATION_ASSUME_TIME: "100",
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {"aliyun.com/gpu-mem": str(u)}}}
                for i, u in enumerate(units)
            ],
        },
        "status": {"phase": phase},
    }


def pod_list(*pods: dict[str, Any]) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "items": list(pods)}).encode()


@dataclass
class FakeApi:
    """The API-server PodSource: a fixed answer, each list and mark recorded."""

    pods: list[PendingPod] = field(default_factory=list)
    lists: int = 0
    marked: list[str] = field(default_factory=list)
    conflict: bool = False

    def pending_gpushare_pods(self, node_name: str) -> list[PendingPod]:
        self.lists += 1
        return list(self.pods)

    def mark_assigned(self, pod: PendingPod, annotations: dict[str, str]) -> None:
        if self.conflict:
            raise PodConflict(f"pod {pod.key} changed")
        self.marked.append(pod.uid)


@dataclass
class Kubelet:
    """What the fake kubelet answers and what it was asked."""

    status: int = 200
    body: bytes = b""
    content_length: int | None = None  # None: the body's length; -1: none (close delimits)
    chunks: int = 0  # > 0: that many 1 MiB chunks of spaces after body, unannounced
    trickle: bool = False  # the body one byte per 50 ms
    requests: list[tuple[str, str]] = field(default_factory=list)
    port: int = 0


def _handler(state: Kubelet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            state.requests.append((self.path, self.headers.get("Authorization", "")))
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            length = len(state.body) if state.content_length is None else state.content_length
            if length >= 0 and not state.chunks:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            try:
                if state.trickle:
                    for i in range(len(state.body)):
                        self.wfile.write(state.body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(0.05)
                    return
                self.wfile.write(state.body)
                for _ in range(state.chunks):
                    self.wfile.write(b" " * (1 << 20))
            except OSError:  # broken pipe, reset, TLS EOF
                pass  # the client stopped reading: that is the point

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture(params=["https", "http"])
def kubelet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Kubelet, Any]]:
    """A fake kubelet on 127.0.0.1 and the ``KubeletPodsConfig`` pointing at it."""
    state = Kubelet()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    if request.param == "https":
        server.socket = server_context(*self_signed(["127.0.0.1"])).wrap_socket(
            server.socket, server_side=True
        )
    state.port = server.server_address[1]
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = KubeletPodsConfig(
        port=state.port, scheme=request.param, token_file=str(token), timeout_s=5.0
    )
    try:
        yield state, config
    finally:
        server.shutdown()
        server.server_close()


def _warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["log_level"] == "warning"]


def test_candidates_come_from_the_kubelet_with_the_api_servers_rule(kubelet: Any) -> None:
    state, config = kubelet
    state.body = pod_list(
        pod_obj("wanted", [2]),
        pod_obj("wanted", [2]),  # the same UID twice: once
        pod_obj("elsewhere", [2], node="node-b"),
        pod_obj("running", [2], phase="Running"),
        pod_obj("served", [2], assigned="true"),
        {"metadata": "garbage"},
    )
    api = FakeApi()
    with capture_logs() as logs:
        pods = KubeletPodSource(config, api).pending_gpushare_pods(NODE)
    assert [(p.key, p.units, p.containers) for p in pods] == [("ns/wanted", 2, (2,))]
    assert api.lists == 0 and not _warnings(logs)
    token = "Bearer sa-token" if config.scheme == "https" else ""
    assert state.requests == [("/pods", token)]
    # the same items through the API-server path give the same candidates (one rule)
    assert pending_pods(json.loads(state.body)["items"], NODE) == pods


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda s: setattr(s, "body", b"<html>not json"), "not JSON"),
        (lambda s: setattr(s, "body", chain(MAX_DEPTH + 1).encode()), "nested deeper"),
        (lambda s: setattr(s, "body", b'{"kind": "Status", "items": []}'), "not a PodList"),
        (lambda s: setattr(s, "status", 401), "HTTP 401"),
        (lambda s: setattr(s, "body", pod_list()), "lists no pending gpushare pod"),
        (lambda s: setattr(s, "content_length", 1 << 40), "answer of 1099511627776 bytes"),
        (lambda s: setattr(s, "chunks", 8), "answer over 1048576 bytes"),
        (lambda s: s.__dict__.update(trickle=True, body=b" " * 100), "no complete answer in 0.5 s"),
    ],
    ids=[
        "garbage",
        "too-deep",
        "not-a-podlist",
        "unauthorized",
        "no-candidate",
        "huge-declared",
        "huge",
        "trickle",
    ],
)
def test_an_unusable_kubelet_answer_falls_back_to_the_api_server_with_one_line(
    kubelet: Any, setup: Callable[[Kubelet], None], reason: str
) -> None:
    state, config = kubelet
    setup(state)
    config = KubeletPodsConfig(**{**_fields(config), "max_body": 1 << 20, "timeout_s": 0.5})
    api = FakeApi([PendingPod("ns", "from-api", "uid-api", 2)])
    started = time.monotonic()
    with capture_logs() as logs:
        pods = KubeletPodSource(config, api).pending_gpushare_pods(NODE)
    assert time.monotonic() - started < 2.0  # bounded: never the trickle's 5 s
    assert [p.name for p in pods] == ["from-api"] and api.lists == 1
    (warning,) = _warnings(logs)
    assert reason in f"{warning['event']} {warning.get('error', '')}"


def test_a_pod_with_deep_managed_fields_is_a_candidate_like_any(kubelet: Any) -> None:
    """A tenant's 1,500-deep managedFields (the API server serves it, so does the kubelet):
    the list decodes, the candidate is found, nothing falls back."""
    state, config = kubelet
    deep = with_deep_managed_fields(pod_obj("deep", [2]), 1_500)
    other = json.dumps(pod_obj("other", [1], phase="Running"))
    state.body = deep_list_page([deep, other], kind="PodList")
    api = FakeApi()
    with capture_logs() as logs:
        pods = KubeletPodSource(config, api).pending_gpushare_pods(NODE)
    assert [p.key for p in pods] == ["ns/deep"] and api.lists == 0 and not _warnings(logs)


def _fields(config: KubeletPodsConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in KubeletPodsConfig.__slots__}


def test_a_kubelet_that_is_down_falls_back_to_the_api_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    api = FakeApi([PendingPod("ns", "from-api", "uid-api", 2)])
    config = KubeletPodsConfig(port=port, scheme="http", timeout_s=2.0)
    with capture_logs() as logs:
        assert [p.name for p in KubeletPodSource(config, api).pending_gpushare_pods(NODE)] == [
            "from-api"
        ]
    (warning,) = _warnings(logs)
    assert warning["event"] == "kubelet /pods unusable: listing the API server"
    assert f"http://127.0.0.1:{port}/pods" in warning["error"]


@pytest.mark.parametrize("kubelet", ["https"], indirect=True)  # the read-only port takes none
def test_an_unreadable_token_falls_back(kubelet: Any, tmp_path: Path) -> None:
    state, config = kubelet
    state.body = pod_list(pod_obj("wanted", [2]))
    config = KubeletPodsConfig(**{**_fields(config), "token_file": str(tmp_path / "absent")})
    api = FakeApi()
    with capture_logs() as logs:
        KubeletPodSource(config, api).pending_gpushare_pods(NODE)
    assert api.lists == 1 and state.requests == []
    assert "cannot read the token" in _warnings(logs)[0]["error"]


def test_a_stale_kubelet_copy_never_serves_a_pod_twice(kubelet: Any) -> None:
    """The kubelet still shows a pod ASSIGNED=false after it was marked: it is not a candidate
    again; a conflict on the mark makes the next list the API server's."""
    state, config = kubelet
    state.body = pod_list(pod_obj("first", [2]), pod_obj("second", [2]))
    api = FakeApi([PendingPod("ns", "from-api", "uid-api", 2)])
    source = KubeletPodSource(config, api)
    first = source.pending_gpushare_pods(NODE)[0]
    source.mark_assigned(first, {ANNOTATION_ASSIGNED: "true"})
    assert [p.name for p in source.pending_gpushare_pods(NODE)] == ["second"]
    api.conflict = True
    with pytest.raises(PodConflict):
        source.mark_assigned(source.pending_gpushare_pods(NODE)[0], {})
    assert api.lists == 0
    assert [p.name for p in source.pending_gpushare_pods(NODE)] == ["from-api"]
    assert api.lists == 1
    assert [p.name for p in source.pending_gpushare_pods(NODE)] == ["second"]  # kubelet again


class _Context:
    def abort(self, code: Any, message: str) -> None:
        raise RuntimeError(message)


def test_allocate_through_the_plugin_reads_the_kubelet(kubelet: Any) -> None:
    state, config = kubelet
    state.body = pod_list(pod_obj("two-gib", [2], idx=1))
    api = FakeApi()
    plugin = GPUSharePlugin(NODE, KubeletPodSource(config, api), MemoryUnit.GiB)
    plugin.update_cards([Card(0, "GPU-a", 4 * GI), Card(1, "GPU-b", 4 * GI)])
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=["GPU-b-_-0", "GPU-b-_-1"])]
    )
    answer = plugin.Allocate(request, _Context())  # type: ignore[arg-type]
    assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert api.marked == ["uid-two-gib"] and api.lists == 0


def test_flags() -> None:
    args = build_parser().parse_args(
        ["run", "--gpushare-device-plugin", "--query-kubelet", "--kubelet-port", "10255",
         "--kubelet-scheme", "http"]
    )  # fmt: skip
    api = FakeApi()
    source = _gpushare_pods(args, api)
    assert isinstance(source, KubeletPodSource)
    assert source.config.url == "http://127.0.0.1:10255/pods"
    assert _gpushare_pods(build_parser().parse_args(["run"]), api) is api
    bad = build_parser().parse_args(["run", "--query-kubelet", "--kubelet-port", "0"])
    with pytest.raises(UserError, match="--kubelet-port 0: not a port"):
        _gpushare_pods(bad, api)
    alone = build_parser().parse_args(["run", "--query-kubelet"])
    with pytest.raises(UserError, match="--query-kubelet is an option of --gpushare-device-plugin"):
        cmd_run(alone)
