"""Go's ``time.ParseDuration``, checked against Go's own table (``time_test.go``'s
``parseDurationTests`` and ``parseDurationErrorTests``)."""

from __future__ import annotations

import pytest

from apis.duration import DurationError, parse_go_duration, parse_go_duration_seconds

NS, US, MS, S, M, H = 1, 1_000, 1_000_000, 1_000_000_000, 60_000_000_000, 3_600_000_000_000

GO_VALID = [
    ("0", 0),
    ("5s", 5 * S),
    ("30s", 30 * S),
    ("1478s", 1478 * S),
    ("-5s", -5 * S),
    ("+5s", 5 * S),
    ("-0", 0),
    ("+0", 0),
    ("5.0s", 5 * S),
    ("5.6s", 5 * S + 600 * MS),
    ("5.s", 5 * S),
    (".5s", 500 * MS),
    ("1.0s", 1 * S),
    ("1.00s", 1 * S),
    ("1.004s", 1 * S + 4 * MS),
    ("1.0040s", 1 * S + 4 * MS),
    ("100.00100s", 100 * S + 1 * MS),
    ("10ns", 10 * NS),
    ("11us", 11 * US),
    ("12µs", 12 * US),
    ("12μs", 12 * US),
    ("13ms", 13 * MS),
    ("14s", 14 * S),
    ("15m", 15 * M),
    ("16h", 16 * H),
    ("3h30m", 3 * H + 30 * M),
    ("10.5s4m", 4 * M + 10 * S + 500 * MS),
    ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
    ("1h2m3s4ms5us6ns", 1 * H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
    ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
    ("52763797000ns", 52763797000 * NS),
    ("0.3333333333333333333h", 20 * M),
    ("9007199254740993ns", ((1 << 53) + 1) * NS),
    ("9223372036854775807ns", (1 << 63) - 1),
    ("9223372036854775.807us", (1 << 63) - 1),
    ("9223372036s854ms775us807ns", (1 << 63) - 1),
    ("-9223372036854775808ns", -(1 << 63)),
    ("-9223372036854775.808us", -(1 << 63)),
    ("-9223372036s854ms775us808ns", -(1 << 63)),
    ("-2562047h47m16.854775808s", -(1 << 63)),
    ("0.100000000000000000000h", 6 * M),
    ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
]

GO_INVALID = [
    ("", 'time: invalid duration ""'),
    ("3", 'time: missing unit in duration "3"'),
    ("-", 'time: invalid duration "-"'),
    ("s", 'time: invalid duration "s"'),
    (".", 'time: invalid duration "."'),
    ("-.", 'time: invalid duration "-."'),
    (".s", 'time: invalid duration ".s"'),
    ("+.s", 'time: invalid duration "+.s"'),
    ("1d", 'time: unknown unit "d" in duration "1d"'),
    ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
    ("9223372036854775.808us", 'time: invalid duration "9223372036854775.808us"'),
    ("9223372036854ms775us808ns", 'time: invalid duration "9223372036854ms775us808ns"'),
    ("-9223372036854775809ns", 'time: invalid duration "-9223372036854775809ns"'),
    # what the three parsers this one replaced disagreed on
    ("90", 'time: missing unit in duration "90"'),
    ("1 s", 'time: unknown unit " s" in duration "1 s"'),
    ("1h 30m", 'time: unknown unit "h " in duration "1h 30m"'),
]


@pytest.mark.parametrize(("text", "nanoseconds"), GO_VALID)
def test_what_go_accepts(text: str, nanoseconds: int) -> None:
    assert parse_go_duration(text) == nanoseconds


@pytest.mark.parametrize(("text", "message"), GO_INVALID)
def test_what_go_refuses_with_gos_message(text: str, message: str) -> None:
    with pytest.raises(DurationError) as err:
        parse_go_duration(text)
    assert str(err.value) == message


def test_seconds() -> None:
    assert parse_go_duration_seconds("1m30s") == 90.0
    assert parse_go_duration_seconds("10us") == 1e-5


@pytest.mark.parametrize("text", ["90", "0", "10us", "-5s", "1m30s", "1.5h", "1d", " 5s", "5s "])
def test_every_component_reads_a_duration_alike(text: str) -> None:
    """The configuration, the gang annotation and koordlet's flags: one answer each (before,
    three parsers disagreed on exactly these)."""
    from apis.gang import GangSpecError
    from apis.gang import parse_duration as gang_duration
    from koordlet.cli import parse_duration as flag_duration
    from scheduler.config import parse_config

    def config(text: str) -> float | None:
        data = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaseDuration": text, "renewDeadline": "2ns", "retryPeriod": "1ns"},
        }
        try:
            return parse_config(data).leader_election.lease_duration
        except ValueError:
            return None

    def gang(text: str) -> float | None:
        try:
            return gang_duration(text, "waiting-time")
        except GangSpecError:
            return None

    def flag(text: str) -> float | None:
        try:
            return flag_duration(text)
        except ValueError:
            return None

    try:
        expected: float | None = parse_go_duration_seconds(text)
    except DurationError:
        expected = None
    if expected is not None and expected <= 0:
        expected = None  # every one of these wants a positive duration
    assert config(text) == gang(text) == flag(text) == expected


# time_test.go's durationTests (Duration.String), in seconds
GO_STRINGS = [
    ("0s", 0),
    ("1ns", 1e-9),
    ("1.1µs", 1.1e-6),
    ("2.2ms", 2.2e-3),
    ("3.3s", 3.3),
    ("4m5s", 4 * 60 + 5),
    ("4m5.001s", 4 * 60 + 5.001),
    ("5h6m7.001s", 5 * 3600 + 6 * 60 + 7.001),
    ("8m0.000000001s", 8 * 60 + 1e-9),
    ("1h0m0s", 3600),
    ("1m30s", 90),
    ("500ms", 0.5),
    ("-1.5s", -1.5),
]


@pytest.mark.parametrize(("text", "seconds"), GO_STRINGS)
def test_durations_are_written_as_go_writes_them(text: str, seconds: float) -> None:
    from apis.duration import format_go_duration

    assert format_go_duration(seconds) == text
    assert parse_go_duration(text) == round(seconds * 1e9)
