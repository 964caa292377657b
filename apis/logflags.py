"""The log-level flags both commands share: ``--log-level`` and klog's ``-v``/``--v``.

Role: ``koord-scheduler run``/``extender`` and ``koordlet run``/``report`` accept the same two
flags with the same meaning. ``-v N`` is klog's verbosity (what kube-scheduler and Koordinator's
components take); we log through structlog's levels, so it maps onto them: 0 to 3 are
``info`` (klog's default and the usual production settings 2 and 3), 4 and more are
``debug``. ``--log-level`` names the level directly. Both at once is an error, so that a
manifest never says two things.
"""

from __future__ import annotations

__all__ = ["DEBUG_VERBOSITY", "LEVELS", "log_level", "verbosity"]

LEVELS = ("debug", "info", "warning", "error")
DEBUG_VERBOSITY = 4
"""klog's ``-v`` from which we log at ``debug`` (kube's convention: V(4) is debug detail)."""


def verbosity(text: str) -> int:
    """The value of ``-v``: a non-negative integer; raises ValueError."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected a non-negative integer, got {text!r}")
    return value


def log_level(level: str | None, v: int | None, default: str = "info") -> str:
    """The structlog level from ``--log-level`` and ``-v`` (at most one of them given)."""
    if level is not None and v is not None:
        raise ValueError("--log-level and -v both set the log level: give one of them")
    if level is not None:
        if level not in LEVELS:
            raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
        return level
    if v is not None:
        return "debug" if v >= DEBUG_VERBOSITY else "info"
    return default
