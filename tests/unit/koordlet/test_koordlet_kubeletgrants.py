"""koordlet.kubelet.grants: the GPUs the kubelet gave a container, read from its checkpoint
file (sealed with the kubelet's checksum) as the GPU hook checks them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apis.checkpoint import kubelet_checkpoint_json
from koordlet.devices.library import GPU
from koordlet.kubelet.checkpoint import CheckpointReader, checkpoint_path
from koordlet.kubelet.grants import KubeletGrants
from koordlet.reporting.reporter import DEFAULT_GPU_RESOURCES

U0, U1 = "GPU-0000aaaa", "GPU-1111bbbb"
MIG = "MIG-6c9e8a2d-1111-2222-3333-444444444444"
GPUS = (GPU(U0, minor=0), GPU(U1, minor=3, index=1))


def _entry(pod: str, container: str, resource: str, ids: list[str]) -> dict[str, Any]:
    return {"PodUID": pod, "ContainerName": container, "ResourceName": resource,
            "DeviceIDs": {"-1": ids}, "AllocResp": ""}  # fmt: skip


def _write(root: Path, *entries: dict[str, Any]) -> None:
    path = checkpoint_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(kubelet_checkpoint_json(
        {"PodDeviceEntries": list(entries), "RegisteredDevices": {}}))  # fmt: skip


def _grants(root: Path) -> KubeletGrants:
    return KubeletGrants(CheckpointReader(root), DEFAULT_GPU_RESOURCES, lambda: GPUS)


CASES = [
    pytest.param([_entry("p", "c", "nvidia.com/gpu", [U0, U1])], (U0, U1), id="uuids"),
    pytest.param([_entry("p", "c", "nvidia.com/gpu", [f"{U0}::0", f"{U0}::3"])], (U0,),
                 id="time-slicing-replicas-are-their-card-id"),
    pytest.param([_entry("p", "c", "nvidia.com/mig-1g.10gb", [MIG])], (MIG,),
                 id="mig-stays-mig"),
    pytest.param([_entry("p", "c", "nvidia.com/gpu", ["0", "1"])], ("0", "1"), id="indexes"),
    pytest.param([_entry("p", "c", "aliyun.com/gpu-mem", [f"{U1}-_-0", f"{U1}-_-1"])], ("3",),
                 id="gpushare-units-are-their-cards-minor"),
    pytest.param([_entry("p", "c", "aliyun.com/gpu-mem", ["GPU-gone-_-0"])], (),
                 id="gpushare-unit-of-no-card-gives-nothing"),
    pytest.param([_entry("p", "c", "example.com/fpga", ["0"])], (),
                 id="not-a-gpu-resource-gives-nothing"),
    pytest.param([_entry("p", "other", "nvidia.com/gpu", [U0]),
                  _entry("q", "c", "nvidia.com/gpu", [U1])], (), id="other-containers-and-pods"),
    pytest.param([_entry("p", "c", "nvidia.com/gpu", [U0]),
                  _entry("p", "c", "nvidia.com/gpu.shared", [f"{U1}::2"])], (U0, U1),
                 id="several-gpu-resources"),
]  # fmt: skip


@pytest.mark.parametrize(("entries", "want"), CASES)
def test_container_gpus(
    tmp_path: Path, entries: list[dict[str, Any]], want: tuple[str, ...]
) -> None:
    _write(tmp_path, *entries)
    assert _grants(tmp_path).container_gpus("p", "c") == want


def test_no_checkpoint_gives_nothing(tmp_path: Path) -> None:
    assert _grants(tmp_path).container_gpus("p", "c") == ()


def test_a_corrupt_checkpoint_keeps_the_last_good_read_and_never_widens(tmp_path: Path) -> None:
    grants = _grants(tmp_path)
    _write(tmp_path, _entry("p", "c", "nvidia.com/gpu", [U0]))
    assert grants.container_gpus("p", "c") == (U0,)
    checkpoint_path(tmp_path).write_text('{"Data": {"PodDeviceEntries": [')  # torn write
    assert grants.container_gpus("p", "c") == (U0,)
    assert grants.container_gpus("p", "d") == ()


def test_a_checkpoint_never_read_good_gives_nothing(tmp_path: Path) -> None:
    _write(tmp_path, _entry("p", "c", "nvidia.com/gpu", [U0]))
    text = checkpoint_path(tmp_path).read_text()
    checkpoint_path(tmp_path).write_text(text.replace(U0, U1))  # checksum no longer matches
    assert _grants(tmp_path).container_gpus("p", "c") == ()
