"""``koord-scheduler``: the composition root, the only place adapters are built.

Subcommands:
  run             the scheduler against a real cluster (kubeconfig or in-cluster), with leader
                  election, /healthz /livez /readyz /metrics, and JSON logs.
  simulate FILE   schedule a scenario on the embedded in-memory cluster and report.
  extender        answer the default kube-scheduler's extender verbs with the same core.
  inspect [NODE]  the per-node, per-GPU allocation table of a live cluster (or of files).

The Kubernetes adapter (and the ``kubernetes`` client behind it) is imported only by ``run``
and ``inspect``, so ``simulate`` starts fast and works without it.

User errors (bad files, bad configuration) print one line on stderr and exit 2; there is no
traceback for them. A completed run exits 0, unschedulable pods included.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import structlog

from scheduler import logs
from scheduler.config import ConfigError, SchedulerConfiguration, default_config, load_config
from scheduler.framework.runtime import FrameworkError
from scheduler.inspect import InspectError, load_objects, render_inspect
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.replay_cli import (
    ReplayUsageError,
    add_trace_arguments,
    run_trace_command,
)
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
    if args.nodes or args.pods:  # trace mode (SPEC §9): scheduler/simulator/replay_cli.py
        try:
            return run_trace_command(args, in_tree_registry(), default_plugins())
        except ReplayUsageError as exc:
            raise UserError(str(exc)) from None
    if args.file is None:
        raise UserError("simulate needs a scenario FILE, or --nodes and --pods (a trace)")
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


# -- run --------------------------------------------------------------------------------------


SHUTDOWN_BIND_WAIT = 10.0
"""Seconds a stopping scheduler waits for its binds in flight before it exits."""
EXIT_LOST_LEASE = 1
"""Exit status after losing the leader lease (kube-scheduler exits non-zero there too)."""


def _identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def cmd_run(args: argparse.Namespace) -> int:
    return _serve_cluster(args, extender=False)


def cmd_extender(args: argparse.Namespace) -> int:
    return _serve_cluster(args, extender=True)


def _serve_cluster(args: argparse.Namespace, *, extender: bool) -> int:
    """``run`` and ``extender``: one composition of the kube adapter, leader election, fencing
    and the scheduler core. ``extender`` never schedules from its own queue: it answers
    kube-scheduler's extender verbs with the same core (``scheduler.extender``)."""
    import dataclasses

    from scheduler.core import Scheduler
    from scheduler.health import Check, HealthServer
    from scheduler.kube.cluster import KubeCluster, bind_permission_problem
    from scheduler.kube.events import EventRecorder
    from scheduler.kube.leader import CatchUp, KubeLeaseStore, LeaderElector, in_flight_settle
    from scheduler.kube.ratelimit import TokenBucket
    from scheduler.kube.rest import CredentialsError, RestClient, Urllib3Transport, load_credentials
    from scheduler.metrics import SchedulerMetrics

    config = _load_config(args.config)
    if args.leader_elect is not None:
        election = dataclasses.replace(config.leader_election, leader_elect=args.leader_elect)
        config = dataclasses.replace(config, leader_election=election)
    log = structlog.get_logger("koord-scheduler")
    try:
        creds = load_credentials(args.kubeconfig, args.master, args.context)
    except CredentialsError as exc:
        raise UserError(str(exc)) from None
    identity = args.identity or _identity()
    transport = Urllib3Transport(creds, pool_size=args.bind_workers + 16)
    rest = RestClient(
        transport, token=creds.token, limiter=TokenBucket(args.kube_api_qps, args.kube_api_burst)
    )
    recorder = EventRecorder(
        rest.with_limiter(None), qps=args.event_qps, burst=args.event_burst, host=identity
    )
    problem = bind_permission_problem(rest, args.bind_mode)
    if problem is not None:
        transport.close()
        raise UserError(problem)
    # The fence (see scheduler/kube/cluster.py): a bind write goes out only while this
    # replica holds an unexpired lease and is not shutting down.
    fence_closed = threading.Event()
    elector: LeaderElector | None = None

    def fence() -> bool:
        return not fence_closed.is_set() and (elector is None or elector.leading)

    cluster = KubeCluster(rest, recorder, bind_mode=args.bind_mode, fence=fence)
    metrics = SchedulerMetrics()
    try:
        sched = Scheduler(
            config,
            cluster,
            in_tree_registry(),
            default_plugins(),
            observer=metrics,
            bind_workers=args.bind_workers,
            on_incoming=metrics.incoming,
            log_decisions=True,
        )
    except FrameworkError as exc:
        raise UserError(f"{args.config or 'default configuration'}: {exc}") from None
    metrics.watch_queue(lambda: sched.queue_stats)
    metrics.watch_devices(cluster.view)

    le = config.leader_election
    stop = threading.Event()
    lost_lease = threading.Event()
    shutting_down = threading.Event()
    # A new leader schedules only once its pod informer has caught up with a quorum read made
    # after the acquisition (scheduler/kube/leader.py, CatchUp).
    catch_up = CatchUp(cluster.quorum_pods_rv, cluster.pods) if le.leader_elect else None

    def caught_up() -> bool:
        return catch_up is None or catch_up.caught_up()

    def on_leading(leading: bool) -> None:
        if catch_up is not None:
            # An expired (unreleased) lease: the deposed leader's writes may be on the wire.
            settle = 0.0
            if leading and elector is not None and elector.took_over_from:
                settle = in_flight_settle(
                    cluster.write_timeout, le.lease_duration, le.renew_deadline
                )
            catch_up.leading_changed(leading, settle)
        # Called only on transitions: False means we led and lost (OnStoppedLeading). The
        # fence already refuses binds; stop, and exit so a supervisor restarts us clean.
        if not leading and not shutting_down.is_set():
            lost_lease.set()
            stop.set()

    if le.leader_elect:
        store = KubeLeaseStore(
            rest.with_limiter(None), le.resource_namespace, le.resource_name, le.renew_deadline
        )
        elector = LeaderElector(
            store,
            identity,
            lease_duration=le.lease_duration,
            renew_deadline=le.renew_deadline,
            retry_period=le.retry_period,
            on_change=on_leading,
        )
    metrics.watch_leader(le.resource_name, lambda: elector is None or elector.leading)
    scheduler_thread = threading.current_thread()

    def threads_alive() -> str | None:
        dead = [i.kind for i in cluster.informers if not i.alive]
        if elector is not None and not elector.alive:
            dead.append("leader-elector")
        if catch_up is not None and not catch_up.alive:
            dead.append("leader-catch-up")
        if not scheduler_thread.is_alive():
            dead.append("scheduler")
        return f"threads not running: {', '.join(dead)}" if dead else None

    def caches() -> str | None:
        if not cluster.synced():
            waiting = [i.kind for i in cluster.informers if not i.synced]
            return f"caches not synced: {', '.join(waiting)}"
        bad = cluster.unhealthy()
        return "; ".join(bad) if bad else None

    def leadership() -> str | None:
        if elector is None or elector.leading:
            return None
        if extender:
            # kube-scheduler calls one Service: only the leader is a ready endpoint of it.
            return "standby: not the leader"
        if elector.standby_healthy:
            return None
        return "cannot read the leader election Lease"

    ext_server = None
    if extender:
        from apis.version import version
        from scheduler.extender.engine import ExtenderEngine
        from scheduler.extender.server import ExtenderServer

        profile = args.profile or next(iter(sched.profiles))
        try:
            engine = ExtenderEngine(
                sched,
                profile,
                leading=lambda: fence() and cluster.synced() and caught_up(),
                lookup_pod=cluster.lookup_pod,
                timeout=args.bind_timeout,
            )
            ext_server = ExtenderServer(
                args.extender_address,
                args.extender_port,
                engine,
                version=version(),
                view=cluster.view,
                gpushare_unit=args.gpushare_memory_unit,
                observe=metrics.extender_request,
            )
        except ValueError as exc:
            raise UserError(str(exc)) from None
        except OSError as exc:
            raise UserError(
                f"cannot listen on {args.extender_address}:{args.extender_port}: {exc}"
            ) from None

    try:
        server = HealthServer(
            args.bind_address,
            args.port,
            live=[Check("ping", lambda: None), Check("threads", threads_alive)],
            ready=[
                Check("ping", lambda: None),
                Check("informer-sync", caches),
                Check("leader-election", leadership),
                Check("leader-catch-up", lambda: None if catch_up is None else catch_up.waiting()),
            ],
            metrics=metrics.write_exposition,
            explain=lambda ns, name, output: _explain_live(sched, cluster, ns, name, output),
        )
    except OSError as exc:
        raise UserError(f"cannot listen on {args.bind_address}:{args.port}: {exc}") from None

    def on_signal(signum: int, frame: Any) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "starting",
        identity=identity,
        server=creds.host,
        profiles=[p.scheduler_name for p in config.profiles],
        leader_elect=le.leader_elect,
        port=server.port,
    )
    server.start()
    cluster.start()
    if catch_up is not None:
        catch_up.start()  # before the elector: it is told of every acquisition
    if elector is not None:
        elector.start()
    if ext_server is not None:
        ext_server.start()
        log.info("extender listening", port=ext_server.port)

    def ready() -> bool:
        if extender:
            return False  # never pop our own queue: kube-scheduler decides, we answer
        return cluster.synced() and (elector is None or elector.leading) and caught_up()

    try:
        sched.run(stop, ready)
    finally:
        # Graceful order: stop scheduling -> wait (bounded) for the binds in flight -> close
        # the fence -> release the Lease (only when no bind can still be on the wire) -> exit.
        shutting_down.set()
        drained = sched.stop_binding(SHUTDOWN_BIND_WAIT)
        fence_closed.set()
        if elector is not None:
            if not drained:
                log.warning("binds still in flight at shutdown: the Lease is left to expire")
            elector.stop(release=drained and not lost_lease.is_set())
        if catch_up is not None:
            catch_up.stop()
        if ext_server is not None:
            ext_server.stop()
        cluster.stop()
        sched.close()
        server.stop()
        transport.close()
        log.info("stopped")
    if lost_lease.is_set():
        log.error("leader lease lost: exiting so that a restart begins with a clean cache")
        return EXIT_LOST_LEASE
    return 0


EXPLAIN_TIMEOUT = 10.0
"""How long ``/debug/explain`` waits for the scheduling thread (it answers between cycles)."""


def _explain_live(
    sched: Any, cluster: Any, namespace: str, name: str, output: str
) -> tuple[int, bytes]:
    """``/debug/explain/NS/POD`` of ``koord-scheduler run``: the pod and the per-card account
    from the informers' view, the filters run by the scheduler's own profile on the scheduling
    thread (``Scheduler.call_soon``), so the answer is what the next cycle would see."""
    from scheduler.explain import explain, render_table, to_json

    view = cluster.view()
    pod = next((p for p in view.pods if p.namespace == namespace and p.name == name), None)
    if pod is None:
        return 404, f"pod {namespace}/{name} not found\n".encode()
    if pod.node_name:
        return 409, f"pod {namespace}/{name} is already bound to node {pod.node_name}\n".encode()
    nodes, devices, pods = dict(view.nodes), list(view.devices), list(view.pods)
    future = sched.call_soon(
        lambda: explain(sched, sched.cache.snapshot, pod, nodes, devices, pods)
    )
    try:
        answer = future.result(timeout=EXPLAIN_TIMEOUT)
    except TimeoutError:
        return 503, b"the scheduling thread did not answer in time\n"
    except ValueError as exc:
        return 400, f"{exc}\n".encode()
    return 200, (to_json(answer) if output == "json" else render_table(answer)).encode()


# -- inspect ----------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.file:
        try:
            nodes, devices, pods = load_objects(args.file)
        except InspectError as exc:
            raise UserError(str(exc)) from None
    else:
        nodes, devices, pods = _live_objects(args)
    try:
        sys.stdout.write(render_inspect(nodes, devices, pods, args.node))
    except InspectError as exc:
        raise UserError(str(exc)) from None
    return 0


# -- explain ----------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    """Load the objects (files or the live cluster), feed them to a Scheduler built like the
    simulator's, and explain the pod from that scheduler's own state."""
    from scheduler.explain import explain, render_table, to_json
    from scheduler.simulator.cluster import InMemoryCluster
    from scheduler.simulator.run import simulated_scheduler

    namespace, sep, name = args.pod.partition("/")
    if not sep or not namespace or not name:
        raise UserError(f"expected NAMESPACE/POD, got {args.pod!r}")
    if args.file:
        try:
            nodes, devices, pods = load_objects(args.file)
        except InspectError as exc:
            raise UserError(str(exc)) from None
    else:
        nodes, devices, pods = _live_objects(args)
    target = next((p for p in pods if p.key == args.pod), None)
    if target is None:
        raise UserError(f"pod {args.pod} not found")
    if target.node_name:
        raise UserError(f"pod {args.pod} is already bound to node {target.node_name}")
    config = _load_config(args.config)
    cluster = InMemoryCluster()
    for node in nodes.values():
        cluster.apply_node(node.raw)
    for device in devices:
        cluster.apply_device(device.to_dict())
    for pod in pods:
        cluster.apply_pod(pod.raw)
    try:
        sched = simulated_scheduler(config, cluster, in_tree_registry(), default_plugins(), 0)
    except FrameworkError as exc:
        raise UserError(f"{args.config or 'default configuration'}: {exc}") from None
    try:
        sched.drain()
        pod = cluster.pods[args.pod]
        try:
            answer = explain(sched, sched.cache.snapshot, pod, nodes, devices, pods)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    finally:
        sched.close()
    sys.stdout.write(to_json(answer) if args.output == "json" else render_table(answer))
    return 0


def _live_objects(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Nodes, Device CRs and Pods of the live cluster (``inspect`` and ``explain``)."""
    from scheduler.kube.cluster import fetch_view
    from scheduler.kube.rest import (
        CredentialsError,
        KubeError,
        RestClient,
        Urllib3Transport,
        load_credentials,
    )

    try:
        creds = load_credentials(args.kubeconfig, args.master, args.context)
    except CredentialsError as exc:
        raise UserError(str(exc)) from None
    transport = Urllib3Transport(creds, pool_size=2)
    try:
        view = fetch_view(RestClient(transport, token=creds.token))
    except KubeError as exc:
        raise UserError(f"{creds.host}: {exc}") from None
    finally:
        transport.close()
    return dict(view.nodes), list(view.devices), list(view.pods)


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


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_run(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="schedule pods on a real cluster",
        description=(
            "Run koord-scheduler against the cluster of --kubeconfig (or in-cluster): "
            "list/watch Nodes, Pods and Device CRs, schedule pods whose schedulerName is one "
            "of the profiles, bind them with their device allocation. Serves /healthz, "
            "/livez, /readyz and /metrics on --bind-address:--port."
        ),
    )
    _serve_flags(run)
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
        default=10251,
        help="port of /healthz, /livez, /readyz, /metrics (default 10251; 0: any)",
    )
    run.add_argument(
        "--bind-mode",
        choices=("binding", "patch"),
        default="binding",
        help="binding: the device annotation rides on the pods/binding write "
        "(one write, default); patch: patch the annotation, then bind",
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
        default=None,
        metavar="BOOL",
        help="override leaderElection.leaderElect of the configuration",
    )
    run.add_argument(
        "--identity",
        metavar="ID",
        help="leader election identity (default: $POD_NAME or hostname + uuid)",
    )
    run.add_argument(
        "--log-format", choices=logs.FORMATS, default="json", help="json lines (default) or console"
    )
    run.add_argument("--log-level", choices=logs.LEVELS, default="info")


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
    insp.set_defaults(func=cmd_inspect)


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
    sim.add_argument("file", metavar="FILE", nargs="?", help="scenario YAML")
    sim.add_argument("--config", metavar="CFG", help="KubeSchedulerConfiguration file")
    sim.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml", "json"),
        default="table",
        help="table (default), or every pod as it would be on the API server",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed for tie-breaking (default 0)")
    add_trace_arguments(sim)
    sim.set_defaults(func=cmd_simulate)
    _add_run(sub)
    _add_extender(sub)
    _add_inspect(sub)
    _add_explain(sub)
    _add_version(parser, sub)
    return parser


def _add_version(parser: argparse.ArgumentParser, sub: Any) -> None:
    """``--version`` on the command and on every subcommand (added last, so it sees them all)."""
    from apis.version import version_line

    for p in (parser, *sub.choices.values()):
        p.add_argument("--version", action="version", version=version_line(PROG))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        logs.configure(args.log_format, args.log_level)
    else:  # stdout is the command's output: logs go to stderr, warnings and up only
        logs.configure("console", "warning", stdlib=False)
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
