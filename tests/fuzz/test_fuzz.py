"""The fuzz tier's short pass (part of ``make test``; ``make fuzz`` is the long one).

Per target of ``tests.fuzz.targets``: its seeds decode; then hypothesis draws deep, huge and
odd inputs (``tests.fuzz.strategies``) and each runs in a forked child bounded in time
(``FUZZ_INPUT_SECONDS``, default 10) and memory (``FUZZ_INPUT_MB`` beyond what the process
maps, default 1024): the outcome must be a decode or the target's declared error. Last, one
multiplexed atheris run over every target (``FUZZ_SHORT_SECONDS`` in all, default 20).

Budget: about 60-90 s of CI time on 2 cores (``FUZZ_EXAMPLES`` examples per target,
default 12). Under CI (``CI=true``) the inputs are the same every run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.bounded import run_bounded
from tests.fuzz.driver import ROOT
from tests.fuzz.strategies import inputs
from tests.fuzz.targets import TARGETS, by_name

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
INPUT_SECONDS = float(os.environ.get("FUZZ_INPUT_SECONDS", "10"))
INPUT_MB = int(os.environ.get("FUZZ_INPUT_MB", "1024"))
SHORT_SECONDS = int(os.environ.get("FUZZ_SHORT_SECONDS", "20"))
IN_CI = os.environ.get("CI") == "true"
"""CI draws the same inputs every run (a submission's verdict does not depend on luck); a
developer's run draws new ones, and ``make fuzz`` explores."""

NAMES = sorted(TARGETS())


class Input(bytes):
    """An input that reports itself in a line (hypothesis prints a failing example)."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes: {bytes(self[:80])!r}...>"


@pytest.mark.parametrize("name", NAMES)
def test_seeds_decode(name: str) -> None:
    """The seeds are valid input: a target that refuses them fuzzes nothing but its refusal."""
    target = by_name(name)
    seeds = target.seeds()
    assert seeds
    for seed in seeds:
        target.run(seed)


@pytest.mark.parametrize("name", NAMES)
def test_hostile_input_gets_the_declared_error_in_bounded_time_and_memory(name: str) -> None:
    target = by_name(name)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=IN_CI,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=inputs(target).map(Input))
    def check(data: bytes) -> None:
        outcome = run_bounded(
            target.run, target.errors, data, seconds=INPUT_SECONDS, memory_bytes=INPUT_MB << 20
        )
        assert outcome.kind in ("ok", "refused"), (
            f"{name}: {outcome.kind} on {len(data)} bytes {data[:120]!r}...\n{outcome.detail}"
        )

    check()


def test_short_coverage_guided_pass() -> None:
    """Every target under atheris, multiplexed in one process (startup paid once)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.driver", "--multiplex", "--seconds",
         str(SHORT_SECONDS), "--timeout", str(int(INPUT_SECONDS)), "--rss-mb", "2048",
         *(["--", "-seed=1"] if IN_CI else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=SHORT_SECONDS + 180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"crashes:\n{proc.stdout}\n{proc.stderr[-3000:]}"

