"""``koord-scheduler run``: the composition root of the scheduler against a real cluster — the
Kubernetes adapter, leader election and its fence, catch-up of a new leader, health and
metrics endpoints, and the scheduler core — and its graceful stop. ``extender`` composes the
same way with a front end of its own (``scheduler.commands.extender``)."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import socket
import ssl
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import structlog
import yaml

from apis.signals import StopSignals
from scheduler.commands.common import UserError, load_config_or_fail
from scheduler.config import ConfigError, SchedulerConfiguration, override_leader_election
from scheduler.framework.runtime import FrameworkError
from scheduler.plugins.registry import default_plugins, in_tree_registry


class Served(Protocol):
    """A front end's server, started after the informers and stopped before them."""

    @property
    def port(self) -> int: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


FrontEnd = Callable[[argparse.Namespace, Any, Any, Any, Callable[[], bool]], Served]
"""Builds a front end's server from (args, scheduler, cluster, metrics, leading): ``leading``
is true while this replica may bind (it leads, its caches are synced and caught up)."""

SHUTDOWN_BIND_WAIT = 10.0
"""Seconds a stopping scheduler waits for its binds in flight before it exits."""
SHUTDOWN_BUDGET = 25.0
"""Seconds the whole graceful stop may take, SIGTERM to exit: under kubelet's default 30 s
grace period, so a stop against a slow or restarting API server ends on our terms (logged,
the Lease left to expire) rather than by kubelet's SIGKILL mid-step."""
SHUTDOWN_INFORMER_WAIT = 5.0
"""Seconds ``cluster.stop`` waits for the informers and the event recorder, all together."""
EXIT_SHUTDOWN_OVERRUN = 3
"""Exit status when the graceful stop overran ``SHUTDOWN_BUDGET`` (the process is ended then)."""
EXIT_LOST_LEASE = 1
"""Exit status after losing the leader lease (kube-scheduler exits non-zero there too)."""


def _watchdog(budget: float) -> None:
    """End the process ``budget`` s from now unless it has exited by then."""

    def overrun() -> None:
        structlog.get_logger("koord-scheduler").error(
            "graceful stop overran its budget: exiting now (the Lease is left to expire)",
            budget_seconds=budget,
        )
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_SHUTDOWN_OVERRUN)

    timer = threading.Timer(budget, overrun)
    timer.daemon = True
    timer.start()


def _identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


LEADER_ELECTION_FLAGS = {
    "leaderElect": "leader_elect",
    "leaseDuration": "leader_elect_lease_duration",
    "renewDeadline": "leader_elect_renew_deadline",
    "retryPeriod": "leader_elect_retry_period",
    "resourceName": "leader_elect_resource_name",
    "resourceNamespace": "leader_elect_resource_namespace",
}
"""``leaderElection`` field -> the ``args`` attribute of its kube-scheduler flag."""


def run_config(args: argparse.Namespace) -> SchedulerConfiguration:
    """The configuration file (or the defaults) with the ``--leader-elect*`` flags given on
    the command line applied over its ``leaderElection``, as kube-scheduler does, and
    validated together."""
    config = load_config_or_fail(args.config)
    flags = {
        key: ("--" + attr.replace("_", "-"), getattr(args, attr))
        for key, attr in LEADER_ELECTION_FLAGS.items()
        if getattr(args, attr, None) is not None
    }
    try:
        return override_leader_election(config, flags, args.config or "default configuration")
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def write_effective_config(config: SchedulerConfiguration, path: str) -> int:
    """``--write-config-to``: the configuration this command would run with, then exit 0."""
    from scheduler.config.encode import effective_config_document
    from scheduler.plugins.registry import default_plugins

    text = yaml.safe_dump(
        effective_config_document(config, default_plugins()), sort_keys=False, allow_unicode=True
    )
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise UserError(f"--write-config-to {path}: {exc.strerror or exc}") from None
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    return serve_cluster(args)


def serve_cluster(args: argparse.Namespace, front: FrontEnd | None = None) -> int:
    """``run`` and ``extender``: one composition of the kube adapter, leader election, fencing
    and the scheduler core. With a ``front`` (``scheduler.commands.extender``) the core never
    schedules from its own queue: the front end answers kube-scheduler's calls with it, and
    only the leader is ready."""
    from scheduler.core import Scheduler
    from scheduler.kube.auth import SubjectAccessReviewAuthorizer, TokenReviewAuthenticator
    from scheduler.kube.catchup import CatchUp, in_flight_settle
    from scheduler.kube.cluster import KubeCluster, bind_permission_problem
    from scheduler.kube.credentials import load_credentials
    from scheduler.kube.events import EventRecorder
    from scheduler.kube.leader import KubeLeaseStore, LeaderElector
    from scheduler.kube.ratelimit import TokenBucket
    from scheduler.kube.rest import CredentialsError, RestClient
    from scheduler.kube.transport import Transport, Urllib3Transport
    from scheduler.observability.health import Access, Check, HealthServer
    from scheduler.observability.metrics import SchedulerMetrics

    config = run_config(args)
    if args.write_config_to:
        return write_effective_config(config, args.write_config_to)
    log = structlog.get_logger("koord-scheduler")
    always_allow = _always_allow_paths(args)
    tls = _secure_serving(args, log)
    try:
        creds = load_credentials(args.kubeconfig, args.master, args.context)
    except CredentialsError as exc:
        raise UserError(str(exc)) from None
    identity = args.identity or _identity()
    transport: Transport
    if getattr(args, "kube_transport", "http11") == "http11":
        from scheduler.kube.http11 import Http11Transport

        transport = Http11Transport(creds, pool_size=args.bind_workers + 16)
    else:
        transport = Urllib3Transport(creds, pool_size=args.bind_workers + 16)
    metrics = SchedulerMetrics()
    metrics.watch_process()
    rest = RestClient(
        transport,
        token=creds.token,
        limiter=TokenBucket(args.kube_api_qps, args.kube_api_burst),
        observe=lambda verb, url, code, s: metrics.rest_request(creds.host, verb, url, code, s),
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
    metrics.watch_informers(lambda: cluster.informers)

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
            return f"caches not synced: {'; '.join(cluster.not_synced())}"
        bad = cluster.unhealthy()
        return "; ".join(bad) if bad else None

    def leadership() -> str | None:
        if elector is None or elector.leading:
            return None
        if front is not None:
            # kube-scheduler calls one Service: only the leader is a ready endpoint of it.
            return "standby: not the leader"
        if elector.standby_healthy:
            return None
        return "cannot read the leader election Lease"

    ext_server = None
    if front is not None:
        ext_server = front(
            args, sched, cluster, metrics, lambda: fence() and cluster.synced() and caught_up()
        )

    def listen(port: int, tls: ssl.SSLContext | None, access: Access | None) -> HealthServer:
        try:
            return HealthServer(
                args.bind_address,
                port,
                live=[Check("ping", lambda: None), Check("threads", threads_alive)],
                ready=[
                    Check("ping", lambda: None),
                    Check("informer-sync", caches),
                    Check("leader-election", leadership),
                    Check(
                        "leader-catch-up",
                        lambda: None if catch_up is None else catch_up.waiting(),
                    ),
                ],
                metrics=metrics.write_exposition,
                explain=lambda ns, name, output: _explain_live(sched, cluster, ns, name, output),
                tls=tls,
                access=access,
            )
        except OSError as exc:
            raise UserError(f"cannot listen on {args.bind_address}:{port}: {exc}") from None

    # The secure port asks the API server who a token is and what it may read (not rate
    # limited with the scheduling writes; the reviews are cached briefly).
    servers: list[HealthServer] = []
    if tls is not None:
        reviews = rest.with_limiter(None)
        access = Access(
            TokenReviewAuthenticator(reviews), SubjectAccessReviewAuthorizer(reviews), always_allow
        )
        servers.append(listen(args.secure_port, tls, access))
    if args.port:
        try:
            servers.append(listen(args.port, None, None))
        except UserError:
            for server in servers:
                server.stop()
            raise
        log.warning("serving plain HTTP without authentication (--port)", port=args.port)

    signals = StopSignals(stop)  # it never logs: see apis/signals.py
    signals.install()
    log.info(
        "starting",
        identity=identity,
        server=creds.host,
        profiles=[p.scheduler_name for p in config.profiles],
        leader_elect=le.leader_elect,
        secure_port=args.secure_port,
        port=args.port,
    )
    for server in servers:
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
        if front is not None:
            return False  # never pop our own queue: kube-scheduler decides, we answer
        return cluster.synced() and (elector is None or elector.leading) and caught_up()

    try:
        sched.run(stop, ready)
    finally:
        if signals.received:
            log.info("stopping", signal=signals.received)
        # Graceful order: stop scheduling -> wait (bounded) for the binds in flight -> close
        # the fence -> release the Lease (only when no bind can still be on the wire) -> exit.
        # The whole stop is bounded: past SHUTDOWN_BUDGET the process ends as a SIGKILL would
        # end it (the fence is closed by then; an unreleased Lease is waited out by the next
        # leader, and a bind still on the wire is settled as after a crash).
        _watchdog(SHUTDOWN_BUDGET)
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
        cluster.stop(timeout=SHUTDOWN_INFORMER_WAIT)
        sched.close()
        for server in servers:
            server.stop()
        transport.close()
        log.info("stopped")
    if lost_lease.is_set():
        log.error("leader lease lost: exiting so that a restart begins with a clean cache")
        return EXIT_LOST_LEASE
    return 0


def _port(flag: str, value: int) -> int:
    if not 0 <= value <= 65535:
        raise UserError(f"{flag}: {value} is not a port (0-65535)")
    return value


def _always_allow_paths(args: argparse.Namespace) -> tuple[str, ...]:
    paths = tuple(p.strip() for p in args.authorization_always_allow_paths.split(",") if p.strip())
    for path in paths:
        if not path.startswith("/"):
            raise UserError(f"--authorization-always-allow-paths: {path!r} does not start with /")
    return paths


def _secure_serving(args: argparse.Namespace, log: Any) -> ssl.SSLContext | None:
    """The secure port's TLS context (None: --secure-port 0), from --tls-cert-file and
    --tls-private-key-file, or a self-signed certificate for this host made now. Checks the
    serving flags first: a bad one is a user error before anything connects."""
    from scheduler.observability.tls import TLSError, load_server_context, self_signed
    from scheduler.observability.tls import server_context as pem_context

    port, secure = _port("--port", args.port), _port("--secure-port", args.secure_port)
    if port and port == secure:
        raise UserError(f"--port and --secure-port cannot both be {port}")
    cert, key = args.tls_cert_file, args.tls_private_key_file
    if (cert is None) != (key is None):
        raise UserError("--tls-cert-file and --tls-private-key-file go together")
    if not secure:
        return None
    hosts = [socket.gethostname(), "localhost", "127.0.0.1"]
    try:
        if cert is not None:
            return load_server_context(cert, key)
        try:
            if not ipaddress.ip_address(args.bind_address).is_unspecified:
                hosts.insert(0, args.bind_address)
        except ValueError:
            hosts.insert(0, args.bind_address)  # a host name
        context = pem_context(*self_signed(hosts))
    except (TLSError, ValueError) as exc:  # ValueError: a host name x509 cannot carry
        raise UserError(
            f"self-signed certificate for {hosts}: {exc}"
            if isinstance(exc, ValueError)
            else str(exc)
        ) from None
    log.info(
        "no --tls-cert-file: serving a self-signed certificate kept in memory",
        hosts=list(dict.fromkeys(hosts)),
    )
    return context


EXPLAIN_TIMEOUT = 10.0
"""How long ``/debug/explain`` waits for the scheduling thread (it answers between cycles)."""


def _explain_live(
    sched: Any, cluster: Any, namespace: str, name: str, output: str
) -> tuple[int, bytes]:
    """``/debug/explain/NS/POD`` of ``koord-scheduler run``: the pod and the per-card account
    from the informers' view, the filters run by the scheduler's own profile on the scheduling
    thread (``Scheduler.call_soon``), so the answer is what the next cycle would see."""
    from scheduler.observability.explain import explain, render_table, to_json

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
