"""B5's harness runs end to end on a few reviews (the benchmark's figures live in docs, never in
tests): the real webhook process answers every review with the expected verdict, counts each
in its metrics and exits 0 on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_b5_runs_without_errors() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "b5_webhook.py"),
            "--reviews",
            "120",
            "--clients",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "server counted: 120; errors: 0; server exit: 0" in done.stdout
