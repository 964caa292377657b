"""Chaos soak: run the chaos tier for many seeds back to back and print one row per seed.

``make chaos-soak N=50`` (random seeds) or ``SEEDS=371751008,1397707095 make chaos-soak``
(replays). Each run is ``pytest tests/e2e/chaos/test_chaos.py`` in its own process with
``CHAOS_SEED`` and ``CHAOS_REPORT`` set (every other ``CHAOS_*`` knob passes through), so a
run is exactly what ``make test`` runs for that seed. The table (seed, faults, pods, bound,
over-committed cards, lost pods, late binds, pending pods that fit, settle time, wall time,
result) goes to stdout as it grows and, as Markdown, to ``--out`` (default
``chaos-soak.md`` in the current directory) together with each run's JSON figures, so an
interrupted soak keeps what it measured. Exit status: 0 when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COLUMNS = (
    ("seed", "seed"),
    ("faults", "faults_injected"),
    ("pods", "pods_created"),
    ("bound", "pods_bound"),
    ("over-committed", "over_committed_cards"),
    ("lost", "pods_lost"),
    ("late binds", "late_binds"),
    ("fit, pending", "pods_pending_fitting"),
    ("stale-uid landed", "stale_uid_bindings_landed"),
    ("settle s", "settle_seconds"),
)


def _seeds(args: argparse.Namespace) -> list[int]:
    if args.seeds:
        return [int(s) for s in args.seeds.split(",") if s.strip()]
    draw = random.SystemRandom()
    return [draw.randrange(1 << 31) for _ in range(args.n)]


def _run(
    seed: int, pytest: str, log_dir: Path, kube_version: str
) -> tuple[dict[str, Any], str, float]:
    report = log_dir / f"seed-{seed}.json"
    log = log_dir / f"seed-{seed}.log"
    env = dict(os.environ, CHAOS_SEED=str(seed), CHAOS_REPORT=str(report))
    if kube_version:
        env["CHAOS_KUBE_VERSION"] = kube_version
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.call(
            [pytest, "-q", "-rs", "tests/e2e/chaos/test_chaos.py"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wall = time.monotonic() - start
    figures: dict[str, Any] = {"seed": seed}
    if report.exists():
        figures = json.loads(report.read_text())
    result = "passed" if code == 0 else f"FAILED (exit {code}, {log})"
    if code == 0 and "skipped" in log.read_text().splitlines()[-1]:
        result = f"SKIPPED ({log})"
    return figures, result, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=50, help="random seeds to run (default 50)")
    parser.add_argument("--seeds", default="", help="comma-separated seeds to replay instead")
    parser.add_argument("--out", default="chaos-soak.md", help="Markdown table written here")
    parser.add_argument(
        "--kube-version",
        default="",
        help="control plane to run on, e.g. 1.20 or 1.37 (default: the newest of the e2e matrix)",
    )
    parser.add_argument("--pytest", default=str(Path(sys.executable).with_name("pytest")))
    args = parser.parse_args(argv)
    seeds = _seeds(args)
    log_dir = Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    header = [name for name, _ in COLUMNS] + ["wall s", "result"]
    rows: list[list[str]] = []
    out = Path(args.out)
    plane = args.kube_version or "the newest control plane"
    print(f"chaos soak: {len(seeds)} seeds on {plane}, logs and reports in {log_dir}", flush=True)
    print(" | ".join(header), flush=True)
    failures = 0
    for seed in seeds:
        figures, result, wall = _run(seed, args.pytest, log_dir, args.kube_version)
        failures += result != "passed"
        row = [str(figures.get(key, "-")) for _, key in COLUMNS] + [f"{wall:.0f}", result]
        rows.append(row)
        print(" | ".join(row), flush=True)
        table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        table += ["| " + " | ".join(r) + " |" for r in rows]
        out.write_text("\n".join(table) + "\n")
    passed = len(rows) - failures
    print(f"{passed} passed, {failures} failed", flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
