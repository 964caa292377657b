"""``hack/control-planes.sh``: ``make test`` starts both control planes' builds in the
background and goes on at once; each build runs through its own script (so its flock and
cache rules hold), the v1.20 chain in order (one Debian source tree), and a failure there is
only logged (the e2e fixtures run the same scripts again and report it).

The real scripts are swapped for stubs in a copy of ``hack/`` that log their start and end
and sleep, so that the test sees the order and that the caller did not wait.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
echo "start $(basename "$0") $(date +%s.%N)" >>"$STUB_LOG"
sleep "${STUB_SLEEP:-1}"
if [[ "$(basename "$0")" == "${STUB_FAIL:-none}" ]]; then
  echo "$(basename "$0"): error: no apt here" >&2; exit 1
fi
echo "end $(basename "$0") $(date +%s.%N)" >>"$STUB_LOG"
echo "BIN=/x/$(basename "$0")"
"""


def _hack_copy(tmp_path: Path) -> Path:
    hack = tmp_path / "hack"
    (hack / "lib").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "hack" / "control-planes.sh", hack)
    shutil.copy(REPO_ROOT / "hack" / "lib" / "common.sh", hack / "lib")
    for name in ("kube-apiserver.sh", "kube-scheduler.sh", "kube-1.37.sh"):
        (hack / name).write_text(STUB)
    return hack


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float, Path]:
    hack = _hack_copy(tmp_path)
    log = tmp_path / "stub.log"
    full = {**os.environ, "KOORD_CACHE_DIR": str(tmp_path / "cache"), "STUB_LOG": str(log), **env}
    full.pop("KOORD_SKIP_E2E", None)
    full.update(env)
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", str(hack / "control-planes.sh")], capture_output=True, text=True, env=full
    )
    return proc, time.monotonic() - start, log


def _wait_lines(log: Path, n: int, timeout: float = 20) -> list[list[str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"{n} stub lines expected, got: {log.read_text() if log.exists() else ''}")


def test_returns_at_once_and_builds_both_planes_in_the_background(tmp_path: Path) -> None:
    proc, took, log = _run(tmp_path, STUB_SLEEP="1")
    assert proc.returncode == 0, proc.stderr
    assert took < 1.0, "the caller waited for the builds"
    assert proc.stdout == ""
    lines = _wait_lines(log, 6)
    events = [(kind, name) for kind, name, _ in lines]
    assert ("start", "kube-1.37.sh") in events and ("end", "kube-1.37.sh") in events
    v120 = [e for e in events if e[1] != "kube-1.37.sh"]
    assert v120 == [
        ("start", "kube-apiserver.sh"),
        ("end", "kube-apiserver.sh"),
        ("start", "kube-scheduler.sh"),
        ("end", "kube-scheduler.sh"),
    ]
    # The two chains overlap: 1.37 started before the 1.20 chain ended.
    when = {(kind, name): float(t) for kind, name, t in lines}
    assert when[("start", "kube-1.37.sh")] < when[("end", "kube-scheduler.sh")]
    logs = tmp_path / "cache" / "build-logs"
    assert "BIN=/x/kube-1.37.sh" in (logs / "kube-1.37.log").read_text()


def test_a_failed_build_is_logged_and_stops_its_chain_only(tmp_path: Path) -> None:
    proc, _, log = _run(tmp_path, STUB_SLEEP="0.2", STUB_FAIL="kube-apiserver.sh")
    assert proc.returncode == 0
    lines = _wait_lines(log, 3)
    time.sleep(0.5)
    events = [(kind, name) for kind, name, _ in (ln.split() for ln in log.read_text().splitlines())]
    assert ("start", "kube-scheduler.sh") not in events  # the chain stopped
    assert ("end", "kube-1.37.sh") in events  # the other went on
    assert lines
    text = (tmp_path / "cache" / "build-logs" / "kube-1.20.log").read_text()
    assert "kube-apiserver.sh: error: no apt here" in text


@pytest.mark.parametrize("arg", ["--now", "x"])
def test_arguments_are_refused_with_one_line(tmp_path: Path, arg: str) -> None:
    hack = _hack_copy(tmp_path)
    proc = subprocess.run(
        ["bash", str(hack / "control-planes.sh"), arg], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "control-planes.sh: error: no arguments expected (usage: hack/control-planes.sh)"
    ]


def test_skip_e2e_builds_nothing(tmp_path: Path) -> None:
    proc, _, log = _run(tmp_path, KOORD_SKIP_E2E="1")
    assert proc.returncode == 0
    time.sleep(0.3)
    assert not log.exists()
    assert "KOORD_SKIP_E2E=1" in proc.stderr
