"""B1's cases run end to end on a tiny cluster (the benchmark's figures live in docs, never in
tests; this only keeps the harness working: it broke once when the scheduler's observer grew a
method)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        pytest.param(["--nodes", "30"], "ceiling", id="b1"),
        pytest.param(["--case", "unsched", "--nodes", "30"], "unsch ms", id="unschedulable"),
        pytest.param(
            ["--case", "fill", "--nodes", "30", "--fill-pods", "300"], "pods/s overall", id="fill"
        ),
    ],
)
def test_b1_case_runs(args: list[str], expect: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "b1_throughput.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in done.stdout
