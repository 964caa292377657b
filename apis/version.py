"""The installed koord-py version and the Python it runs on, for ``--version`` and the
``*_build_info`` metrics.

Invariant: never raises; a source tree that was not installed reports ``0.0.0+unknown``.
"""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["DISTRIBUTION", "python_version", "version", "version_line"]

DISTRIBUTION = "koord-py"


def version() -> str:
    """The distribution's version (``pyproject.toml``'s ``version`` as installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def python_version() -> str:
    return platform.python_version()


def version_line(prog: str) -> str:
    """What ``PROG --version`` prints: ``koordlet 0.1.0 (koord-py, Python 3.11.2)``."""
    return f"{prog} {version()} ({DISTRIBUTION}, Python {python_version()})"
