"""koordlet.kubelet.watch: a real inotify watch of the kubelet's device-plugins directory."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from koordlet.kubelet.watch import CheckpointWatcher


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.n += 1


def _wait(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _settled(counter: Counter, quiet_s: float = 0.5) -> int:
    """The count once it has not moved for ``quiet_s``."""
    last, since = counter.n, time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.02)
        if counter.n != last:
            last, since = counter.n, time.monotonic()
    return last


def test_write_and_atomic_replace_are_seen(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    changes = Counter()
    watcher = CheckpointWatcher(plugins / "kubelet_internal_checkpoint", changes, tick_s=0.05)
    watcher.start()
    try:
        _wait(lambda: watcher.watching and changes.n == 1)  # one call once the watch is set
        (plugins / "kubelet_internal_checkpoint").write_text("{}")  # IN_CLOSE_WRITE
        _wait(lambda: changes.n >= 2)
        seen = _settled(changes)  # one write may arrive as more than one event
        tmp = plugins / ".ckpt.tmp"
        tmp.write_text("{}")  # another file: not our checkpoint
        time.sleep(0.2)
        assert changes.n == seen
        os.replace(tmp, plugins / "kubelet_internal_checkpoint")  # the kubelet's way
        _wait(lambda: changes.n > seen)
    finally:
        watcher.stop()


def test_directory_created_later_is_watched_after_a_retry(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    changes = Counter()
    watcher = CheckpointWatcher(
        plugins / "kubelet_internal_checkpoint", changes, tick_s=0.05, retry_s=0.05
    )
    watcher.start()
    try:
        time.sleep(0.2)
        assert not watcher.watching and changes.n == 0
        plugins.mkdir()
        _wait(lambda: watcher.watching)
        before = changes.n
        (plugins / "kubelet_internal_checkpoint").write_text("{}")
        _wait(lambda: changes.n > before)
        (plugins / "kubelet_internal_checkpoint").unlink()
        plugins.rmdir()  # the watch goes away: retried, not crashed
        _wait(lambda: not watcher.watching)
        plugins.mkdir()
        _wait(lambda: watcher.watching)
    finally:
        watcher.stop()
