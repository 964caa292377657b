"""Reading the kubelet's device-plugin checkpoint file (SPEC section 8).

Role: the file I/O around ``apis.checkpoint.parse_kubelet_checkpoint``: read
``<kubelet-root>/device-plugins/kubelet_internal_checkpoint`` and hand out its pod device
entries, robust to the file's normal absence and to the kubelet rewriting it under our feet.

Invariants:

- A missing file is normal (no device plugin ever ran, or a fresh node): no entries, no error.
- A corrupt, truncated, empty (zero bytes) or unreadable file, and a file whose ``Checksum``
  is not the kubelet's checksum of its data (the kubelet refuses such a file too:
  ``checksum.Verify`` -> ``ErrCorruptCheckpoint``), is logged, counted through
  ``on_error``, and the entries of the last good read are returned instead (the kubelet writes
  the file atomically, so a bad read is transient; forgetting entries would let the scheduler
  double-allocate the cards they hold).
- ``read()`` is thread-safe and never raises for file contents.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

from apis.checkpoint import CheckpointError, PodDeviceEntry, parse_kubelet_checkpoint

__all__ = ["CHECKPOINT_FILE", "DEFAULT_KUBELET_ROOT", "CheckpointReader", "checkpoint_path"]

DEFAULT_KUBELET_ROOT: Final = "/var/lib/kubelet"
CHECKPOINT_FILE: Final = "kubelet_internal_checkpoint"

log = structlog.get_logger("koordlet.checkpoint")


def checkpoint_path(kubelet_root: str | os.PathLike[str]) -> Path:
    """``<kubelet-root>/device-plugins/kubelet_internal_checkpoint``."""
    return Path(kubelet_root) / "device-plugins" / CHECKPOINT_FILE


class CheckpointReader:
    """Reads the checkpoint on demand and remembers the last good entries."""

    def __init__(
        self,
        kubelet_root: str | os.PathLike[str] = DEFAULT_KUBELET_ROOT,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.path = checkpoint_path(kubelet_root)
        self._on_error = on_error
        self._lock = threading.Lock()
        self._last_good: tuple[PodDeviceEntry, ...] = ()

    @property
    def last_good(self) -> tuple[PodDeviceEntry, ...]:
        with self._lock:
            return self._last_good

    def read(self) -> tuple[PodDeviceEntry, ...]:
        """The checkpoint's pod device entries (see the module docstring for failures)."""
        with self._lock:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                self._last_good = ()
                return ()
            except OSError as exc:
                return self._failed(f"cannot read: {exc.strerror or exc}")
            if not data.strip():
                return self._failed("empty file")
            try:
                parsed = parse_kubelet_checkpoint(data)
            except CheckpointError as exc:
                return self._failed(str(exc))
            if not parsed.checksum_ok:
                return self._failed(
                    f"checksum mismatch: the file says {parsed.checksum}, its data hashes to "
                    f"{parsed.expected_checksum} (the kubelet refuses this file too)"
                )
            self._last_good = parsed.entries
            return parsed.entries

    def _failed(self, reason: str) -> tuple[PodDeviceEntry, ...]:
        log.warning(
            "kubelet device checkpoint unusable: keeping the last good state",
            path=str(self.path),
            error=reason,
            kept_entries=len(self._last_good),
        )
        if self._on_error is not None:
            self._on_error()
        return self._last_good
