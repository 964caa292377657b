"""``koord-scheduler simulate --nodes NODES.csv --pods PODS.csv``: trace replays, side by side.

Role: the trace mode of ``simulate`` (the CLI only adds ``add_trace_arguments`` to its
subparser and hands over to ``run_trace_command``). For every trace (``--pods``, repeatable),
policy (``--profiles``: names of ``config/profiles/<name>.yaml`` or paths to
KubeSchedulerConfiguration files) and seed (``--seeds 42-51``) it replays the trace by the FGD
paper's method (``replay``), then prints the comparison table, writes the curves as CSV
(``<out>/curves.csv``), the table as CSV (``<out>/results.csv``) and one plot per trace
(``<out>/<trace>.png``) with the paper's curves from ``fgd_expected_results/`` (``--expected``;
by default beside the pods file) beside ours. ``--sweep FILE`` takes the study's matrix from a
YAML file instead (``scheduler.simulator.sweep``: scheduler-argument variants too).

Runs are independent: ``--jobs N`` runs them in N processes, ``--executor dask://HOST:PORT``
on a Dask cluster (``scheduler.simulator.executors``). A progress bar goes to stderr while it
runs, unless ``--no-progress`` or stdout is not a terminal.

Invariants: user errors raise ``ReplayUsageError`` (one line, no traceback); every input is
checked before the first replay; the same arguments always give the same table and files,
whichever executor ran them; nothing is written unless every replay finished; trace files are
only read.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from scheduler.config import Plugins
from scheduler.framework.interfaces import PluginFactory
from scheduler.simulator.bound import BoundUnavailable, arrived_at, gpu_bound
from scheduler.simulator.executors import make_executor, parse_executor
from scheduler.simulator.replay import ProgressFn, arrival, capacity_milli
from scheduler.simulator.replay_job import (
    ReplayJob,
    ReplayUsageError,
    read_trace_nodes,
    read_trace_pods,
)
from scheduler.simulator.replay_plan import (
    DEFAULT_PROFILES,
    Plan,
    build_plan,
    parse_seeds,
    read_policies,
    resolve_profile,
)
from scheduler.simulator.replay_report import (
    PaperResults,
    RunRecord,
    mean_std,
    render_table,
    summarize,
    write_csv,
    write_summary_csv,
)
from scheduler.simulator.sweep import load_sweep

__all__ = [
    "ReplayUsageError",
    "add_trace_arguments",
    "parse_seeds",
    "resolve_profile",
    "run_trace_command",
]

EXPECTED_DIR = "fgd_expected_results"
CONNECT_TIMEOUT = 10.0
MATRIX_FLAGS = {
    "nodes": "--nodes",
    "pods": "--pods",
    "profiles": "--profiles",
    "seeds": "--seeds",
    "inflate": "--inflate",
    "target_workload": "--target-workload",
}
"""The flags a sweep file replaces (``--sweep`` with one of them is an error)."""


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("trace replay (the FGD paper's method on Alibaba's openb trace)")
    g.add_argument("--nodes", metavar="NODES.csv", help="openb node list (replaces FILE)")
    g.add_argument(
        "--pods", metavar="PODS.csv", action="append", help="openb pod list (repeatable)"
    )
    g.add_argument("--seeds", default=None, help="seeds, e.g. 42-51 or 42,45 (default 42)")
    g.add_argument(
        "--inflate",
        type=float,
        default=None,
        help="arrive pods until this x GPU capacity is requested (default 1.3)",
    )
    g.add_argument(
        "--profiles",
        default=None,
        help=f"policies: names in config/profiles/ or config files (default {DEFAULT_PROFILES})",
    )
    g.add_argument(
        "--sweep",
        metavar="SWEEP.yaml",
        help="a study's matrix from a file: traces x profiles x seeds x scheduler-argument "
        "variants (replaces --nodes, --pods, --profiles, --seeds; docs/benchmarks.md)",
    )
    g.add_argument("--out", default="replay-results", metavar="DIR", help="CSV and plot folder")
    g.add_argument(
        "--expected", metavar="DIR", help=f"the paper's results (default: {EXPECTED_DIR}/ by PODS)"
    )
    g.add_argument(
        "--target-workload",
        choices=("trace", "learned"),
        default=None,
        help="GPUFragmentation's target workload: the trace's pod shapes (the paper's way, "
        "default) or the profile's own, learned from the pods as they arrive",
    )
    g.add_argument(
        "--executor",
        default="local",
        metavar="local|dask://HOST:PORT",
        help="where replays run: this machine (default; --jobs processes) or an existing Dask "
        "cluster's scheduler (the optional 'dask' extra)",
    )
    g.add_argument("--jobs", type=int, default=1, help="replays run in parallel (processes)")
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=CONNECT_TIMEOUT,
        metavar="S",
        help="dask: seconds to reach the scheduler and a first worker "
        f"(default {CONNECT_TIMEOUT:g})",
    )
    g.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument(
        "--bound",
        action="store_true",
        help="also print the lower bound on unallocated GPU %% at 100%% arrival that no "
        "placement can beat (needs the optional 'bound' extra, highspy)",
    )


class Progress:
    """A one-line bar on ``stream`` with the rate and the time left (redrawn at most every
    0.2 s; nothing before ``delay`` seconds, so a short task draws nothing)."""

    def __init__(
        self,
        stream: TextIO,
        enabled: bool,
        delay: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream, self.enabled, self.delay, self._clock = stream, enabled, delay, clock
        self._start = clock()
        self._last = -math.inf
        self._drawn = False

    def draw(self, label: str, done: int, total: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self._clock()
        elapsed = now - self._start
        if elapsed < self.delay or (not force and now - self._last < 0.2):
            return
        self._last = now
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "." * (width - filled)
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f"ETA {_clock_time((total - done) / rate)}" if rate > 0 else "ETA ?"
        self.stream.write(f"\r{label} [{bar}] {done}/{total} {rate:.1f}/s {eta}\x1b[K")
        self.stream.flush()
        self._drawn = True

    def done(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _clock_time(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _check_out_dir(path: str) -> None:
    """``--out`` must be a folder we can write (made if absent); checked before any work."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ReplayUsageError(f"--out {path}: exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ReplayUsageError(f"--out {path}: cannot create the folder: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ReplayUsageError(f"--out {path}: the folder is not writable")


def run_trace_command(
    args: argparse.Namespace,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    spec = parse_executor(args.executor)
    if not args.connect_timeout > 0:
        raise ReplayUsageError(f"--connect-timeout: must be > 0, got {args.connect_timeout}")
    if args.jobs < 1:
        raise ReplayUsageError(f"--jobs: must be >= 1, got {args.jobs}")
    _check_out_dir(args.out)  # before the replay: a long run must not be lost at its end
    plan = _sweep_plan(args, registry, default_plugins) if args.sweep else _plan(
        args, registry, default_plugins
    )
    progress = Progress(err, not args.no_progress and out.isatty())
    serial = spec.kind == "local" and args.jobs == 1

    def pod_tick(job: ReplayJob, i: int, n: int) -> ProgressFn:
        label = f"{job.label} ({i + 1}/{n})"
        return lambda done, total: progress.draw(label, done, total, force=done == total)

    def replays_done(done: int, total: int) -> None:
        if not serial:  # the serial loop's bar counts pods instead
            progress.draw("replays", done, total, force=True)

    def info(line: str) -> None:
        err.write(line + "\n")
        err.flush()

    executor = make_executor(spec, args.jobs, args.connect_timeout, pod_tick, info)
    try:
        records = executor.run(plan.jobs, replays_done)
    finally:
        progress.done()
    _report(plan, records, args, out, err)
    return 0


def _plan(
    args: argparse.Namespace,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
) -> Plan:
    if not args.nodes or not args.pods:
        raise ReplayUsageError("trace replay needs both --nodes NODES.csv and --pods PODS.csv")
    inflate = 1.3 if args.inflate is None else args.inflate
    seeds = parse_seeds(args.seeds or "42")
    names = args.profiles or (args.config if args.config else DEFAULT_PROFILES)
    policies = read_policies(
        [n.strip() for n in names.split(",") if n.strip()], registry, default_plugins
    )
    learned = args.target_workload == "learned"
    return build_plan(
        args.nodes, args.pods, policies, seeds, inflate, learned, registry, default_plugins
    )


def _sweep_plan(
    args: argparse.Namespace,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
) -> Plan:
    given = [flag for key, flag in MATRIX_FLAGS.items() if getattr(args, key) is not None]
    if getattr(args, "config", None):
        given.append("--config")
    if given:
        raise ReplayUsageError(
            f"--sweep {args.sweep}: {given[0]} cannot be combined with a sweep file "
            "(the file names the traces, profiles, seeds and inflation)"
        )
    return load_sweep(args.sweep, registry, default_plugins)


def _report(
    plan: Plan, records: Sequence[RunRecord], args: argparse.Namespace, out: TextIO, err: TextIO
) -> None:
    expected = (
        args.expected
        or plan.expected
        or os.path.join(os.path.dirname(plan.pods_paths[0]) or ".", EXPECTED_DIR)
    )
    paper = PaperResults(expected) if os.path.isdir(expected) else None
    header = {
        Path(p).stem: _header(plan.nodes_path, p, plan.seeds, plan.inflate)
        for p in plan.pods_paths
    }
    bounds = _bounds(plan) if args.bound else None
    summaries = summarize(records)
    out.write(render_table(summaries, paper, header, bounds))
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "curves.csv")
    write_csv(csv_path, records)
    table_path = os.path.join(args.out, "results.csv")
    write_summary_csv(table_path, summaries)
    written = [csv_path, table_path]
    if not args.no_plot:
        from scheduler.simulator.replay_plot import PlotUnavailable, plot_curves

        try:
            for trace in dict.fromkeys(r.trace for r in records):
                png = os.path.join(args.out, f"{trace}.png")
                plot_curves(png, trace, records, paper)
                written.append(png)
        except PlotUnavailable as exc:
            err.write(f"warning: {exc}\n")
    out.write(f"\nwrote {', '.join(written)}\n")


def _bounds(plan: Plan) -> dict[str, tuple[float, float]]:
    """Trace -> mean ± std over the seeds of the lower bound (``scheduler.simulator.bound``)."""
    nodes = read_trace_nodes(plan.nodes_path)
    capacity = capacity_milli(nodes)
    out: dict[str, tuple[float, float]] = {}
    for path in plan.pods_paths:
        values = []
        for seed in plan.seeds:
            order = [a.pod for a in arrival(read_trace_pods(path), capacity, seed, plan.inflate)]
            arrived = arrived_at(order, capacity)
            if arrived is None:  # the report has no point at 100% for this seed either
                values.append(math.nan)
                continue
            try:
                values.append(gpu_bound(nodes, arrived).unallocated_pct)
            except BoundUnavailable as exc:
                raise ReplayUsageError(f"--bound: {exc}") from None
        out[Path(path).stem] = mean_std(values)
    return out


def _header(nodes_path: str, pods_path: str, seeds: Sequence[int], inflate: float) -> str:
    nodes = read_trace_nodes(nodes_path)
    gpus = sum(n.gpus for n in nodes)
    if len(seeds) == 1:
        span = f"seed {seeds[0]}"
    elif list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        span = f"seeds {seeds[0]}-{seeds[-1]}"
    else:
        span = "seeds " + ",".join(map(str, seeds))
    return (
        f"{len(read_trace_pods(pods_path)):,} pods on {len(nodes):,} nodes with {gpus:,} GPUs; "
        f"{span}; inflate {inflate:g}"
    )
