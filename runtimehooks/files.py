"""Files the node agent hands to other processes (the runtime proxy's registration, CDI specs):
written so that a reader sees the old content or the whole new one, never a part.

``write_atomically`` writes a temporary ``.<name>.*.tmp`` beside the target (readers that list
the directory skip it: the proxy reads ``*.json`` by name, CDI only ``*.json``/``*.yaml``),
flushes it to disk, sets its mode, renames it over the target and syncs the directory. On
any failure the temporary file is removed and the error raised; the target is untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["fsync_dir", "write_atomically"]


def write_atomically(directory: Path, name: str, content: bytes, mode: int = 0o644) -> Path:
    """Write ``content`` to ``directory/name`` atomically (see the module doc); its path."""
    target = directory / name
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
    return target


def fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (best effort: some filesystems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
