"""Suite-wide fixtures: every test starts with structlog's default configuration.

Commands under test (``main()`` of the CLIs) configure structlog for the process; without a
reset, a later test would log to a stream pytest has already closed.

``short_dir``: a temporary directory under /tmp whose path is short enough for unix sockets
(gRPC servers and the runtime-hook proxy in the unit tests).

Hypothesis runs without its per-example deadline (200 ms by default): a deadline is a timing
assertion, and on a loaded CI machine it failed a correct property (272 ms for one topology
example); speed goals live in the benchmarks, never in tests.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

settings.register_profile("koord-py", deadline=None)
settings.load_profile("koord-py")


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temporary directory with a short path (a unix socket path must fit in 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
