"""Logging set-up: structlog JSON lines (or a console format for people) on stderr.

Role: the one place that configures structlog (and routes the standard library's ``logging``,
e.g. urllib3's warnings, through the same renderer). Scheduler code logs with
``structlog.get_logger(...)`` and keys such as ``pod``, ``node`` and ``cycle``; this module
decides how the lines look.

Invariants: nothing happens at import; ``configure`` is called once by the command line,
before any thread starts (only ``run`` takes over the standard library's root logger). JSON
lines carry ``timestamp`` (ISO 8601, UTC), ``level``, ``logger`` and ``event`` plus the call's
keys; records below ``level`` cost one method call.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

__all__ = ["FORMATS", "LEVELS", "configure"]

FORMATS = ("json", "console")
LEVELS = ("debug", "info", "warning", "error")


def configure(
    fmt: str = "json", level: str = "info", stream: TextIO | None = None, *, stdlib: bool = True
) -> None:
    """Send every log line to ``stream`` (stderr) as JSON or console text, from ``level`` up;
    with ``stdlib``, the standard library's root logger too (warnings and up)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    out = stream or sys.stderr
    levelno = getattr(logging, level.upper())
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(levelno),
        logger_factory=_LoggerFactory(out),
        cache_logger_on_first_use=False,  # so structlog.testing.capture_logs keeps working
    )
    if not stdlib:
        return
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[*shared, structlog.processors.format_exc_info],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(levelno, logging.WARNING))


class _LoggerFactory:
    """A ``PrintLogger`` with a ``name`` (for ``add_logger_name``) writing to one stream."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, *args: Any) -> _NamedPrintLogger:
        name = str(args[0]) if args else ""
        return _NamedPrintLogger(self._stream, name)


class _NamedPrintLogger(structlog.PrintLogger):
    def __init__(self, stream: TextIO, name: str) -> None:
        super().__init__(stream)
        self.name = name
