"""Process -> pod through /proc/<pid>/cgroup (both cgroup drivers), and per-pod usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.devices.library import GPU, DeviceQueryError, ProcessSample
from koordlet.fairshare.monitor import PodUsageMonitor, ProcessPods, pod_uid_from_cgroup

UID = "0f3a6c1e-2b4d-4e8f-9a1b-3c5d7e9f1a2b"
UID2 = "11111111-2222-3333-4444-555555555555"

CGROUPS = [
    pytest.param(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{UID.replace('-', '_')}.slice/cri-containerd-abc.scope\n",
        UID,
        id="systemd-v2",
    ),
    pytest.param(
        f"12:memory:/kubepods/besteffort/pod{UID}/0123456789abcdef\n"
        f"11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/0123456789abcdef\n",
        UID,
        id="cgroupfs-v1",
    ),
    pytest.param(f"0::/kubepods/pod{UID}/ctr\n", UID, id="guaranteed"),
    pytest.param("0::/system.slice/sshd.service\n", None, id="host-process"),
    pytest.param("0::/kubepods/podnot-a-uid/ctr\n", None, id="not-a-uid"),
    pytest.param("", None, id="empty"),
]


@pytest.mark.parametrize(("text", "expected"), CGROUPS)
def test_pod_uid_from_cgroup(text: str, expected: str | None) -> None:
    assert pod_uid_from_cgroup(text) == expected


def _proc(root: Path, pid: int, uid: str | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    path = f"/kubepods/burstable/pod{uid}/ctr" if uid else "/system.slice/x.service"
    (d / "cgroup").write_text(f"0::{path}\n")


class Library:
    """A DeviceLibrary fake answering only process_utilization (what the monitor uses)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[ProcessSample]] = {}
        self.lost: set[str] = set()
        self.asked: list[tuple[str, int]] = []

    def process_utilization(self, gpu: GPU, since_us: int) -> tuple[ProcessSample, ...]:
        self.asked.append((gpu.uuid, since_us))
        if gpu.uuid in self.lost:
            raise DeviceQueryError("lost")
        return tuple(s for s in self.samples.get(gpu.uuid, []) if s.timestamp_us > since_us)


def test_usage_per_pod_per_card(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 10, UID)
    _proc(proc, 11, UID)
    _proc(proc, 20, UID2)
    _proc(proc, 30, None)
    g0, g1, g2 = GPU("GPU-0", 0), GPU("GPU-1", 1), GPU("GPU-2", 2)
    lib = Library()
    lib.samples["GPU-0"] = [
        ProcessSample(10, 100, 0.2),
        ProcessSample(10, 200, 0.4),  # pid 10: mean 0.3
        ProcessSample(11, 200, 0.1),  # same pod: 0.3 + 0.1
        ProcessSample(20, 150, 0.5),
        ProcessSample(30, 150, 0.9),  # not in a pod: not counted
        ProcessSample(99, 150, 0.9),  # exited: no /proc entry
    ]
    lib.lost.add("GPU-2")
    mon = PodUsageMonitor(lib, lambda: (g0, g1, g2), ProcessPods(proc))  # type: ignore[arg-type]
    first = mon.sample()
    assert sorted(first) == [0, 1]  # the lost card has no numbers
    assert first[0] == pytest.approx({UID: 0.4, UID2: 0.5}) and first[1] == {}
    lib.samples["GPU-0"].append(ProcessSample(20, 300, 1.0))
    assert mon.sample() == {0: {UID2: 1.0}, 1: {}}  # only the sample newer than 200
    assert ("GPU-0", 200) in lib.asked
