"""Go's ``time.ParseDuration``, the one duration parser of every component.

Role: durations appear in the scheduler configuration (``leaseDuration: 15s``), in gang
annotations (``gang.scheduling.koordinator.sh/waiting-time: 5m``) and in koordlet's flags; the
components they come from (kube-scheduler, Koordinator) all parse them with Go's
``time.ParseDuration``, so we accept and refuse exactly what it does: an optional sign, then
one or more decimal numbers (``1``, ``1.5``, ``.5``, ``1.``) each with a unit (``ns``, ``us``,
``µs``, ``μs``, ``ms``, ``s``, ``m``, ``h``); ``0`` alone needs no unit; nothing else (no bare
``90``, no ``1d``, no spaces). The value is computed in integer nanoseconds as Go does, with
Go's int64 overflow error (``9223372036854775807ns`` is accepted, one more is not), and a
fraction is scaled in float64 and truncated exactly as Go scales it.

Callers decide what range they accept (most want a positive duration) and word their own
errors; ``DurationError`` carries Go's own message.
"""

from __future__ import annotations

__all__ = [
    "DurationError",
    "format_go_duration",
    "parse_go_duration",
    "parse_go_duration_seconds",
]

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_MAX_NS = (1 << 63) - 1
_LIMIT = 1 << 63  # Go's bound while adding up (a negative duration may reach it)
_DIGITS = "0123456789"


class DurationError(ValueError):
    """Not a Go duration; the message is Go's (``time: invalid duration "3"``)."""


def parse_go_duration(text: str) -> int:
    """``text`` as Go's ``time.ParseDuration`` reads it, in nanoseconds."""
    quoted = '"' + text + '"'
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise DurationError(f"time: invalid duration {quoted}")
    total = 0
    while s:
        # The integer part, then an optional fraction: at least one digit in all.
        i = 0
        while i < len(s) and s[i] in _DIGITS:
            i += 1
        whole_text, s = s[:i], s[i:]
        fraction_text = ""
        if s[:1] == ".":
            s = s[1:]
            i = 0
            while i < len(s) and s[i] in _DIGITS:
                i += 1
            fraction_text, s = s[:i], s[i:]
        elif not whole_text:
            raise DurationError(f"time: invalid duration {quoted}")
        if not whole_text and not fraction_text:
            raise DurationError(f"time: invalid duration {quoted}")
        i = 0
        while i < len(s) and s[i] != "." and s[i] not in _DIGITS:
            i += 1
        unit, s = s[:i], s[i:]
        if not unit:
            raise DurationError(f"time: missing unit in duration {quoted}")
        scale = _UNITS_NS.get(unit)
        if scale is None:
            raise DurationError(f'time: unknown unit "{unit}" in duration {quoted}')
        whole = int(whole_text or "0")
        if whole > _LIMIT or whole > _LIMIT // scale:
            raise DurationError(f"time: invalid duration {quoted}")
        value = whole * scale
        if fraction_text:
            digits, divisor = _leading_fraction(fraction_text)
            # As Go: float64 keeps a fraction of an hour nanosecond-accurate; truncated.
            value += int(float(digits) * (float(scale) / divisor))
            if value > _LIMIT:
                raise DurationError(f"time: invalid duration {quoted}")
        total += value
        if total > _LIMIT:
            raise DurationError(f"time: invalid duration {quoted}")
    if not negative and total > _MAX_NS:
        raise DurationError(f"time: invalid duration {quoted}")
    return -total if negative else total


def _leading_fraction(digits: str) -> tuple[int, float]:
    """Go's ``leadingFraction``: the digits as an integer and 10**(digits used), ignoring
    the digits past what a uint64 holds."""
    x, scale = 0, 1.0
    for c in digits:
        if x > _MAX_NS // 10:
            break
        y = x * 10 + ord(c) - 48
        if y > _LIMIT:
            break
        x, scale = y, scale * 10
    return x, scale


def parse_go_duration_seconds(text: str) -> float:
    """``parse_go_duration`` in seconds."""
    return parse_go_duration(text) / 1e9


def format_go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()`` of ``seconds`` (rounded to whole nanoseconds): ``15s``,
    ``1m30s``, ``1h0m0s``, ``1.5s``, ``500ms``, ``0s`` — what ``parse_go_duration`` reads back."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:  # below a second: one unit, with a fraction
        for unit, size in (("ns", 1), ("µs", 1_000), ("ms", 1_000_000)):
            if ns < size * 1000:
                return sign + _fraction(ns, size) + unit
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    text = _fraction(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _fraction(value: int, size: int) -> str:
    """``value / size`` as Go prints it: the whole part, then the fraction without trailing
    zeros (no point when there is none)."""
    whole, frac = divmod(value, size)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"
