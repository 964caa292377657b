"""apis.version, and what is built on it: ``--version`` on every command and subcommand of
both CLIs, and the ``koord_scheduler_build_info`` / ``koordlet_build_info`` gauges."""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable, Sequence
from importlib import metadata

import pytest
from prometheus_client import CollectorRegistry

from apis.version import version, version_line
from koordlet import cli as koordlet_cli
from koordlet.metrics import KoordletMetrics
from scheduler import cli as scheduler_cli
from scheduler.observability.metrics import SchedulerMetrics

MAIN: dict[str, Callable[[Sequence[str]], int]] = {
    "koord-scheduler": scheduler_cli.main,
    "koordlet": koordlet_cli.main,
}
CASES = [
    ("koord-scheduler", []),
    ("koord-scheduler", ["run"]),
    ("koord-scheduler", ["extender"]),
    ("koord-scheduler", ["inspect"]),
    ("koord-scheduler", ["simulate"]),
    ("koord-scheduler", ["explain"]),
    ("koord-scheduler", ["webhook"]),
    ("koord-scheduler", ["webhook", "serve"]),
    ("koord-scheduler", ["webhook", "certs"]),
    ("koordlet", []),
    ("koordlet", ["report"]),
    ("koordlet", ["run"]),
]


def test_version_is_the_installed_distribution() -> None:
    assert version() == metadata.version("koord-py")
    assert version_line("x") == f"x {version()} (koord-py, Python {platform.python_version()})"


@pytest.mark.parametrize(("prog", "sub"), CASES, ids=lambda v: " ".join(v) if v else "-")
def test_every_command_answers_version(
    prog: str, sub: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        MAIN[prog]([*sub, "--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == version_line(prog) + "\n"


@pytest.mark.parametrize(
    ("prog", "build"),
    [("koord-scheduler", scheduler_cli.build_parser), ("koordlet", koordlet_cli.build_parser)],
    ids=["koord-scheduler", "koordlet"],
)
def test_every_subcommand_is_covered(
    prog: str, build: Callable[[], argparse.ArgumentParser]
) -> None:
    """Subcommands added later (explain, ...) get --version too: the table above must list them."""
    action = next(a for a in build()._actions if a.dest == "command")
    assert isinstance(action.choices, dict)
    assert set(action.choices) == {sub[0] for p, sub in CASES if p == prog and sub}


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("koord_scheduler_build_info", lambda r: SchedulerMetrics(r)),
        ("koordlet_build_info", KoordletMetrics),
    ],
    ids=["scheduler", "koordlet"],
)
def test_build_info_gauge(name: str, make: Callable[[CollectorRegistry], object]) -> None:
    registry = CollectorRegistry()
    make(registry)
    labels = {"version": version(), "python_version": platform.python_version()}
    assert registry.get_sample_value(name, labels) == 1.0
