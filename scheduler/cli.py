"""``koord-scheduler``: the composition root, the only place adapters are built.

Subcommands:
  simulate FILE   schedule a scenario on the embedded in-memory cluster and report.

User errors (bad files, bad configuration) print one line on stderr and exit 2; there is no
traceback for them. A completed run exits 0, unschedulable pods included.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scheduler.config import ConfigError, SchedulerConfiguration, default_config, load_config
from scheduler.framework.runtime import FrameworkError
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.report import render
from scheduler.simulator.run import simulate
from scheduler.simulator.scenario import ScenarioError, load_scenario

PROG = "koord-scheduler"
EXIT_USAGE = 2


class UserError(Exception):
    """Reported as one line on stderr with exit code 2."""


def _load_config(path: str | None) -> SchedulerConfiguration:
    if path is None:
        return default_config()
    try:
        return load_config(path)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def cmd_simulate(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    try:
        scenario = load_scenario(args.file)
    except ScenarioError as exc:
        raise UserError(str(exc)) from None
    try:
        result = simulate(scenario, config, in_tree_registry(), default_plugins(), args.seed)
    except FrameworkError as exc:
        raise UserError(f"{args.config or 'default configuration'}: {exc}") from None
    sys.stdout.write(render(result, args.output))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Fine-grained GPU scheduler for Kubernetes, wire-compatible with Koordinator.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = sub.add_parser(
        "simulate",
        help="schedule a YAML scenario on an embedded in-memory cluster",
        description=(
            "Schedule the pending pods of FILE (multi-document YAML of v1 Nodes, "
            "scheduling.koordinator.sh/v1alpha1 Devices and v1 Pods) with the real scheduler "
            "on an in-memory cluster, and report the placements."
        ),
    )
    sim.add_argument("file", metavar="FILE", help="scenario YAML")
    sim.add_argument("--config", metavar="CFG", help="KubeSchedulerConfiguration file")
    sim.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml", "json"),
        default="table",
        help="table (default), or every pod as it would be on the API server",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed for tie-breaking (default 0)")
    sim.set_defaults(func=cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
