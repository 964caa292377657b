"""``koord-scheduler``: parses the command line and dispatches to the command's composition root
(``scheduler.commands``: one module per command, the only place adapters are built).

Subcommands:
  run             the scheduler against a real cluster (kubeconfig or in-cluster), with leader
                  election, /healthz /livez /readyz /metrics, and JSON logs.
  simulate FILE   schedule a scenario on the embedded in-memory cluster and report.
  extender        answer the default kube-scheduler's extender verbs with the same core.
  inspect [NODE]  the per-node, per-GPU allocation table of a live cluster (or of files).
  explain NS/POD  why a pending pod does not fit: per node, per card, after preemption.
  webhook         the admission webhook (serve) and its certificates (certs); also
                  installed as ``koord-webhook``.

The Kubernetes adapter (and the ``kubernetes`` client behind it) is imported only inside the
commands that read a cluster, so ``simulate`` starts fast and works without it.

User errors (bad files, bad configuration) print one line on stderr and exit 2; there is no
traceback for them. A completed run exits 0, unschedulable pods included.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from apis.logflags import log_level, verbosity
from scheduler.commands.common import UserError
from scheduler.commands.common import bool_flag as _bool
from scheduler.commands.common import duration_flag as _duration
from scheduler.commands.webhook import add_webhook_parser
from scheduler.observability import logs

PROG = "koord-scheduler"
EXIT_USAGE = 2


def _lazy(module: str, name: str) -> Any:
    """The command function ``module.name``, imported when the command runs: each command's
    composition root imports its own world (``run``: the kube adapter; ``simulate``: the
    simulator), so ``run`` does not pay for the others' imports at start-up."""

    def command(args: argparse.Namespace) -> int:
        import importlib

        func = getattr(importlib.import_module(module), name)
        return int(func(args))

    command.__qualname__ = command.__name__ = name
    return command


cmd_explain = _lazy("scheduler.commands.explain", "cmd_explain")
cmd_extender = _lazy("scheduler.commands.extender", "cmd_extender")
cmd_inspect = _lazy("scheduler.commands.inspect", "cmd_inspect")
cmd_run = _lazy("scheduler.commands.run", "cmd_run")
cmd_simulate = _lazy("scheduler.commands.simulate", "cmd_simulate")


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr and exit 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def _add_explain(sub: Any) -> None:
    exp = sub.add_parser(
        "explain",
        help="why a pending pod does not fit: per node, per card, after preemption",
        description=(
            "For the pod NAMESPACE/POD: the filter that rejects each node and its reason, each "
            "GPU card's free gpu-core/memory against the pod's per-card need, the nodes where "
            "it would fit after evicting lower-priority pods, and the closest candidates. "
            "Reads a live cluster, or YAML/JSON files with --file, and runs the scheduler's own "
            "PreFilter/Filter code on them."
        ),
    )
    exp.add_argument("pod", metavar="NAMESPACE/POD")
    _kube_flags(exp)
    exp.add_argument("--config", metavar="CFG", help="KubeSchedulerConfiguration file")
    exp.add_argument(
        "-f", "--file", action="append", metavar="FILE", help="read objects from FILE (repeatable)"
    )
    exp.add_argument("-o", "--output", choices=("table", "json"), default="table")
    exp.set_defaults(func=cmd_explain)


def _kube_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file")
    parser.add_argument("--master", metavar="URL", help="API server address (overrides)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


def _verbosity(text: str) -> int:
    try:
        return verbosity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_run(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="schedule pods on a real cluster",
        description=(
            "Run koord-scheduler against the cluster of --kubeconfig (or in-cluster): "
            "list/watch Nodes, Pods and Device CRs, schedule pods whose schedulerName is one "
            "of the profiles, bind them with their device allocation. Serves /healthz, "
            "/livez, /readyz and /metrics as HTTPS on --bind-address:--secure-port (tokens "
            "checked with the API server), and as plain HTTP on --port only when it is set."
        ),
    )
    _serve_flags(run)
    _secure_serving_flags(run)
    run.set_defaults(func=cmd_run)


def _add_extender(sub: Any) -> None:
    ext = sub.add_parser(
        "extender",
        help="serve kube-scheduler's extender verbs (filter, prioritize, bind, preempt)",
        description=(
            "Keep koord-scheduler's informers, device ledger and plugins, and answer the "
            "default kube-scheduler's extender calls with them: filter and prioritize from the "
            "ledger (binds in flight included), bind = choose the cards on kube-scheduler's "
            "node, reserve them and write one pods/binding with the device annotations. The "
            "verbs are served at / and under /gpushare-scheduler/ (gpushare's paths, with "
            "/inspect and /version), on --extender-address:--extender-port. Only the leader "
            "answers; /readyz is ready only on the leader."
        ),
    )
    _serve_flags(ext)
    _secure_serving_flags(ext)
    ext.add_argument(
        "--extender-address",
        default="0.0.0.0",
        metavar="ADDR",
        help="address of the extender verbs (default 0.0.0.0)",
    )
    ext.add_argument(
        "--extender-port",
        type=int,
        default=39999,
        metavar="PORT",
        help="port of the extender verbs (default 39999, gpushare's; 0: any)",
    )
    ext.add_argument(
        "--profile",
        metavar="NAME",
        help="the profile (schedulerName) whose plugins answer (default: the first)",
    )
    ext.add_argument(
        "--bind-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="longest wait for a bind's outcome before answering an error (default 30)",
    )
    ext.add_argument(
        "--gpushare-memory-unit",
        choices=("GiB", "MiB"),
        default="GiB",
        help="unit of aliyun.com/gpu-mem in /gpushare-scheduler/inspect (default GiB)",
    )
    ext.set_defaults(func=cmd_extender)


def _serve_flags(run: argparse.ArgumentParser) -> None:
    """The flags ``run`` and ``extender`` share."""
    run.add_argument("--config", metavar="CFG", help="KubeSchedulerConfiguration file")
    run.add_argument(
        "--write-config-to",
        metavar="PATH",
        help="write the effective configuration (defaults, default plugins and flags applied) "
        "to PATH as a KubeSchedulerConfiguration and exit, as kube-scheduler does",
    )
    _kube_flags(run)
    run.add_argument(
        "--kube-api-qps",
        type=float,
        default=500.0,
        metavar="QPS",
        help="client-side rate limit of API requests: binds, status patches, lists "
        "(default 500; <= 0: none)",
    )
    run.add_argument(
        "--kube-api-burst",
        type=int,
        default=1000,
        metavar="N",
        help="client-side request burst (default 1000)",
    )
    run.add_argument(
        "--event-qps",
        type=float,
        default=50.0,
        metavar="QPS",
        help="event writes per second, all pods together (default 50)",
    )
    run.add_argument(
        "--event-burst", type=int, default=100, metavar="N", help="event write burst (default 100)"
    )
    run.add_argument(
        "--bind-address",
        default="0.0.0.0",
        metavar="ADDR",
        help="address of the HTTP endpoints (default 0.0.0.0)",
    )
    run.add_argument(
        "--port",
        type=int,
        default=0,
        help="INSECURE: also serve the endpoints as plain HTTP without authentication on this "
        "port (10251 was the default; default 0: disabled)",
    )
    run.add_argument(
        "--bind-mode",
        choices=("binding", "patch"),
        default="binding",
        help="binding: the device annotation rides on the pods/binding write "
        "(one write, default); patch: patch the annotation, then bind",
    )
    run.add_argument(
        "--kube-transport",
        choices=("urllib3", "http11"),
        default="http11",
        help="HTTP client of the API requests (not the watches): http11, a lean keep-alive "
        "HTTP/1.1 client (default; less CPU per request), or urllib3's pool; same timeouts, "
        "no retries either way",
    )
    run.add_argument(
        "--bind-workers",
        type=int,
        default=64,
        metavar="N",
        help="concurrent binding cycles and cluster writes (default 64; kube-scheduler binds "
        "every pod in its own goroutine)",
    )
    run.add_argument(
        "--leader-elect",
        type=_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="BOOL",
        help="elect a leader before scheduling (bare: true; --leader-elect=false: off); "
        "overrides leaderElection.leaderElect of the configuration",
    )
    for flag, field, what in (
        (
            "lease-duration",
            "leaseDuration",
            "how long a non-leader waits before taking an unrenewed lease",
        ),
        (
            "renew-deadline",
            "renewDeadline",
            "how long the leader tries to renew before it gives up leading",
        ),
        ("retry-period", "retryPeriod", "the wait between two tries to acquire or renew"),
    ):
        run.add_argument(
            f"--leader-elect-{flag}",
            type=_duration,
            metavar="DURATION",
            help=f"{what} (Go duration, e.g. 15s); overrides leaderElection.{field}",
        )
    run.add_argument(
        "--leader-elect-resource-name",
        metavar="NAME",
        help="the Lease's name; overrides leaderElection.resourceName",
    )
    run.add_argument(
        "--leader-elect-resource-namespace",
        metavar="NS",
        help="the Lease's namespace; overrides leaderElection.resourceNamespace",
    )
    run.add_argument(
        "--identity",
        metavar="ID",
        help="leader election identity (default: $POD_NAME or hostname + uuid)",
    )
    _log_flags(run)


def _log_flags(run: argparse.ArgumentParser) -> None:
    """The log flags of the serving commands (``run``, ``extender``, ``webhook serve``)."""
    run.add_argument(
        "--log-format", choices=logs.FORMATS, default="json", help="json lines (default) or console"
    )
    run.add_argument(
        "--log-level",
        choices=logs.LEVELS,
        default=None,
        help="lowest level logged (default info); or -v",
    )
    run.add_argument(
        "-v",
        "--v",
        type=_verbosity,
        default=None,
        metavar="N",
        help="klog verbosity, as kube-scheduler's: 0-3 log at info, 4 and more at debug "
        "(give -v or --log-level, not both)",
    )


def log_level_of(args: argparse.Namespace) -> str:
    """The log level of ``run``/``extender`` from ``--log-level`` or ``-v``."""
    try:
        return log_level(args.log_level, args.v)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _secure_serving_flags(run: argparse.ArgumentParser) -> None:
    """The secure port (``run`` and ``extender``), kube-scheduler's flags and defaults."""
    secure = run.add_argument_group(
        "secure serving",
        "HTTPS on --bind-address:--secure-port; requests are authenticated (bearer token -> "
        "TokenReview; none: system:anonymous) and authorized (SubjectAccessReview, verb get "
        "on the path) by the API server, except the always-allowed paths",
    )
    secure.add_argument(
        "--secure-port",
        type=int,
        default=10259,
        metavar="PORT",
        help="HTTPS port of /healthz, /livez, /readyz, /metrics, /debug/* (default 10259; "
        "0: disabled)",
    )
    secure.add_argument(
        "--tls-cert-file",
        metavar="PATH",
        help="PEM certificate (chain) of the secure port (default: a self-signed certificate "
        "made at startup, kept in memory)",
    )
    secure.add_argument(
        "--tls-private-key-file", metavar="PATH", help="PEM private key of --tls-cert-file"
    )
    secure.add_argument(
        "--authorization-always-allow-paths",
        default="/healthz,/readyz,/livez",
        metavar="PATHS",
        help="comma-separated paths served without authentication or authorization "
        "(a trailing * matches a prefix; default /healthz,/readyz,/livez)",
    )


def _add_inspect(sub: Any) -> None:
    insp = sub.add_parser(
        "inspect",
        help="per-node, per-GPU allocation table of a live cluster",
        description=(
            "Show every GPU of every node (or of NODE): allocated/total gpu-core and "
            "gpu-memory, the pods on each card, unhealthy cards marked. Reads a live cluster, "
            "or YAML/JSON files with --file (scenarios, `simulate -o yaml` output, "
            "`kubectl get -o yaml` lists; later files override earlier ones)."
        ),
    )
    insp.add_argument("node", nargs="?", metavar="NODE", help="only this node")
    _kube_flags(insp)
    insp.add_argument(
        "-f",
        "--file",
        action="append",
        metavar="FILE",
        help="read objects from FILE instead of a cluster (repeatable)",
    )
    insp.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="table (default), or the same content as JSON or YAML (gpu-memory in bytes)",
    )
    insp.set_defaults(func=cmd_inspect)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (the subcommand about to run, known from the
    arguments), the ``simulate`` subcommand's trace-replay flags are added only when that is
    ``simulate`` (they import the simulator)."""
    parser = _Parser(
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
    sim.add_argument("file", metavar="FILE", nargs="?", help="scenario YAML (-: standard input)")
    sim.add_argument("--config", metavar="CFG", help="KubeSchedulerConfiguration file")
    sim.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml", "json"),
        default="table",
        help="table (default), or every pod as it would be on the API server",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed for tie-breaking (default 0)")
    if command is None or command == "simulate":
        from scheduler.simulator.replay_cli import add_trace_arguments

        add_trace_arguments(sim)
    sim.set_defaults(func=cmd_simulate)
    _add_run(sub)
    _add_extender(sub)
    _add_inspect(sub)
    _add_explain(sub)
    add_webhook_parser(sub, _log_flags)
    _add_version(parser, sub)
    return parser


def _add_version(parser: argparse.ArgumentParser, sub: Any) -> None:
    """``--version`` on the command and on every subcommand (added last, so it sees them all)."""
    from apis.version import version_line

    for p in (parser, *sub.choices.values()):
        p.add_argument("--version", action="version", version=version_line(PROG))
        for action in p._actions:  # nested verbs (``webhook serve``, ``webhook certs``)
            if isinstance(action, argparse._SubParsersAction) and p is not parser:
                for verb in action.choices.values():
                    verb.add_argument("--version", action="version", version=version_line(PROG))


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    first = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(first if first in _COMMANDS else None)
    try:
        args = parser.parse_args(argv)
        if args.command in ("run", "extender") or getattr(args, "serving_logs", False):
            logs.configure(args.log_format, log_level_of(args))
        else:  # stdout is the command's output: logs go to stderr, warnings and up only
            logs.configure("console", "warning", stdlib=False)
        code: int = args.func(args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return code


_COMMANDS = frozenset({"run", "extender", "inspect", "explain", "webhook"})
"""Subcommands that do not need the simulate subcommand's full parser (see ``build_parser``)."""


def webhook_main(argv: Sequence[str] | None = None) -> int:
    """``koord-webhook ARGS`` is ``koord-scheduler webhook ARGS``."""
    return main(["webhook", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
