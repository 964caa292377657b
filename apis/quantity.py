"""Kubernetes ``resource.Quantity``: parse and canonical format, wire-exact.

Role: the one place that turns quantity strings such as ``8Gi``, ``1500m`` or ``1e3`` into
exact numbers and back, with the same acceptance rules and the same canonical output as
``k8s.io/apimachinery/pkg/api/resource`` (``ParseQuantity`` and ``CanonicalizeBytes``).

Invariants:

- ``Quantity.value`` is an exact ``Fraction`` and always a multiple of 10**-9: parsing and
  construction round any finer value *away from zero* to the next nano, as Kubernetes does
  ("if you want some resources, you should get some resources").
- ``Quantity.format`` is one of ``DecimalSI``, ``BinarySI``, ``DecimalExponent`` and is the
  format Kubernetes infers from the suffix (a bare number is ``DecimalSI``).  Parsing caps a
  ``BinarySI`` magnitude at 2**63-1 and turns a ``BinarySI`` value strictly between -1 and 1
  into ``DecimalSI``, exactly like ``ParseQuantity``.
- Equality, hashing and ordering are numeric (Go's ``Quantity.Equal``/``Cmp``): the format
  only decides how the value is printed.
- ``canonical()`` recomputes the string every time.  Go caches the *input* string when it
  already looks canonical (so ``+1`` or ``1.500k`` would be re-emitted verbatim there); that
  cache is deliberately not reproduced.

Deliberate, documented deviations (all on inputs no real object carries):

- magnitudes of 10**1000 or more are rejected (Go accepts arbitrarily large decimal values);
- where Go's suffix tables have no entry (DecimalSI exponents above 18, BinarySI powers above
  1024**6) Go silently drops the suffix and prints a wrong number; here the mantissa is
  scaled to the largest suffix instead (``1000E``, ``1024Ei``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Final

__all__ = [
    "BINARY_SI",
    "DECIMAL_EXPONENT",
    "DECIMAL_SI",
    "FORMATS",
    "Quantity",
    "QuantityError",
    "format_quantity",
    "int_value",
    "milli_value",
    "parse_quantity",
]

DECIMAL_SI: Final = "DecimalSI"
BINARY_SI: Final = "BinarySI"
DECIMAL_EXPONENT: Final = "DecimalExponent"
FORMATS: Final = frozenset({DECIMAL_SI, BINARY_SI, DECIMAL_EXPONENT})

_NANO: Final = 10**9
_MAX_BINARY: Final = 2**63 - 1
_MAX_LOG10: Final = 1000  # reject magnitudes >= 10**_MAX_LOG10
_DIGITS: Final = frozenset("0123456789")
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_DEC_SUFFIXES: Final[dict[str, int]] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BIN_SUFFIXES: Final[dict[str, int]] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DEC_BY_EXP: Final[dict[int, str]] = {e: s for s, e in _DEC_SUFFIXES.items()}
_BIN_BY_POW: Final[tuple[str, ...]] = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_INT_STR_CHUNK: Final = 4000  # below CPython's default int<->str digit limit (4300)


class QuantityError(ValueError):
    """A string (or number) that Kubernetes would not accept as a quantity."""

    def __init__(self, text: object) -> None:
        self.text = text
        shown = text if isinstance(text, str) else repr(text)
        super().__init__(f"invalid quantity {json.dumps(shown, ensure_ascii=False)}")


def _round_up_nano(v: Fraction) -> Fraction:
    """Round ``v`` away from zero to a multiple of 10**-9 (inf.RoundUp at scale 9)."""
    if _NANO % v.denominator == 0:
        return v
    mag = -((-abs(v.numerator) * _NANO) // v.denominator)  # ceil(|v| * 1e9)
    return Fraction(mag if v > 0 else -mag, _NANO)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Quantity:
    """An exact Kubernetes quantity; see the module docstring for the invariants."""

    value: Fraction
    format: str = DECIMAL_SI

    def __post_init__(self) -> None:
        raw: object = self.value
        if isinstance(raw, bool) or not isinstance(raw, int | Fraction):
            raise TypeError(f"Quantity.value must be a Fraction or int, not {type(raw).__name__}")
        if self.format not in FORMATS:
            raise ValueError(f"unknown quantity format {self.format!r}")
        object.__setattr__(self, "value", _round_up_nano(Fraction(raw)))

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def of(cls, value: int | Fraction, format: str = DECIMAL_SI) -> Quantity:
        """Build from a number, like Go's ``NewQuantity``/``NewMilliQuantity`` (no capping)."""
        return cls(Fraction(value), format)

    @classmethod
    def parse(cls, s: str | int | float) -> Quantity:
        """Parse like ``resource.ParseQuantity``; ints are DecimalSI, floats must be finite.

        A float is read through its shortest decimal ``repr`` (so ``0.1`` is exactly 1/10),
        then rounded up to nano precision; its format is DecimalSI.
        """
        if isinstance(s, bool):
            raise QuantityError(s)
        if isinstance(s, int):
            return cls(Fraction(s), DECIMAL_SI)
        if isinstance(s, float):
            if s != s or s in (float("inf"), float("-inf")):
                raise QuantityError(s)
            return cls(Fraction(Decimal(repr(s))), DECIMAL_SI)
        if not isinstance(s, str):
            raise QuantityError(s)
        return _parse(s)

    # -- output -------------------------------------------------------------------------------

    def canonical(self) -> str:
        """The canonical string, as Go's ``Quantity.String()`` computes it."""
        return _canonical(self.value, self.format)

    def __str__(self) -> str:
        return _canonical(self.value, self.format)

    def __repr__(self) -> str:
        return f"Quantity({_canonical(self.value, self.format)!r}, {self.format})"

    # -- numeric comparison (format is presentation only) -------------------------------------

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value < other.value
        return NotImplemented

    def __le__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value <= other.value
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value > other.value
        return NotImplemented

    def __ge__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value >= other.value
        return NotImplemented


# -- parsing ------------------------------------------------------------------------------------


def _scan(s: str) -> tuple[bool, str, str, str, bool]:
    """Port of Go's ``parseQuantityString``.

    Returns (positive, num, denom, suffix, has_digits); ``num`` has its leading zeros
    stripped ("0" when nothing is left), ``has_digits`` tells whether the numeric part held
    any digit at all (Go's slow path rejects digit-less numbers such as ``.``).
    """
    end = len(s)
    pos = 0
    positive = True
    if pos < end and s[0] in "+-":
        positive = s[0] == "+"
        pos = 1
    start_digits = pos
    while pos < end and s[pos] == "0":
        pos += 1
    has_digits = pos > start_digits
    if pos >= end:
        return positive, "0", "", "", has_digits
    start = pos
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    num = s[start:pos]
    has_digits = has_digits or bool(num)
    if pos >= end:
        return positive, num, "", "", has_digits
    if not num:
        num = "0"
    denom = ""
    if s[pos] == ".":
        pos += 1
        start = pos
        while pos < end and s[pos] in _DIGITS:
            pos += 1
        denom = s[start:pos]
        has_digits = has_digits or bool(denom)
        if pos >= end:
            return positive, num, denom, "", has_digits
    suffix_start = pos
    while pos < end and s[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and s[pos] in "+-":
        pos += 1
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(s)
    return positive, num, denom, s[suffix_start:], has_digits


def _interpret(suffix: str, s: str) -> tuple[int, int, str]:
    """Port of the suffixer: suffix -> (base, exponent, format)."""
    if suffix in _DEC_SUFFIXES:
        return 10, _DEC_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BIN_SUFFIXES:
        return 2, _BIN_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        return 10, _parse_exponent(suffix[1:], s), DECIMAL_EXPONENT
    raise QuantityError(s)


def _parse_exponent(text: str, s: str) -> int:
    """Go's ``int32(strconv.ParseInt(text, 10, 64))``: int64 range, then int32 wrap-around."""
    sign = 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if not text or any(c not in _DIGITS for c in text):
        raise QuantityError(s)
    text = text.lstrip("0") or "0"
    if len(text) > 19:
        raise QuantityError(s)
    parsed = sign * int(text)
    if not -(2**63) <= parsed < 2**63:
        raise QuantityError(s)
    return (parsed + 2**31) % 2**32 - 2**31


def _int_from_digits(digits: str) -> int:
    """``int(digits)`` without CPython's int/str conversion digit limit."""
    if len(digits) <= _INT_STR_CHUNK:
        return int(digits)
    half = len(digits) // 2
    low = digits[half:]
    shift: int = 10 ** len(low)
    return _int_from_digits(digits[:half]) * shift + _int_from_digits(low)


def _parse(s: str) -> Quantity:
    if not s:
        raise QuantityError(s)
    positive, num, denom, suffix, has_digits = _scan(s)
    base, exp, fmt = _interpret(suffix, s)

    sig = (num + denom).lstrip("0")
    if not sig:
        # Go's fast path yields 0; its slow path (decimal scale below nano) needs a digit.
        if not has_digits and base == 10 and exp - len(denom) < -9:
            raise QuantityError(s)
        return Quantity(Fraction(0), fmt)

    stripped = sig.rstrip("0")
    dec_exp = len(sig) - len(stripped) - len(denom)  # value = stripped * 10**dec_exp [* 2**exp]
    if base == 10:
        dec_exp += exp
        bin_exp = 0
    else:
        bin_exp = exp
    # Upper bound of log10(|value|): 2**60 < 10**19 and 2**k < 10**(0.302 k).
    log10_bound = len(stripped) + dec_exp + (bin_exp * 302 + 999) // 1000
    if log10_bound > _MAX_LOG10:
        raise QuantityError(s)
    if log10_bound <= -9:
        value = Fraction(1, _NANO)  # below one nano: rounds up to exactly 1n
        if fmt == BINARY_SI:
            fmt = DECIMAL_SI
    else:
        mantissa = _int_from_digits(stripped) << bin_exp
        if dec_exp >= 0:
            value = Fraction(mantissa * 10**dec_exp)
        else:
            value = Fraction(mantissa, 10**-dec_exp)
        value = _round_up_nano(value)
        if fmt == BINARY_SI:
            if value > _MAX_BINARY:
                value = Fraction(_MAX_BINARY)
            elif value < 1:
                fmt = DECIMAL_SI
    return Quantity(value if positive else -value, fmt)


# -- canonical formatting -----------------------------------------------------------------------


def _canonical(value: Fraction, fmt: str) -> str:
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mag = -value if value < 0 else value
    if fmt == BINARY_SI and mag >= 1024 and mag.denominator == 1:
        n = mag.numerator
        power = 0
        while n % 1024 == 0:
            n //= 1024
            power += 1
        if power >= len(_BIN_BY_POW):
            n *= 1024 ** (power - len(_BIN_BY_POW) + 1)
            power = len(_BIN_BY_POW) - 1
        return f"{sign}{n}{_BIN_BY_POW[power]}"
    # Decimal: |value| = m * 10**e, with e a multiple of 3, as large as possible.
    m = mag.numerator * (_NANO // mag.denominator)
    e = -9
    while m % 10 == 0:
        m //= 10
        e += 1
    while e % 3:
        m *= 10
        e -= 1
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{m}" if e == 0 else f"{sign}{m}e{e}"
    if e > 18:
        m *= 10 ** (e - 18)
        e = 18
    return f"{sign}{m}{_DEC_BY_EXP[e]}"


# -- helpers ------------------------------------------------------------------------------------


def parse_quantity(s: str | int | float) -> Fraction:
    """The exact value of a quantity string (or number); raises QuantityError."""
    return Quantity.parse(s).value


def format_quantity(value: int | Fraction, fmt: str = DECIMAL_SI) -> str:
    """Canonical string of ``value`` in format ``fmt`` (value rounded up to nano first)."""
    return Quantity(Fraction(value), fmt).canonical()


def _scaled_away_from_zero(value: Fraction, scale: int) -> int:
    # Integer arithmetic on the numerator: a Fraction product was ~30 us per call, paid for
    # every card's resources when a Device CR is laid out into the ledger.
    num = value.numerator * scale
    den = value.denominator
    if den == 1:
        return num
    mag = -((-abs(num)) // den)
    return mag if num >= 0 else -mag


def milli_value(q: Quantity) -> int:
    """``ceil(q * 1000)`` rounded away from zero, like Go's ``MilliValue`` (no int64 wrap)."""
    return _scaled_away_from_zero(q.value, 1000)


def int_value(q: Quantity) -> int:
    """``q`` rounded up to an integer away from zero, like Go's ``Value`` (no int64 wrap)."""
    return _scaled_away_from_zero(q.value, 1)
