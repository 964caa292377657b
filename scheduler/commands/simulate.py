"""``koord-scheduler simulate``: a scenario file (or a trace) on the embedded in-memory cluster,
scheduled by the same core and plugins as ``run``, and a report. Never imports the Kubernetes
adapter."""

from __future__ import annotations

import argparse
import sys

from scheduler.commands.common import UserError, load_config_or_fail
from scheduler.framework.runtime import FrameworkError
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.replay_cli import Progress, ReplayUsageError, run_trace_command
from scheduler.simulator.report import render
from scheduler.simulator.run import simulate
from scheduler.simulator.scenario import ScenarioError, load_scenario

LOAD_PROGRESS_DELAY = 1.0
"""Seconds of parsing before the scenario's load shows a progress bar (on a terminal only)."""


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.nodes or args.pods or args.sweep:  # trace mode: scheduler/simulator/replay_cli.py
        try:
            return run_trace_command(args, in_tree_registry(), default_plugins())
        except ReplayUsageError as exc:
            raise UserError(str(exc)) from None
    if args.file is None:
        raise UserError("simulate needs a scenario FILE, or --nodes and --pods (a trace)")
    config = load_config_or_fail(args.config)
    # A big scenario takes seconds to parse: a bar on a terminal, after LOAD_PROGRESS_DELAY.
    bar = Progress(sys.stderr, sys.stderr.isatty(), delay=LOAD_PROGRESS_DELAY)
    label = f"loading {'<stdin>' if args.file == '-' else args.file}: documents"
    try:
        scenario = load_scenario(args.file, lambda d, t: bar.draw(label, d, t, force=d == t))
    except ScenarioError as exc:
        raise UserError(str(exc)) from None
    finally:
        bar.done()
    try:
        result = simulate(scenario, config, in_tree_registry(), default_plugins(), args.seed)
    except FrameworkError as exc:
        raise UserError(f"{args.config or 'default configuration'}: {exc}") from None
    sys.stdout.write(render(result, args.output))
    return 0
