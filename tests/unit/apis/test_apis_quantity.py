"""Tests for apis.quantity: Kubernetes' own test tables plus property tests."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.quantity import (
    BINARY_SI,
    DECIMAL_EXPONENT,
    DECIMAL_SI,
    Quantity,
    QuantityError,
    format_quantity,
    int_value,
    milli_value,
    parse_quantity,
)

BI, DS, DE = BINARY_SI, DECIMAL_SI, DECIMAL_EXPONENT
MAX_BINARY = 2**63 - 1


def dec(mantissa: int, exponent: int) -> Fraction:
    """Go test helper ``dec(i, exponent)``: mantissa * 10**exponent."""
    return Fraction(mantissa) * Fraction(10) ** exponent


# (input, value, format) -- TestQuantityParse from k8s.io/apimachinery.
PARSE_TABLE = [
    ("0", dec(0, 0), DS),
    ("0n", dec(0, 0), DS),
    ("0u", dec(0, 0), DS),
    ("0m", dec(0, 0), DS),
    ("0Ki", dec(0, 0), BI),
    ("0k", dec(0, 0), DS),
    ("0Mi", dec(0, 0), BI),
    ("0M", dec(0, 0), DS),
    ("0Gi", dec(0, 0), BI),
    ("0G", dec(0, 0), DS),
    ("0Ti", dec(0, 0), BI),
    ("0T", dec(0, 0), DS),
    ("1", dec(1, 0), DS),
    ("1Ki", dec(1024, 0), BI),
    ("8Ki", dec(8 * 1024, 0), BI),
    ("7Mi", dec(7 * 1024**2, 0), BI),
    ("6Gi", dec(6 * 1024**3, 0), BI),
    ("5Ti", dec(5 * 1024**4, 0), BI),
    ("4Pi", dec(4 * 1024**5, 0), BI),
    ("3Ei", dec(3 * 1024**6, 0), BI),
    ("10Ti", dec(10 * 1024**4, 0), BI),
    ("100Ti", dec(100 * 1024**4, 0), BI),
    ("5n", dec(5, -9), DS),
    ("4u", dec(4, -6), DS),
    ("3m", dec(3, -3), DS),
    ("9", dec(9, 0), DS),
    ("8k", dec(8, 3), DS),
    ("50k", dec(5, 4), DS),
    ("7M", dec(7, 6), DS),
    ("6G", dec(6, 9), DS),
    ("5T", dec(5, 12), DS),
    ("40T", dec(4, 13), DS),
    ("300T", dec(3, 14), DS),
    ("2P", dec(2, 15), DS),
    ("1E", dec(1, 18), DS),
    ("1E-3", dec(1, -3), DE),
    ("1e3", dec(1, 3), DE),
    ("1E6", dec(1, 6), DE),
    ("1e9", dec(1, 9), DE),
    ("1E12", dec(1, 12), DE),
    ("1e15", dec(1, 15), DE),
    ("1E18", dec(1, 18), DE),
    ("1e14", dec(1, 14), DE),
    ("1e13", dec(1, 13), DE),
    ("100.035k", dec(100035, 0), DS),
    ("0.001", dec(1, -3), DS),
    ("0.0005k", dec(5, -1), DS),
    ("0.005", dec(5, -3), DS),
    ("0.05", dec(5, -2), DS),
    ("0.5", dec(5, -1), DS),
    ("0.00050k", dec(5, -1), DS),
    ("0.00500", dec(5, -3), DS),
    ("0.05000", dec(5, -2), DS),
    ("0.50000", dec(5, -1), DS),
    ("0.5e0", dec(5, -1), DE),
    ("0.5e-1", dec(5, -2), DE),
    ("0.5e-2", dec(5, -3), DE),
    ("10.035M", dec(10035, 3), DS),
    ("1.2e3", dec(12, 2), DE),
    ("1.3E+6", dec(13, 5), DE),
    ("1.40e9", dec(14, 8), DE),
    ("1.53E12", dec(153, 10), DE),
    ("1.6e15", dec(16, 14), DE),
    ("1.7E18", dec(17, 17), DE),
    ("9.01", dec(901, -2), DS),
    ("8.1k", dec(81, 2), DS),
    ("7.123456M", dec(7123456, 0), DS),
    ("6.987654321G", dec(6987654321, 0), DS),
    ("5.444T", dec(5444, 9), DS),
    ("40.1T", dec(401, 11), DS),
    ("300.2T", dec(3002, 11), DS),
    ("2.5P", dec(25, 14), DS),
    ("1.01E", dec(101, 16), DS),
    ("3.001n", dec(4, -9), DS),
    ("1.1E-9", dec(2, -9), DE),
    ("0.0000000001", dec(1, -9), DS),
    ("0.0000000005", dec(1, -9), DS),
    ("0.00000000050", dec(1, -9), DS),
    ("0.5e-9", dec(1, -9), DE),
    ("0.9n", dec(1, -9), DS),
    ("0.00000012345", dec(124, -9), DS),
    ("0.00000012354", dec(124, -9), DS),
    ("9Ei", Fraction(MAX_BINARY), BI),
    ("9223372036854775807Ki", Fraction(MAX_BINARY), BI),
    ("12E", dec(12, 18), DS),
    ("100.035Ki", dec(10243584, -2), BI),
    ("0.5Mi", dec(512 * 1024, 0), BI),
    ("0.05Gi", dec(536870912, -1), BI),
    ("0.025Ti", dec(274877906944, -1), BI),
    ("0.000000000001Ki", dec(2, -9), DS),
    (".001", dec(1, -3), DS),
    (".0001k", dec(100, -3), DS),
    ("1.", dec(1, 0), DS),
    ("1.G", dec(1, 9), DS),
    # Digit-less numbers are zero in Go's fast path (see TestParseQuantityString).
    (".", dec(0, 0), DS),
    ("-.", dec(0, 0), DS),
    ("-", dec(0, 0), DS),
    ("Ki", dec(0, 0), BI),
    # Tiny values far below a nano still round up to exactly 1n.
    ("1e-1000000", dec(1, -9), DE),
    ("0." + "0" * 5000 + "1Ki", dec(1, -9), DS),
    # Exponents wrap like Go's int32(ParseInt(...)).
    ("1e4294967296", dec(1, 0), DE),
    ("1e4294967299", dec(1, 3), DE),
]


@pytest.mark.parametrize(
    ("text", "value", "fmt"), PARSE_TABLE, ids=[t[0][:40] for t in PARSE_TABLE]
)
def test_parse_matches_kubernetes_table(text: str, value: Fraction, fmt: str) -> None:
    q = Quantity.parse(text)
    assert (q.value, q.format) == (value, fmt)
    neg = Quantity.parse("-" + text.lstrip("+-"))
    assert (neg.value, neg.format) == (-value if text[:1] != "-" else value, fmt)
    if text[:1] not in "+-":
        plus = Quantity.parse("+" + text)
        assert (plus.value, plus.format) == (value, fmt)


INVALID = [
    "",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
    "12Zi",
    "1K",
    "1KI",
    "1ki",
    "1e",
    "1ee3",
    "1e3.5",
    "1e99999999999999999999",
    "e-10",
    ".e-10",
    "1_000",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: Go only accepts ASCII digits
    "1\n",
    "1" + "0" * 1001,
    "1e1001",
    "Non-Numeric",
]


@pytest.mark.parametrize("text", INVALID, ids=[repr(t)[:30] for t in INVALID])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        Quantity.parse(text)
    assert str(info.value).startswith("invalid quantity ")


def test_error_message_quotes_the_input() -> None:
    with pytest.raises(QuantityError, match=r'^invalid quantity "12Zi"$'):
        Quantity.parse("12Zi")


# (value, format, canonical, alternate spelling) -- TestQuantityString.
STRING_TABLE = [
    (dec(1024**3, 0), BI, "1Gi", "1024Mi"),
    (dec(300 * 1024**2, 0), BI, "300Mi", "307200Ki"),
    (dec(6 * 1024, 0), BI, "6Ki", ""),
    (dec(1001 * 1024**3, 0), BI, "1001Gi", "1025024Mi"),
    (dec(1024**4, 0), BI, "1Ti", "1024Gi"),
    (dec(5, 0), BI, "5", "5000m"),
    (dec(500, -3), BI, "500m", "0.5"),
    (dec(1, 9), DS, "1G", "1000M"),
    (dec(1000, 6), DS, "1G", "0.001T"),
    (dec(1000000, 3), DS, "1G", ""),
    (dec(1000000000, 0), DS, "1G", ""),
    (dec(1, -3), DS, "1m", "1000u"),
    (dec(80, -3), DS, "80m", ""),
    (dec(1080, -3), DS, "1080m", "1.08"),
    (dec(108, -2), DS, "1080m", "1080000000n"),
    (dec(10800, -4), DS, "1080m", ""),
    (dec(300, 6), DS, "300M", ""),
    (dec(1, 12), DS, "1T", ""),
    (dec(1234567, 6), DS, "1234567M", ""),
    (dec(1234567, -3), BI, "1234567m", ""),
    (dec(3, 3), DS, "3k", ""),
    (dec(1025, 0), BI, "1025", ""),
    (dec(0, 0), DS, "0", ""),
    (dec(0, 0), BI, "0", ""),
    (dec(1, 9), DE, "1e9", ".001e12"),
    (dec(1, -3), DE, "1e-3", "0.001e0"),
    (dec(1, -9), DE, "1e-9", "1000e-12"),
    (dec(80, -3), DE, "80e-3", ""),
    (dec(300, 6), DE, "300e6", ""),
    (dec(1, 12), DE, "1e12", ""),
    (dec(1, 3), DE, "1e3", ""),
    (dec(3, 3), DE, "3e3", ""),
    (dec(0, 0), DE, "0", "00"),
    (dec(1, -9), DS, "1n", ""),
    (dec(80, -9), DS, "80n", ""),
    (dec(1080, -9), DS, "1080n", ""),
    (dec(108, -8), DS, "1080n", ""),
    (dec(10800, -10), DS, "1080n", ""),
    (dec(1, -6), DS, "1u", ""),
    (dec(80, -6), DS, "80u", ""),
    (dec(1080, -6), DS, "1080u", ""),
    # SPEC section 5 and the task's examples.
    (dec(17179869184, 0), BI, "16Gi", ""),
    (dec(85198045184, 0), BI, "83201216Ki", ""),
    (dec(1000, 0), DS, "1k", ""),
    (dec(100, 0), DS, "100", ""),
    (dec(2**30 + 1, 0), BI, "1073741825", ""),
    (dec(1023, 0), BI, "1023", ""),
    (dec(1536, 0), BI, "1536", ""),
    (dec(-(1024**2), 0), BI, "-1Mi", ""),
    (dec(15472384 * 1024, 0), BI, "15472384Ki", ""),
    (dec(MAX_BINARY, 0), BI, "9223372036854775807", ""),
    (dec(7 * 2**60, 0), BI, "7Ei", ""),
    # Past Go's suffix tables: scaled to the largest suffix instead of dropping it.
    (dec(1, 21), DS, "1000E", ""),
    (dec(2**70, 0), BI, "1024Ei", ""),
]


@pytest.mark.parametrize(
    ("value", "fmt", "expect", "alternate"),
    STRING_TABLE,
    ids=[f"{t[2]}-{t[1]}" for t in STRING_TABLE],
)
def test_canonical_string(value: Fraction, fmt: str, expect: str, alternate: str) -> None:
    q = Quantity(value, fmt)
    assert q.canonical() == expect
    assert str(q) == expect
    assert format_quantity(value, fmt) == expect
    if not (fmt == BI and value > MAX_BINARY):  # parsing caps BinarySI at 2**63-1
        assert Quantity.parse(expect).value == value
    if alternate:
        assert Quantity.parse(alternate).canonical() == expect
    if value > 0:
        assert Quantity(-value, fmt).canonical() == "-" + expect


# TestQuantityParseEmit
EMIT_TABLE = [
    ("1Ki", "1Ki"),
    ("1Mi", "1Mi"),
    ("1Gi", "1Gi"),
    ("1024Mi", "1Gi"),
    ("1000M", "1G"),
    (".001Ki", "1024m"),
    (".000001Ki", "1024u"),
    (".000000001Ki", "1024n"),
    (".000000000001Ki", "2n"),
    ("1.5Gi", "1536Mi"),
    ("1.5", "1500m"),
    ("1500m", "1500m"),
    ("0.5", "500m"),
    ("1.500k", "1500"),
    ("+1", "1"),
    ("01", "1"),
    ("1E3", "1e3"),
    ("1e4", "10e3"),
    ("12e-1", "1200e-3"),
]


@pytest.mark.parametrize(("text", "expect"), EMIT_TABLE, ids=[t[0] for t in EMIT_TABLE])
def test_parse_then_emit(text: str, expect: str) -> None:
    assert str(Quantity.parse(text)) == expect
    assert str(Quantity.parse("-" + text.lstrip("+"))) == "-" + expect


# TestNewSet / TestMilliNewSet / TestNewScaledSet
NEW_TABLE = [
    (Fraction(1), DS, "1"),
    (Fraction(1000), DS, "1k"),
    (Fraction(1234000), DS, "1234k"),
    (Fraction(1024), BI, "1Ki"),
    (Fraction(1024 * 1024), BI, "1Mi"),
    (Fraction(1, 1000), DS, "1m"),
    (Fraction(1234), DS, "1234"),
    (Fraction(1024, 1000), BI, "1024m"),
    (Fraction(1024 * 1024, 1000), BI, "1048576m"),
    (Fraction(1000000), DE, "1e6"),
    (Fraction(1000), DE, "1e3"),
    (dec(1, -9), DS, "1n"),
    (dec(1000, -9), DS, "1u"),
    (dec(1000, -6), DS, "1m"),
    (dec(1000, -3), DS, "1"),
]


@pytest.mark.parametrize(("value", "fmt", "expect"), NEW_TABLE, ids=[t[2] for t in NEW_TABLE])
def test_construct_and_print(value: Fraction, fmt: str, expect: str) -> None:
    assert Quantity.of(value, fmt).canonical() == expect
    assert Quantity.parse(expect).value == value


CONSTRUCT_ROUNDING = [
    ("third", Fraction(1, 3), Fraction(333333334, 10**9)),
    ("neg-third", Fraction(-1, 3), Fraction(-333333334, 10**9)),
    ("exact", Fraction(3, 2), Fraction(3, 2)),
    ("int", Fraction(7), Fraction(7)),
]


@pytest.mark.parametrize(
    ("value", "expect"), [c[1:] for c in CONSTRUCT_ROUNDING], ids=[c[0] for c in CONSTRUCT_ROUNDING]
)
def test_construction_rounds_up_to_nano(value: Fraction, expect: Fraction) -> None:
    assert Quantity(value).value == expect


def test_construction_validates() -> None:
    with pytest.raises(ValueError, match="unknown quantity format"):
        Quantity(Fraction(1), "Bogus")
    with pytest.raises(TypeError):
        Quantity(1.5, DS)  # type: ignore[arg-type]
    assert Quantity(3, DS).value == Fraction(3)  # type: ignore[arg-type]


NUMBER_INPUTS = [
    ("int", 5, Fraction(5), "5"),
    ("int-k", 2000, Fraction(2000), "2k"),
    ("neg-int", -7, Fraction(-7), "-7"),
    ("float-tenth", 0.1, Fraction(1, 10), "100m"),
    ("float-big", 1e20, Fraction(10**20), "100E"),
    ("float-neg-zero", -0.0, Fraction(0), "0"),
    ("float-tiny", 1e-12, Fraction(1, 10**9), "1n"),
]


@pytest.mark.parametrize(
    ("raw", "value", "text"), [c[1:] for c in NUMBER_INPUTS], ids=[c[0] for c in NUMBER_INPUTS]
)
def test_parse_numbers(raw: int | float, value: Fraction, text: str) -> None:
    q = Quantity.parse(raw)
    assert (q.value, q.format, str(q)) == (value, DS, text)


@pytest.mark.parametrize("raw", [float("nan"), float("inf"), float("-inf"), True, None, b"1"])
def test_parse_rejects_non_quantities(raw: object) -> None:
    with pytest.raises(QuantityError):
        Quantity.parse(raw)  # type: ignore[arg-type]


SCALED = [
    ("1", 1, 1000),
    ("1500m", 2, 1500),
    ("1.0001", 2, 1001),
    ("0.1m", 1, 1),
    ("1n", 1, 1),
    ("-1500m", -2, -1500),
    ("-1.0001", -2, -1001),
    ("0", 0, 0),
    ("16Gi", 17179869184, 17179869184000),
]


@pytest.mark.parametrize(("text", "value", "milli"), SCALED, ids=[t[0] for t in SCALED])
def test_int_and_milli_value_round_away_from_zero(text: str, value: int, milli: int) -> None:
    q = Quantity.parse(text)
    assert int_value(q) == value
    assert milli_value(q) == milli


def test_parse_quantity_helper() -> None:
    assert parse_quantity("8Gi") == 8 * 2**30
    assert parse_quantity("250m") == Fraction(1, 4)


def test_equality_is_numeric_and_ordering_works() -> None:
    a, b = Quantity.parse("1Ki"), Quantity.parse("1024")
    assert a == b and hash(a) == hash(b) and a.format != b.format
    assert Quantity.parse("1") < Quantity.parse("1001m") <= Quantity.parse("1.001")
    assert Quantity.parse("2") > Quantity.parse("1999m") >= Quantity.parse("1.999")
    assert a != "1Ki"
    assert repr(a) == "Quantity('1Ki', BinarySI)"


# -- properties ---------------------------------------------------------------------------------

_SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_MULT = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
    "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}  # fmt: skip

quantities = st.builds(
    lambda n, scale, fmt: Quantity(Fraction(n, 10**scale), fmt),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.integers(min_value=0, max_value=12),
    st.sampled_from([DS, BI, DE]),
)


@given(quantities)
def test_canonical_round_trips(q: Quantity) -> None:
    text = q.canonical()
    again = Quantity.parse(text)
    assert again.value == q.value or (q.format == BI and abs(q.value) > MAX_BINARY)
    if q.format == BI and again.format != BI:
        # A BinarySI amount no binary suffix expresses prints as a plain number, which parses
        # as DecimalSI (Go's ParseQuantity("25000") is "25k"): stable from there on.
        assert Quantity.parse(again.canonical()).canonical() == again.canonical()
        return
    assert again.canonical() == text or abs(q.value) > MAX_BINARY


@given(st.integers(min_value=-MAX_BINARY, max_value=MAX_BINARY))
def test_binary_integers_round_trip_with_format(n: int) -> None:
    text = format_quantity(n, BI)
    q = Quantity.parse(text)
    assert q.value == n
    if abs(n) >= 1024 and n % 1024 == 0:
        assert q.format == BI and text[-2:] in {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
    elif abs(n) >= 1024:
        assert text == str(n)  # no binary suffix fits, and decimal suffixes are not used
    else:
        assert text == format_quantity(n, DS)  # below 1024 it prints as DecimalSI


@given(
    st.booleans(),
    st.text("0123456789", min_size=1, max_size=25),
    st.one_of(st.none(), st.text("0123456789", max_size=25)),
    st.sampled_from(_SUFFIXES),
)
def test_parse_matches_decimal_oracle(neg: bool, whole: str, frac: str | None, suffix: str) -> None:
    text = ("-" if neg else "") + whole + ("" if frac is None else "." + frac) + suffix
    exact = Fraction(Decimal(whole + "." + (frac or "0"))) * _MULT[suffix]
    rounded = -((-exact.numerator * 10**9) // exact.denominator)  # ceil to nano
    expect = Fraction(rounded, 10**9)
    fmt = BI if suffix.endswith("i") else DS
    if fmt == BI:
        expect = min(expect, Fraction(MAX_BINARY))
        if 0 < expect < 1:
            fmt = DS
    q = Quantity.parse(text)
    assert q.value == (-expect if neg else expect)
    assert q.format == fmt


@given(st.integers(min_value=-(10**20), max_value=10**20), st.integers(-30, 30))
def test_exponent_form_matches_oracle(mantissa: int, exponent: int) -> None:
    q = Quantity.parse(f"{mantissa}e{exponent}")
    exact = Fraction(mantissa) * Fraction(10) ** exponent
    mag = -((-abs(exact.numerator) * 10**9) // exact.denominator)
    assert q.value == (Fraction(mag, 10**9) if exact >= 0 else -Fraction(mag, 10**9))
    assert q.format == DE


@given(
    st.fractions(max_denominator=10**12).filter(lambda f: abs(f) < 10**20),
    st.sampled_from([1, 1000]),
)
def test_scaling_matches_exact_fraction_arithmetic(value: Fraction, scale: int) -> None:
    """``int_value``/``milli_value`` work on the numerator (no Fraction product); they equal
    the exact rule: ``value * scale`` rounded up in magnitude, the sign kept."""
    q = Quantity(value)
    scaled = q.value * scale
    magnitude = -((-abs(scaled.numerator)) // scaled.denominator)
    expected = magnitude if scaled >= 0 else -magnitude
    assert (int_value(q) if scale == 1 else milli_value(q)) == expected
