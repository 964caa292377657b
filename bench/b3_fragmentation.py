"""Benchmark B3 (BENCHMARKS.md): GPU fragmentation on Alibaba's openb trace, against FGD.

Replays the trace by the FGD paper's method (SPEC §9) with every policy side by side, for each
trace variant, through ``koord-scheduler simulate --nodes --pods`` (the same code path), and
prints the comparison tables; CSV and plots go to ``--out``. ``--models`` runs the
constrained-model family instead: the default trace with that % of its GPU tasks restricted
to GPU models (``scheduler.simulator.gpuspec``), written under ``--out``/traces/.
``--bound`` adds the lower bound (the optional ``bound`` extra). ``--profile`` instead runs one
seed of one policy under cProfile and prints where the time goes.

Usage (from the repository root; the trace stays where it is, read by path):

    python bench/b3_fragmentation.py --trace-dir ../shared/traces/alibaba-openb \\
        [--traces default,gpushare40,gpushare60,gpushare80,gpushare100] [--seeds 42-51] \\
        [--profiles random,bestfit,binpack,spread,fgd,fragmentation] [--jobs 2] [--out DIR]
        [--executor dask://HOST:PORT]   # the replays on a Dask cluster instead of --jobs
    python bench/b3_fragmentation.py --trace-dir ... --models 0,20,40,60,80 [--seeds ...]
    python bench/b3_fragmentation.py --trace-dir ... --profile fragmentation
    python bench/b3_fragmentation.py --trace-dir ... --replot DIR/curves.csv --out PNG_DIR
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import sys
import time

from scheduler.cli import main as cli_main

DEFAULT_TRACES = "default,gpushare40,gpushare60,gpushare80,gpushare100"
DEFAULT_PROFILES = "random,dotprod,clustering,packing,bestfit,binpack,fgd,fragmentation"
MODELS_SEED = 2023
"""The draw of the constrained-model family (fixed: one variant per share)."""


def _paths(trace_dir: str, trace: str) -> tuple[str, str]:
    nodes = os.path.join(trace_dir, "openb_node_list_gpu_node.csv")
    pods = os.path.join(trace_dir, f"openb_pod_list_{trace}.csv")
    for path in (nodes, pods):
        if not os.path.isfile(path):
            sys.exit(f"b3: no such file {path}")
    return nodes, pods


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-dir", default="../shared/traces/alibaba-openb")
    parser.add_argument("--traces", default=DEFAULT_TRACES)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--profiles", default=DEFAULT_PROFILES)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--executor", default="local",
                        help="local (--jobs processes) or dask://HOST:PORT (the optional extra)")
    parser.add_argument("--out", default="b3-results")
    parser.add_argument("--profile", metavar="POLICY", help="cProfile one seed of POLICY")
    parser.add_argument("--replot", metavar="CSV", help="only redraw the plots of a curves.csv")
    parser.add_argument("--models", metavar="PERCENTS",
                        help="the constrained-model family: these %% of the default trace's GPU "
                        "tasks restricted to GPU models (e.g. 0,20,40,60,80)")
    parser.add_argument("--bound", action="store_true", help="print the lower bound beside")
    args = parser.parse_args()
    if args.replot:
        return _replot(args.replot, args.trace_dir, args.out)
    print(f"# {platform.platform()}, CPython {platform.python_version()}, {os.cpu_count()} CPUs")
    if args.profile:
        nodes, pods = _paths(args.trace_dir, args.traces.split(",")[0])
        seed = args.seeds.split("-")[0].split(",")[0]
        argv = ["simulate", "--nodes", nodes, "--pods", pods, "--seeds", seed,
                "--profiles", args.profile, "--out", args.out,
                "--no-plot", "--no-progress"]  # fmt: skip
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.runcall(cli_main, argv)
        print(f"# wall {time.perf_counter() - start:.1f} s under cProfile")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return 0
    runs = (
        _model_family(args.trace_dir, args.models, args.out)
        if args.models
        else [(trace, *_paths(args.trace_dir, trace)) for trace in args.traces.split(",")]
    )
    for trace, nodes, pods in runs:
        argv = ["simulate", "--nodes", nodes, "--pods", pods, "--seeds", args.seeds,
                "--profiles", args.profiles, "--executor", args.executor,
                "--out", os.path.join(args.out, trace)]  # fmt: skip
        if args.executor == "local":  # a Dask cluster runs one replay per worker thread
            argv += ["--jobs", str(args.jobs)]
        if args.bound:
            argv.append("--bound")
        start = time.perf_counter()
        code = cli_main(argv)
        print(f"# {trace}: {time.perf_counter() - start:.0f} s wall\n", flush=True)
        if code:
            return code
    return 0


def _model_family(trace_dir: str, percents: str, out: str) -> list[tuple[str, str, str]]:
    """Write the constrained-model variants of the default trace; (name, nodes, pods) each."""
    from scheduler.simulator.gpuspec import constrain, write_pods
    from scheduler.simulator.trace import read_nodes, read_pods

    nodes_path, default = _paths(trace_dir, "default")
    nodes, pods = read_nodes(nodes_path), read_pods(default)
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    runs = []
    for percent in (int(p) for p in percents.split(",")):
        name = f"models{percent:02d}"
        path = os.path.join(out, "traces", f"openb_pod_list_{name}.csv")
        write_pods(path, constrain(pods, nodes, percent / 100, MODELS_SEED))
        runs.append((name, nodes_path, path))
    return runs


def _replot(path: str, trace_dir: str, out: str) -> int:
    from scheduler.simulator.replay_plot import plot_curves
    from scheduler.simulator.replay_report import PaperResults, read_csv

    records = read_csv(path)
    paper = PaperResults(os.path.join(trace_dir, "fgd_expected_results"))
    os.makedirs(out, exist_ok=True)
    for trace in dict.fromkeys(r.trace for r in records):
        png = os.path.join(out, f"b3-{trace.removeprefix('openb_pod_list_')}.png")
        plot_curves(png, trace, records, paper)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
