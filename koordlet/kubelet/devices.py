"""GPUs the kubelet handed out, as the runtime hook sees them before the checkpoint says so.

Role: ``HotDevices`` is Koordinator's "hot update" of the devices-checkpoints: when a
container of a pod without ``device-allocated`` is created with device-plugin GPU ids in
``NVIDIA_VISIBLE_DEVICES`` that the kubelet gave it (``grants``), the hook records them here
and wakes the sync loop, so the Device CR lists them at once instead of after the next sync.

Invariants:

- ``record`` is cheap and thread-safe (called on RPC threads); it calls ``on_change`` only
  when something new was recorded.
- ``merged(checkpoint)`` is the checkpoint's entries plus the recorded containers the
  checkpoint does not list yet; a recorded container that the checkpoint lists is forgotten
  (the checkpoint is then the source of truth for it).
- ``retain(uids, listed_at)`` forgets containers of pods that a pod list started after they
  were recorded no longer has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

from apis.checkpoint import PodDeviceEntry
from apis.resources import NVIDIA_GPU

__all__ = ["HOOK_RESOURCE_NAME", "HotDevices"]

HOOK_RESOURCE_NAME: Final = NVIDIA_GPU
"""The resource name of a recorded entry (the env does not say which plugin set it)."""


class HotDevices:
    """See the module docstring."""

    def __init__(
        self,
        on_change: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_change = on_change
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[PodDeviceEntry, float]] = {}

    def record(self, pod_uid: str, container: str, device_ids: tuple[str, ...]) -> None:
        if not pod_uid or not device_ids:
            return
        entry = PodDeviceEntry(pod_uid, container, HOOK_RESOURCE_NAME, device_ids)
        with self._lock:
            old = self._entries.get((pod_uid, container))
            if old is not None and old[0] == entry:
                return
            self._entries[(pod_uid, container)] = (entry, self._monotonic())
        self._on_change()

    def entries(self) -> tuple[PodDeviceEntry, ...]:
        with self._lock:
            return tuple(e for e, _ in self._entries.values())

    def merged(self, checkpoint: Iterable[PodDeviceEntry]) -> tuple[PodDeviceEntry, ...]:
        listed = tuple(checkpoint)
        known = {(e.pod_uid, e.container_name) for e in listed}
        with self._lock:
            for key in known & self._entries.keys():
                del self._entries[key]
            extra = tuple(e for e, _ in self._entries.values())
        return listed + extra

    def retain(self, uids: frozenset[str], listed_at: float) -> None:
        with self._lock:
            for key, (_, at) in list(self._entries.items()):
                if key[0] not in uids and at < listed_at:
                    del self._entries[key]
