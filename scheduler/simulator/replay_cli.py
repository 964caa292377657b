"""``koord-scheduler simulate --nodes NODES.csv --pods PODS.csv``: trace replays, side by side.

Role: the trace mode of ``simulate`` (the CLI only adds ``add_trace_arguments`` to its
subparser and hands over to ``run_trace_command``). For every trace (``--pods``, repeatable),
policy (``--profiles``: names of ``config/profiles/<name>.yaml`` or paths to
KubeSchedulerConfiguration files) and seed (``--seeds 42-51``) it replays the trace by the FGD
paper's method (``replay``), then prints the comparison table, writes the curves as CSV
(``<out>/curves.csv``) and one plot per trace (``<out>/<trace>.png``) with the paper's curves
from ``fgd_expected_results/`` (``--expected``; by default beside the pods file) beside ours.

Runs are independent: ``--jobs N`` runs them in N processes. A progress bar goes to stderr
while it runs, unless ``--no-progress`` or stdout is not a terminal.

Invariants: user errors raise ``ReplayUsageError`` (one line, no traceback); the same
arguments always give the same table and files; trace files are only read.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from scheduler.config import ConfigError, Plugins, SchedulerConfiguration, load_config
from scheduler.framework.interfaces import PluginFactory
from scheduler.framework.runtime import FrameworkError
from scheduler.simulator.bound import BoundUnavailable, arrived_at, gpu_bound
from scheduler.simulator.replay import (
    ProgressFn,
    arrival,
    capacity_milli,
    node_order,
    prepare_config,
    replay,
    trace_shapes,
)
from scheduler.simulator.replay_report import (
    PaperResults,
    RunRecord,
    discretize,
    mean_std,
    render_table,
    summarize,
    write_csv,
)
from scheduler.simulator.trace import TraceError, TraceNode, TracePod, read_nodes, read_pods

__all__ = [
    "ReplayUsageError",
    "add_trace_arguments",
    "parse_seeds",
    "resolve_profile",
    "run_trace_command",
]

EXPECTED_DIR = "fgd_expected_results"
DEFAULT_PROFILES = "binpack,spread,fragmentation"


class ReplayUsageError(ValueError):
    """Bad trace-mode arguments or input; ``str()`` is one line."""


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("trace replay (the FGD paper's method on Alibaba's openb trace)")
    g.add_argument("--nodes", metavar="NODES.csv", help="openb node list (replaces FILE)")
    g.add_argument(
        "--pods", metavar="PODS.csv", action="append", help="openb pod list (repeatable)"
    )
    g.add_argument("--seeds", default="42", help="seeds, e.g. 42-51 or 42,45 (default 42)")
    g.add_argument(
        "--inflate",
        type=float,
        default=1.3,
        help="arrive pods until this x GPU capacity is requested (default 1.3)",
    )
    g.add_argument(
        "--profiles",
        default=None,
        help=f"policies: names in config/profiles/ or config files (default {DEFAULT_PROFILES})",
    )
    g.add_argument("--out", default="replay-results", metavar="DIR", help="CSV and plot folder")
    g.add_argument(
        "--expected", metavar="DIR", help=f"the paper's results (default: {EXPECTED_DIR}/ by PODS)"
    )
    g.add_argument(
        "--target-workload",
        choices=("trace", "learned"),
        default="trace",
        help="GPUFragmentation's target workload: the trace's pod shapes (the paper's way, "
        "default) or the profile's own, learned from the pods as they arrive",
    )
    g.add_argument("--jobs", type=int, default=1, help="replays run in parallel (processes)")
    g.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument(
        "--bound",
        action="store_true",
        help="also print the lower bound on unallocated GPU %% at 100%% arrival that no "
        "placement can beat (needs the optional 'bound' extra, highspy)",
    )


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else ("", "")
                first, last = int(lo), int(hi)
                if last < first:
                    raise ValueError
                seeds.extend(range(first, last + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ReplayUsageError(f"--seeds: bad seed or range {part!r} (e.g. 42-51)") from None
    return list(dict.fromkeys(seeds))


def _profile_dirs() -> list[Path]:
    here = Path(__file__).resolve().parents[2] / "config" / "profiles"
    return [Path("config") / "profiles", here]


def resolve_profile(name: str) -> tuple[str, str]:
    """(policy name, config path) for a profile name or a config file path."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        if not os.path.isfile(name):
            raise ReplayUsageError(f"--profiles: no such file {name!r}")
        return Path(name).stem, name
    for d in _profile_dirs():
        path = d / f"{name}.yaml"
        if path.is_file():
            return name, os.fspath(path)
    known = sorted({p.stem for d in _profile_dirs() if d.is_dir() for p in d.glob("*.yaml")})
    raise ReplayUsageError(
        f"--profiles: unknown profile {name!r} (known: {', '.join(known) or 'none found'})"
    )


@dataclass(frozen=True, slots=True)
class _Job:
    nodes_path: str
    pods_path: str
    trace: str
    policy: str
    config_path: str
    seed: int
    inflate: float
    learned: bool
    registry: Mapping[str, PluginFactory]
    default_plugins: Plugins | None


@functools.lru_cache(maxsize=8)
def _nodes(path: str) -> tuple[TraceNode, ...]:
    return tuple(read_nodes(path))


@functools.lru_cache(maxsize=8)
def _pods(path: str) -> tuple[TracePod, ...]:
    return tuple(read_pods(path))


def _config(path: str) -> SchedulerConfiguration:
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise ReplayUsageError(str(exc)) from None
    if len(config.profiles) != 1:
        raise ReplayUsageError(f"{path}: a replay policy needs exactly one profile")
    return config


def _run(job: _Job, progress: ProgressFn | None = None) -> RunRecord:
    nodes = node_order(_nodes(job.nodes_path), job.seed)
    pods = _pods(job.pods_path)
    shapes = trace_shapes(pods)
    order = arrival(pods, capacity_milli(nodes), job.seed, job.inflate)
    config = prepare_config(_config(job.config_path), None if job.learned else shapes, job.seed)
    try:
        result = replay(
            nodes,
            order,
            config,
            job.registry,
            job.default_plugins,
            shapes,
            seed=job.seed,
            progress=progress,
        )
    except FrameworkError as exc:
        raise ReplayUsageError(f"{job.config_path}: {exc}") from None
    return RunRecord(
        job.trace,
        job.policy,
        job.seed,
        discretize(result),
        len(order),
        result.failed,
        result.seconds,
    )


def _run_quietly(job: _Job) -> RunRecord:
    return _run(job)


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
    if not args.nodes or not args.pods:
        raise ReplayUsageError("trace replay needs both --nodes NODES.csv and --pods PODS.csv")
    if args.inflate < 0:
        raise ReplayUsageError(f"--inflate: must be >= 0, got {args.inflate}")
    _check_out_dir(args.out)  # before the replay: a long run must not be lost at its end
    seeds = parse_seeds(args.seeds)
    names = args.profiles or (args.config if args.config else DEFAULT_PROFILES)
    policies = [resolve_profile(n.strip()) for n in names.split(",") if n.strip()]
    for _, path in policies:
        _config(path)
    try:
        _nodes(args.nodes)
        for p in args.pods:
            _pods(p)
    except TraceError as exc:
        raise ReplayUsageError(str(exc)) from None
    jobs = [
        _Job(
            args.nodes,
            p,
            Path(p).stem,
            policy,
            path,
            seed,
            args.inflate,
            args.target_workload == "learned",
            registry,
            default_plugins,
        )
        for p in args.pods
        for policy, path in policies
        for seed in seeds
    ]
    progress = Progress(err, not args.no_progress and out.isatty())
    records = _execute(jobs, max(1, args.jobs), progress)
    progress.done()

    expected = args.expected or os.path.join(os.path.dirname(args.pods[0]) or ".", EXPECTED_DIR)
    paper = PaperResults(expected) if os.path.isdir(expected) else None
    header = {Path(p).stem: _header(args.nodes, p, seeds, args.inflate) for p in args.pods}
    bounds = _bounds(args, seeds) if args.bound else None
    out.write(render_table(summarize(records), paper, header, bounds))
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "curves.csv")
    write_csv(csv_path, records)
    written = [csv_path]
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
    return 0


def _bounds(args: argparse.Namespace, seeds: Sequence[int]) -> dict[str, tuple[float, float]]:
    """Trace -> mean ± std over ``seeds`` of the lower bound (``scheduler.simulator.bound``)."""
    nodes = _nodes(args.nodes)
    capacity = capacity_milli(nodes)
    out: dict[str, tuple[float, float]] = {}
    for path in args.pods:
        values = []
        for seed in seeds:
            order = [a.pod for a in arrival(_pods(path), capacity, seed, args.inflate)]
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
    nodes = _nodes(nodes_path)
    gpus = sum(n.gpus for n in nodes)
    if len(seeds) == 1:
        span = f"seed {seeds[0]}"
    elif seeds == list(range(seeds[0], seeds[-1] + 1)):
        span = f"seeds {seeds[0]}-{seeds[-1]}"
    else:
        span = "seeds " + ",".join(map(str, seeds))
    return (
        f"{len(_pods(pods_path)):,} pods on {len(nodes):,} nodes with {gpus:,} GPUs; "
        f"{span}; inflate {inflate:g}"
    )


def _execute(jobs: Sequence[_Job], workers: int, progress: Progress) -> list[RunRecord]:
    records: list[RunRecord] = []
    if workers == 1:
        for i, job in enumerate(jobs):
            label = f"{job.trace} {job.policy} seed {job.seed} ({i + 1}/{len(jobs)})"

            def tick(done: int, total: int, label: str = label) -> None:
                progress.draw(label, done, total, force=done == total)

            records.append(_run(job, tick))
        return records
    with ProcessPoolExecutor(max_workers=workers) as pool:
        progress.draw("replays", 0, len(jobs), force=True)
        for i, record in enumerate(pool.map(_run_quietly, jobs)):
            records.append(record)
            progress.draw("replays", i + 1, len(jobs), force=True)
    return records
