"""Issue 45, finding 3: while koordlet is down, no container of ours starts unchanged.

A proxy-side client that follows koord-runtime-proxy's documented failure-policy behaviour
(``runtime_proxy.RuntimeProxy``) creates containers against the real hook server over a unix
socket, with koordlet up, stopped gracefully, and killed (SIGKILL: its registration and socket
file stay behind).  The image of every container says ``NVIDIA_VISIBLE_DEVICES=all``, as CUDA
images do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from koordlet.hookserver import HookService, hook_service
from tests.unit.koordlet.runtime_proxy import SKIP_LABEL, CreateContainerError, Pod, RuntimeProxy

ROOT = Path(__file__).resolve().parents[3]
CUDA_IMAGE = {"NVIDIA_VISIBLE_DEVICES": "all", "PATH": "/usr/local/cuda/bin"}
ALLOCATED = (
    '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100",'
    '"koordinator.sh/gpu-memory":"16Gi","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-1"}]}'
)
GPU_POD = Pod("uid-gpu", "train",
              annotations={"scheduling.koordinator.sh/device-allocated": ALLOCATED})  # fmt: skip
CPU_POD = Pod("uid-cpu", "web")
KOORDLET_POD = Pod("uid-koordlet", "koordlet-abcde", "koordinator-system",
                   labels={SKIP_LABEL: "true"})  # fmt: skip


def _service(sock: Path, hooks: Path) -> HookService:
    service = hook_service(socket_path=str(sock), hook_dir=str(hooks), visible_devices_by="minor",
                           observe=lambda *_: None)  # fmt: skip
    assert service is not None
    return service


def _visible(proxy: RuntimeProxy, pod: Pod) -> str:
    return proxy.create_container(pod, "main", {}, CUDA_IMAGE).envs["NVIDIA_VISIBLE_DEVICES"]


def _assert_down(proxy: RuntimeProxy) -> None:
    for pod in (GPU_POD, CPU_POD):  # refused, not started with the image's "all"
        with pytest.raises(CreateContainerError):
            proxy.create_container(pod, "main", {}, CUDA_IMAGE)
    own = proxy.create_container(KOORDLET_POD, "koordlet", {"NODE_NAME": "n"}, CUDA_IMAGE)
    assert not own.hooked  # the agent's own pod always starts: it is how the agent comes back


def test_a_gracefully_stopped_koordlet_refuses_containers_until_it_is_back(
    short_dir: Path,
) -> None:
    sock, hooks = short_dir / "run" / "koordlet.sock", short_dir / "hookserver.d"
    proxy = RuntimeProxy(hooks)
    service = _service(sock, hooks)
    service.start()
    try:
        assert _visible(proxy, GPU_POD) == "1"
        assert _visible(proxy, CPU_POD) == "void"
    finally:
        service.stop()
    assert json.loads((hooks / "koordlet.json").read_text())["failure-policy"] == "Fail"
    _assert_down(proxy)
    again = _service(sock, hooks)
    again.start()  # e.g. the DaemonSet's next pod
    try:
        assert _visible(proxy, GPU_POD) == "1"
    finally:
        again.stop()


_AGENT = """
import sys, time
from koordlet.hookserver import hook_service
s = hook_service(socket_path=sys.argv[1], hook_dir=sys.argv[2], visible_devices_by="minor",
                 observe=lambda *_: None)
s.start()
print("up", flush=True)
time.sleep(600)
"""


@pytest.fixture
def killed_agent(short_dir: Path) -> Iterator[tuple[Path, Path]]:
    sock, hooks = short_dir / "run" / "koordlet.sock", short_dir / "hookserver.d"
    proc = subprocess.Popen([sys.executable, "-c", _AGENT, str(sock), str(hooks)],
                            stdout=subprocess.PIPE, cwd=ROOT)  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # its log lines, then "up"
            if line.strip() == b"up":
                break
        else:
            pytest.fail("the agent exited before serving")
        assert _visible(RuntimeProxy(hooks), GPU_POD) == "1"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        yield sock, hooks
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_killed_koordlet_refuses_containers(killed_agent: tuple[Path, Path]) -> None:
    sock, hooks = killed_agent
    assert (hooks / "koordlet.json").exists() and sock.exists()  # left behind by the crash
    _assert_down(RuntimeProxy(hooks))
    service = _service(sock, hooks)  # the restarted agent replaces the stale socket
    service.start()
    try:
        assert _visible(RuntimeProxy(hooks), GPU_POD) == "1"
    finally:
        service.stop()


def test_the_agents_own_pod_skips_the_hooks() -> None:
    docs = list(yaml.safe_load_all((ROOT / "config/koordlet/daemonset.yaml").read_text()))
    [ds] = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    assert ds["spec"]["template"]["metadata"]["labels"][SKIP_LABEL] == "true"


def test_the_ignore_policy_is_an_operators_explicit_choice(short_dir: Path) -> None:
    sock, hooks = short_dir / "run" / "k.sock", short_dir / "hookserver.d"
    service = hook_service(socket_path=str(sock), hook_dir=str(hooks),
                           visible_devices_by="minor", observe=lambda *_: None,
                           failure_policy="Ignore")  # fmt: skip
    assert service is not None
    service.start()
    assert json.loads((hooks / "koordlet.json").read_text())["failure-policy"] == "Ignore"
    service.stop()
    assert not (hooks / "koordlet.json").exists()  # nothing to keep: the proxy would ignore it
