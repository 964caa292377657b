"""Suite-wide fixtures: every test starts with structlog's default configuration.

Commands under test (``main()`` of the CLIs) configure structlog for the process; without a
reset, a later test would log to a stream pytest has already closed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()
