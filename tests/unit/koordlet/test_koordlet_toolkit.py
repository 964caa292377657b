"""koordlet.devices.toolkit: the NVIDIA container toolkit's config, judged for GPU isolation,
and how the agent reports it (koordlet_gpu_isolation, /readyz, readiness on request)."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from koordlet.agent import Agent
from koordlet.devices.fake import FakeLibrary, parse_fake_spec
from koordlet.devices.toolkit import (
    MISCONFIGURED,
    SAFE,
    UNKNOWN,
    UNSAFE,
    ToolkitCheck,
)
from tests.unit.koordlet.koordlet_fakes import FakeNodeAPI

KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"

# (config.toml text, --gpu-delivery, verdict)
CASES = [
    pytest.param('disable-require = false\n[nvidia-container-runtime]\nmode = "auto"\n', "env",
                 UNSAFE, id="key-absent-is-the-default-true"),
    pytest.param(f"{KEY} = true\n", "env", UNSAFE, id="envvar-accepted"),
    pytest.param(f"{KEY} = true\n", "cdi", UNSAFE, id="envvar-accepted-whatever-we-deliver-by"),
    pytest.param(f'{KEY} = true\nswarm-resource = "DOCKER_RESOURCE_GPU"\n', "env", UNSAFE,
                 id="swarm-resource"),
    pytest.param(f"{KEY} = false\naccept-nvidia-visible-devices-as-volume-mounts = true\n",
                 "cdi", SAFE, id="recommended"),
    pytest.param(f"{KEY} = false\n", "env", MISCONFIGURED,
                 id="envvar-refused-but-we-deliver-by-envvar"),
    pytest.param(f'{KEY} = "false"\n', "cdi", UNKNOWN, id="a-string-is-not-a-bool"),
    pytest.param(f"{KEY} = false\nswarm-resource = 1\n", "cdi", UNKNOWN, id="swarm-not-a-string"),
    pytest.param(f"{KEY} = fals\n", "cdi", UNKNOWN, id="not-toml"),
    pytest.param(f"{KEY} = false\n{KEY} = true\n", "cdi", UNKNOWN, id="duplicated-key"),
    pytest.param("\xff\xfe", "cdi", UNKNOWN, id="not-utf8"),
    # tomllib recurses per nested array or inline table: RecursionError escaped check()
    pytest.param("a = " + "[" * 5000 + "]" * 5000 + "\n", "cdi", UNKNOWN, id="deep-array"),
    pytest.param("a = " + "{b=" * 3000 + "1" + "}" * 3000 + "\n", "cdi", UNKNOWN,
                 id="deep-inline-table"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "delivery", "state"), CASES)
def test_verdict(tmp_path: Path, text: str, delivery: str, state: str) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(text.encode("latin-1"))
    verdict = ToolkitCheck(path, delivery).check()
    assert verdict.state == state
    assert (verdict.reasons == ()) == (state == SAFE)


def test_a_missing_or_huge_file_is_unknown(tmp_path: Path) -> None:
    assert ToolkitCheck(tmp_path / "none.toml").check().state == UNKNOWN
    huge = tmp_path / "huge.toml"
    huge.write_text(f"{KEY} = false\n" + "# padding\n" * 200_000)
    assert ToolkitCheck(huge, "cdi").check().state == UNKNOWN


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"{KEY} = true\n")
    check = ToolkitCheck(path, "cdi")
    assert check.check().state == UNSAFE
    path.write_text(f"{KEY} = false\n")
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    assert check.check().state == SAFE
    path.unlink()
    assert check.check().state == UNKNOWN


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("required", [False, True], ids=["reported", "required"])
def test_the_agent_reports_the_verdict(tmp_path: Path, required: bool) -> None:
    spec = {"gpus": [{"uuid": "GPU-0", "minor": 0, "name": "NVIDIA L4", "memory": "24Gi"}]}
    lib = FakeLibrary(parse_fake_spec(spec, tmp_path), poll_interval_s=0.01)
    config = tmp_path / "config.toml"
    config.write_text(f"{KEY} = true\n")
    api = FakeNodeAPI()
    api.add_node("node-1", uid="uid-1")
    registry = CollectorRegistry()
    agent = Agent(node_name="node-1", library=lib, api=api, registry=registry,
                  kubelet_root=tmp_path, metrics_address=("127.0.0.1", 0), watch_checkpoint=False,
                  toolkit=ToolkitCheck(config), require_gpu_isolation=required)  # fmt: skip
    agent.start()
    try:
        assert agent.metrics_server is not None
        url = f"http://127.0.0.1:{agent.metrics_server.port}/readyz"
        deadline = time.monotonic() + 10
        while agent.syncer.last_result == "":  # the first sync pass: reporting
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status, body = _get(url)
        assert status == (503 if required else 200)
        assert "gpu-isolation: unsafe: accept-nvidia-visible-devices-envvar" in body
        sample = registry.get_sample_value(
            "koordlet_gpu_isolation", {"node": "node-1", "state": "unsafe"})  # fmt: skip
        assert sample == 1.0
        assert registry.get_sample_value(
            "koordlet_gpu_isolation", {"node": "node-1", "state": "safe"}) == 0.0  # fmt: skip
    finally:
        agent.stop()
