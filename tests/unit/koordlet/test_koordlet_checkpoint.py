"""koordlet.kubelet.checkpoint: reading the kubelet checkpoint file, both shapes, its failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from apis.allocation import go_json_loads
from apis.checkpoint import PodDeviceEntry, kubelet_checksum
from koordlet.kubelet.checkpoint import CheckpointReader, checkpoint_path

G = [f"GPU-{i}0000000-0000-0000-0000-00000000000{i}" for i in range(4)]


def _entry(pod: str, container: str, resource: str, ids: Any) -> dict[str, Any]:
    return {
        "PodUID": pod,
        "ContainerName": container,
        "ResourceName": resource,
        "DeviceIDs": ids,
        "AllocResp": "CiIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSCEdQVS0wMDAw",
    }


def _sealed(data: dict[str, Any]) -> str:
    """A checkpoint with the kubelet's checksum of ``data``."""
    return json.dumps({"Data": data, "Checksum": kubelet_checksum(go_json_loads(json.dumps(data)))})


def _checkpoint(*entries: dict[str, Any]) -> str:
    return _sealed({"PodDeviceEntries": list(entries), "RegisteredDevices": {"nvidia.com/gpu": G}})


NUMA_KEYED = _checkpoint(
    _entry("pod-a", "cuda", "nvidia.com/gpu", {"0": [G[0]], "1": [G[2]]}),
    _entry("pod-b", "main", "nvidia.com/gpu", {"-1": [G[1]]}),
    _entry("pod-c", "train", "nvidia.com/gpu", {"0": [G[3]], "1": [G[3]]}),  # under two nodes
    _entry("pod-c", "sidecar", "example.com/fpga", {"0": ["fpga-0"]}),
)
PLAIN_LIST = _checkpoint(
    _entry("pod-a", "cuda", "nvidia.com/gpu", [G[0], G[2]]),
    _entry("pod-b", "main", "nvidia.com/gpu", [G[1]]),
)
EXPECTED_NUMA = (
    PodDeviceEntry("pod-a", "cuda", "nvidia.com/gpu", (G[0], G[2])),
    PodDeviceEntry("pod-b", "main", "nvidia.com/gpu", (G[1],)),
    PodDeviceEntry("pod-c", "train", "nvidia.com/gpu", (G[3],)),
    PodDeviceEntry("pod-c", "sidecar", "example.com/fpga", ("fpga-0",)),
)
EXPECTED_PLAIN = EXPECTED_NUMA[:2]
PLAIN_LIST_SEALED = PLAIN_LIST
NO_ENTRIES = _sealed({"PodDeviceEntries": None, "RegisteredDevices": {}})


class Errors:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _reader(tmp_path: Path) -> tuple[CheckpointReader, Path, Errors]:
    errors = Errors()
    reader = CheckpointReader(tmp_path / "kubelet", on_error=errors)
    path = checkpoint_path(tmp_path / "kubelet")
    path.parent.mkdir(parents=True)
    return reader, path, errors


def test_path_under_the_kubelet_root() -> None:
    assert checkpoint_path("/var/lib/kubelet") == Path(
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(NUMA_KEYED, EXPECTED_NUMA, id="numa-keyed"),
        pytest.param(PLAIN_LIST, EXPECTED_PLAIN, id="plain-list-kubelet-1.19"),
        pytest.param(NO_ENTRIES, (), id="no-entries"),
    ],
)
def test_reads_both_shapes(
    tmp_path: Path, content: str, expected: tuple[PodDeviceEntry, ...]
) -> None:
    reader, path, errors = _reader(tmp_path)
    path.write_text(content)
    assert reader.read() == expected
    assert errors.count == 0


def test_missing_file_is_normal(tmp_path: Path) -> None:
    reader, _path, errors = _reader(tmp_path)
    with capture_logs() as logs:
        assert reader.read() == ()
    assert logs == [] and errors.count == 0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty-file"),
        pytest.param(NUMA_KEYED[: len(NUMA_KEYED) // 2], id="truncated"),
        pytest.param(
            '{"Data": {"PodDeviceEntries": [{"DeviceIDs": {"x": []}}]}}', id="bad-numa-key"
        ),
        pytest.param('{"Data": {"PodDeviceEntries": {}}}', id="mistyped"),
        pytest.param("null", id="null"),
    ],
)
def test_bad_file_keeps_the_last_good_state(tmp_path: Path, bad: str) -> None:
    reader, path, errors = _reader(tmp_path)
    path.write_text(NUMA_KEYED)
    assert reader.read() == EXPECTED_NUMA
    path.write_text(bad)
    with capture_logs() as logs:
        assert reader.read() == EXPECTED_NUMA
    assert errors.count == 1
    assert [e["event"] for e in logs] == [
        "kubelet device checkpoint unusable: keeping the last good state"
    ]
    assert logs[0]["kept_entries"] == 4
    path.write_text(PLAIN_LIST)  # the kubelet rewrote it: back to normal
    assert reader.read() == EXPECTED_PLAIN
    assert reader.last_good == EXPECTED_PLAIN
    assert errors.count == 1


def test_bad_file_before_any_good_read(tmp_path: Path) -> None:
    reader, path, errors = _reader(tmp_path)
    path.write_bytes(b"\x00\x01garbage")
    assert reader.read() == ()
    assert errors.count == 1


def test_unreadable_file(tmp_path: Path) -> None:
    reader, path, errors = _reader(tmp_path)
    path.mkdir()  # a directory where the file should be: EISDIR
    assert reader.read() == ()
    assert errors.count == 1


def test_file_removed_after_a_good_read_forgets_entries(tmp_path: Path) -> None:
    reader, path, errors = _reader(tmp_path)
    path.write_text(PLAIN_LIST)
    assert reader.read() == EXPECTED_PLAIN
    path.unlink()
    assert reader.read() == ()
    assert errors.count == 0


GOLDEN = Path(__file__).parents[1] / "apis" / "fixtures" / "kubelet-checkpoint"
"""Checkpoints written by the kubelet's own code (hack/kubelet-checkpoint-golden)."""


def _corruptions(name: str) -> list[tuple[str, str]]:
    text = (GOLDEN / name).read_text()
    doc = json.loads(text)
    off_by_one = text.replace(f'"Checksum":{doc["Checksum"]}', f'"Checksum":{doc["Checksum"] + 1}')
    assert off_by_one != text
    changed = text.replace('"ContainerName":"cuda"', '"ContainerName":"cudA"', 1)
    assert changed != text
    no_checksum = text.replace(f',"Checksum":{doc["Checksum"]}', "")
    return [
        (off_by_one, "checksum-off-by-one"),
        (changed, "content-changed"),
        (no_checksum, "none"),
    ]


@pytest.mark.parametrize("name", ["numa.json", "v1.json"])
def test_a_kubelet_written_checkpoint_is_accepted(tmp_path: Path, name: str) -> None:
    reader, path, errors = _reader(tmp_path)
    path.write_text((GOLDEN / name).read_text())
    assert [e.pod_uid for e in reader.read()][:1] == ["pod-a"]
    assert errors.count == 0


@pytest.mark.parametrize("name", ["numa.json", "v1.json"])
def test_a_checkpoint_whose_checksum_does_not_match_is_refused(tmp_path: Path, name: str) -> None:
    # the kubelet refuses such a file (checksum.Verify -> ErrCorruptCheckpoint): so do we,
    # keeping the last good state and reporting it
    for bad, why in _corruptions(name):
        reader, path, errors = _reader(tmp_path / why)
        path.write_text(PLAIN_LIST_SEALED)
        assert reader.read() == EXPECTED_PLAIN
        path.write_text(bad)
        with capture_logs() as logs:
            assert reader.read() == EXPECTED_PLAIN, why
        assert errors.count == 1, why
        assert [e["event"] for e in logs] == [
            "kubelet device checkpoint unusable: keeping the last good state"
        ]
        assert "checksum" in logs[0]["error"], why
