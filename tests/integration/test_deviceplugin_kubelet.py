"""koordlet's gpushare device plugin against a kubelet played with a client generated from the
kubelet's own deviceplugin/v1beta1 ``api.proto`` (Debian's Kubernetes 1.20.2 source): real gRPC
over unix sockets, registration, ListAndWatch with health changes, Allocate for one and several
containers, refusals, and a kubelet restart."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from koordlet.deviceplugin.gpushare import (
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_IDX,
    Card,
    MemoryUnit,
    PendingPod,
    PodConflict,
)
from koordlet.deviceplugin.server import DevicePluginServer, GPUSharePlugin

REPO = Path(__file__).resolve().parents[2]
PLAYER = Path(__file__).with_name("kubelet_player.py")
GI = 1 << 30
TIMEOUT = 30.0


def _unavailable(reason: str) -> None:
    msg = f"kubelet deviceplugin proto unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def kubelet_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python modules generated from the kubelet's own api.proto (and gogo.proto it imports)."""
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "kubelet-deviceplugin-proto.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        _unavailable((done.stderr.strip().splitlines() or ["failed"])[-1])
    root = done.stdout.strip().partition("=")[2]
    out = tmp_path_factory.mktemp("kubelet-proto")
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
            "github.com/gogo/protobuf/gogoproto/gogo.proto",
        ],
        check=True,
    )
    return out


class FakePods:
    """The PodSource port: pods in memory, patched as the API server would (rv check)."""

    def __init__(self, pods: list[PendingPod]) -> None:
        self.pods = {p.uid: p for p in pods}
        self.lock = threading.Lock()

    def pending_gpushare_pods(self, node_name: str) -> list[PendingPod]:
        with self.lock:
            return [
                p for p in self.pods.values() if p.annotations.get(ANNOTATION_ASSIGNED) == "false"
            ]

    def mark_assigned(self, pod: PendingPod, annotations: dict[str, str]) -> None:
        with self.lock:
            now = self.pods.get(pod.uid)
            if now is None or now.resource_version != pod.resource_version:
                raise PodConflict(f"pod {pod.key} changed")
            rv = str(int(now.resource_version) + 1)
            self.pods[pod.uid] = dataclasses.replace(
                now, annotations={**now.annotations, **annotations}, resource_version=rv
            )


def pod(name: str, units: int, idx: int, assume: int) -> PendingPod:
    return PendingPod(
        "default",
        name,
        f"uid-{name}",
        units,
        {
            ANNOTATION_ASSIGNED: "false",
            ANNOTATION_IDX: str(idx),
            ANNOTATION_ASSUME_TIME: str(assume),
        },
        "1",
    )


class Kubelet:
    """The player subprocess with its events on a queue."""

    def __init__(self, client: Path, plugin_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PLAYER), str(client), str(plugin_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next("ready")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def next(self, *kinds: str) -> dict[str, Any]:
        while True:
            event = self.events.get(timeout=TIMEOUT)
            if event["event"] in kinds:
                return event

    def devices_where(self, predicate: Any) -> list[Any]:
        while True:
            devices = self.next("devices")["devices"]
            if predicate(devices):
                return devices

    def allocate(self, *containers: list[str]) -> dict[str, Any]:
        self.send(cmd="allocate", containers=list(containers))
        return self.next("allocate", "allocate_error")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send(cmd="quit")
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def setup(
    kubelet_client: Path,
) -> Iterator[tuple[Kubelet, DevicePluginServer, FakePods, list[Card]]]:
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as d:  # short: sun_path limit
        plugin_dir = Path(d)
        cards = [Card(0, "GPU-a", 4 * GI, numa_node=0), Card(1, "GPU-b", 6 * GI, numa_node=1)]
        multi = dataclasses.replace(pod("multi", 5, 1, 30), containers=(2, 3))
        pods = FakePods([pod("older", 2, 1, assume=10), pod("newer", 2, 0, assume=20), multi])
        kubelet = Kubelet(kubelet_client, plugin_dir)
        server = DevicePluginServer(
            GPUSharePlugin("node-a", pods, MemoryUnit.GiB), lambda: list(cards), plugin_dir
        )
        server.start()
        try:
            yield kubelet, server, pods, cards
        finally:
            server.stop()
            kubelet.close()


def test_registers_and_lists_a_device_per_gib_of_each_card(setup: Any) -> None:
    kubelet, _, _, _ = setup
    reg = kubelet.next("register")
    assert reg == {
        "event": "register",
        "version": "v1beta1",
        "endpoint": "aliyungpushare.sock",
        "resource_name": "aliyun.com/gpu-mem",
    }
    assert kubelet.next("options") == {"event": "options", "pre_start_required": False}
    devices = kubelet.next("devices")["devices"]
    assert [d[0] for d in devices] == [f"GPU-a-_-{j}" for j in range(4)] + [
        f"GPU-b-_-{j}" for j in range(6)
    ]
    assert {d[1] for d in devices} == {"Healthy"}
    assert devices[0][2] == [0] and devices[-1][2] == [1]


def test_health_changes_reach_the_kubelet(setup: Any) -> None:
    kubelet, _, _, cards = setup
    kubelet.next("devices")
    cards[1] = Card(1, "GPU-b", 6 * GI, healthy=False, numa_node=1)
    devices = kubelet.devices_where(lambda ds: any(d[1] == "Unhealthy" for d in ds))
    assert {d[0].split("-_-")[0] for d in devices if d[1] == "Unhealthy"} == {"GPU-b"}
    assert {d[0].split("-_-")[0] for d in devices if d[1] == "Healthy"} == {"GPU-a"}


def test_allocate_serves_pods_oldest_first_and_marks_them(setup: Any) -> None:
    kubelet, _, pods, _ = setup
    kubelet.next("devices")
    first = kubelet.allocate(["GPU-a-_-0", "GPU-a-_-1"])
    assert first["event"] == "allocate"
    assert first["envs"] == [
        {
            "NVIDIA_VISIBLE_DEVICES": "1",
            "ALIYUN_COM_GPU_MEM_IDX": "1",
            "ALIYUN_COM_GPU_MEM_POD": "2",
            "ALIYUN_COM_GPU_MEM_CONTAINER": "2",
            "ALIYUN_COM_GPU_MEM_DEV": "6",
        }
    ]
    assert pods.pods["uid-older"].annotations[ANNOTATION_ASSIGNED] == "true"
    second = kubelet.allocate(["GPU-a-_-2", "GPU-a-_-3"])
    assert second["envs"][0]["ALIYUN_COM_GPU_MEM_IDX"] == "0"
    assert pods.pods["uid-newer"].annotations[ANNOTATION_ASSIGNED] == "true"
    refused = kubelet.allocate(["GPU-a-_-0", "GPU-a-_-1", "GPU-a-_-2", "GPU-a-_-3"])
    assert refused["event"] == "allocate_error" and refused["code"] == "FAILED_PRECONDITION"
    assert (
        "no pending pod on this node has a container left that asks for 4 GiB of "
        "aliyun.com/gpu-mem" in refused["details"]
    )


def test_allocate_several_containers_gets_each_its_share(setup: Any) -> None:
    kubelet, _, pods, _ = setup
    kubelet.next("devices")
    answer = kubelet.allocate(["GPU-b-_-0", "GPU-b-_-1"], ["GPU-b-_-2", "GPU-b-_-3", "GPU-b-_-4"])
    assert [e["ALIYUN_COM_GPU_MEM_CONTAINER"] for e in answer["envs"]] == ["2", "3"]
    assert {e["ALIYUN_COM_GPU_MEM_POD"] for e in answer["envs"]} == {"5"}
    assert {e["NVIDIA_VISIBLE_DEVICES"] for e in answer["envs"]} == {"1"}
    assert pods.pods["uid-multi"].annotations[ANNOTATION_ASSIGNED] == "true"


def test_re_registers_after_a_kubelet_restart(setup: Any) -> None:
    kubelet, server, _, _ = setup
    kubelet.next("register")
    kubelet.send(cmd="restart")
    kubelet.next("restarted")
    again = kubelet.next("register")
    assert again["resource_name"] == "aliyun.com/gpu-mem"
    assert kubelet.next("devices")["devices"]
    assert server.registrations >= 2
    assert kubelet.allocate(["GPU-a-_-0", "GPU-a-_-1"])["event"] == "allocate"


def _plugin_over_kubelet(
    client: Path, plugin_dir: Path, pods: FakePods
) -> tuple[Kubelet, DevicePluginServer]:
    cards = [Card(0, "GPU-a", 4 * GI, numa_node=0), Card(1, "GPU-b", 6 * GI, numa_node=1)]
    kubelet = Kubelet(client, plugin_dir)
    server = DevicePluginServer(
        GPUSharePlugin("node-a", pods, MemoryUnit.GiB), lambda: list(cards), plugin_dir
    )
    server.start()
    kubelet.next("devices")
    return kubelet, server


def test_a_two_container_pod_is_allocated_per_container_as_the_kubelet_calls(
    kubelet_client: Path,
) -> None:
    # The kubelet calls Allocate once per container (devicemanager.allocateContainerResources),
    # each call carrying that container's devices only. The two-container pod (2 + 2 GiB on
    # card 1, assumed first) must get its own card in both containers, and the one-container
    # 2 GiB pod on card 0 must still get card 0 afterwards.
    pair = pod("pair", 4, 1, assume=10)
    pair = PendingPod(pair.namespace, pair.name, pair.uid, 4, pair.annotations, "1", (2, 2))
    pods = FakePods([pair, pod("two", 2, 0, assume=20)])
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as d:
        kubelet, server = _plugin_over_kubelet(kubelet_client, Path(d), pods)
        try:
            first = kubelet.allocate(["GPU-b-_-0", "GPU-b-_-1"])
            assert first["event"] == "allocate", first
            assert first["envs"][0]["NVIDIA_VISIBLE_DEVICES"] == "1"
            assert first["envs"][0]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
            assert first["envs"][0]["ALIYUN_COM_GPU_MEM_POD"] == "4"
            # not served completely yet: the pod stays ASSIGNED=false, the other pod untouched
            assert pods.pods["uid-pair"].annotations[ANNOTATION_ASSIGNED] == "false"
            assert pods.pods["uid-two"].annotations[ANNOTATION_ASSIGNED] == "false"
            second = kubelet.allocate(["GPU-b-_-2", "GPU-b-_-3"])
            assert second["event"] == "allocate", second
            assert second["envs"][0]["NVIDIA_VISIBLE_DEVICES"] == "1"
            assert pods.pods["uid-pair"].annotations[ANNOTATION_ASSIGNED] == "true"
            third = kubelet.allocate(["GPU-a-_-0", "GPU-a-_-1"])
            assert third["event"] == "allocate", third
            assert third["envs"][0]["NVIDIA_VISIBLE_DEVICES"] == "0"
            assert pods.pods["uid-two"].annotations[ANNOTATION_ASSIGNED] == "true"
        finally:
            server.stop()
            kubelet.close()


def test_a_lone_two_container_pod_starts(kubelet_client: Path) -> None:
    lone = pod("lone", 3, 0, assume=10)
    lone = PendingPod(lone.namespace, lone.name, lone.uid, 3, lone.annotations, "1", (1, 2))
    pods = FakePods([lone])
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as d:
        kubelet, server = _plugin_over_kubelet(kubelet_client, Path(d), pods)
        try:
            first = kubelet.allocate(["GPU-a-_-0"])
            assert first["event"] == "allocate", first
            assert first["envs"][0]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "1"
            second = kubelet.allocate(["GPU-a-_-1", "GPU-a-_-2"])
            assert second["event"] == "allocate", second
            assert second["envs"][0]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
            assert {first["envs"][0]["NVIDIA_VISIBLE_DEVICES"]} == {"0"}
            assert second["envs"][0]["NVIDIA_VISIBLE_DEVICES"] == "0"
            assert pods.pods["uid-lone"].annotations[ANNOTATION_ASSIGNED] == "true"
            # every container served: a third call finds no pod
            assert kubelet.allocate(["GPU-a-_-3"])["event"] == "allocate_error"
        finally:
            server.stop()
            kubelet.close()
