"""Measured GPU usage per pod and card: NVML per-process samples mapped to pods by cgroup.

Role: ``ProcessPods`` maps a host process to the pod it runs in from ``/proc/<pid>/cgroup``
(under an injected root: a test's directory, or the host's ``/proc`` mounted into the agent);
``PodUsageMonitor`` turns each card's per-process utilization samples (``DeviceLibrary``)
into a ratio of the card per pod, read by the metrics collector at scrape time.

Invariants:

- The kubelet's pod cgroup names carry the pod UID (``pod<uid>`` with the cgroupfs driver,
  ``...-pod<uid_with_underscores>.slice`` with systemd); a process outside any pod cgroup, or
  whose cgroup file cannot be read (it exited), maps to no pod and is not counted.
- Each card's samples are read from the newest timestamp seen before (NVML keeps a buffer),
  so every sample counts once; a pod's usage is the sum over its processes of each process's
  mean SM utilization over its new samples, capped at 1. A card with no new sample reports
  every pod idle; a card that cannot be read keeps no numbers (they are not exported).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

from koordlet.devices.library import GPU, DeviceLibrary, DeviceQueryError

__all__ = ["PodUsageMonitor", "ProcessPods", "pod_uid_from_cgroup"]

log = structlog.get_logger("koordlet.fairshare")

_HEX: Final = "[0-9a-f]"
_POD_UID: Final = re.compile(
    rf"pod({_HEX}{{8}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{12}})"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID named in a ``/proc/<pid>/cgroup`` file's paths, or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = _POD_UID.findall(path)
        if found:
            return str(found[-1]).replace("_", "-")
    return None


class ProcessPods:
    """pid -> pod UID through ``<proc_root>/<pid>/cgroup``."""

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc") -> None:
        self.proc_root = Path(proc_root)

    def pod_of(self, pid: int) -> str | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        return pod_uid_from_cgroup(text)


class PodUsageMonitor:
    """Per card, per pod: the measured share of the card (see the module docstring)."""

    def __init__(
        self,
        library: DeviceLibrary,
        gpus: Callable[[], tuple[GPU, ...]],
        pods: ProcessPods,
    ) -> None:
        self.library = library
        self.gpus = gpus
        self.pods = pods
        self._since: dict[str, int] = {}

    def sample(self) -> dict[int, dict[str, float]]:
        """``{minor: {pod uid: ratio}}`` for every card that could be read."""
        out: dict[int, dict[str, float]] = {}
        for gpu in self.gpus():
            try:
                samples = self.library.process_utilization(gpu, self._since.get(gpu.uuid, 0))
            except DeviceQueryError as exc:
                log.debug("per-process utilization unreadable", uuid=gpu.uuid, error=str(exc))
                continue
            per_pid: dict[int, list[float]] = {}
            for smp in samples:
                per_pid.setdefault(smp.pid, []).append(smp.sm_util)
                self._since[gpu.uuid] = max(self._since.get(gpu.uuid, 0), smp.timestamp_us)
            usage: dict[str, float] = {}
            for pid, utils in per_pid.items():
                uid = self.pods.pod_of(pid)
                if uid is not None:
                    usage[uid] = usage.get(uid, 0.0) + sum(utils) / len(utils)
            out[gpu.minor] = {uid: min(1.0, u) for uid, u in usage.items()}
        return out
