"""Watching the kubelet's device checkpoint with inotify, so a kubelet allocation reaches the
Device CR within a second rather than at the next sync interval.

Role: ``CheckpointWatcher`` watches ``<kubelet-root>/device-plugins/`` (the kubelet replaces
``kubelet_internal_checkpoint`` by writing a temporary file and renaming it, so the directory
is watched, not the file) through ``inotify_simple`` and calls ``on_change`` for every write,
rename into place, or removal of the checkpoint.  The periodic sync stays the fallback.

Invariants:

- Started and stopped explicitly; its thread wakes at least every ``tick_s`` to notice
  ``stop()``.
- A directory that does not exist yet (no device plugin ever ran), an inotify that cannot be
  created (no inotify, ``max_user_watches`` exhausted) or a watch removed under it (the
  directory deleted) is retried every ``retry_s``; in the meantime only the poll sees
  changes.  ``watching`` says whether a watch is in place.
- After a (re)established watch ``on_change`` is called once: a change made while nothing
  watched is not lost.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog
from inotify_simple import INotify, flags

__all__ = ["CheckpointWatcher"]

log = structlog.get_logger("koordlet.checkpoint")

_DIR_MASK: Final = (
    flags.CLOSE_WRITE
    | flags.MOVED_TO
    | flags.MOVED_FROM
    | flags.CREATE
    | flags.DELETE
    | flags.DELETE_SELF
    | flags.MOVE_SELF
)
_GONE: Final = flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF


class CheckpointWatcher:
    """See the module docstring."""

    def __init__(
        self,
        checkpoint: str | os.PathLike[str],
        on_change: Callable[[], None],
        *,
        tick_s: float = 0.5,
        retry_s: float = 5.0,
    ) -> None:
        path = Path(checkpoint)
        self.directory = path.parent
        self.filename = path.name
        self._on_change = on_change
        self._tick_ms = max(1, int(tick_s * 1000))
        self._retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watching = False
        self.events = 0

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("CheckpointWatcher already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="koordlet-checkpoint-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(10.0)

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                with INotify() as inotify:
                    inotify.add_watch(self.directory, _DIR_MASK)
                    self.watching = True
                    warned = False
                    log.info("watching the kubelet device checkpoint", dir=str(self.directory))
                    self._on_change()
                    self._watch(inotify)
            except OSError as exc:
                if not warned:
                    log.info(
                        "kubelet device checkpoint not watched (polling): retrying",
                        dir=str(self.directory),
                        error=exc.strerror or str(exc),
                    )
                    warned = True
            self.watching = False
            self._stop.wait(self._retry_s)

    def _watch(self, inotify: INotify) -> None:
        while not self._stop.is_set():
            changed = False
            for event in inotify.read(timeout=self._tick_ms):
                if event.mask & _GONE:
                    log.info("kubelet device-plugins directory gone", dir=str(self.directory))
                    if changed or event.mask & (flags.DELETE_SELF | flags.MOVE_SELF):
                        self._on_change()
                    return
                if event.name == self.filename:
                    changed = True
            if changed:
                self.events += 1
                self._on_change()
