"""``koord-scheduler webhook`` (``koord-webhook``): the admission webhook's composition root.

``webhook serve``: the policy from the flags, the certificate of the mounted Secret (reloaded
when the Secret is rotated), ``POST /mutate``, ``/validate`` and ``/guard``
(``scheduler.webhook``) with ``/healthz``, ``/readyz`` and ``/metrics`` on one HTTPS port
(``HealthServer``), and the graceful stop: on SIGTERM /readyz fails, the server keeps
answering for ``--shutdown-delay`` (while endpoints drop it), stops accepting, and waits up to
``--shutdown-grace`` for the reviews in flight. It reads nothing from the API server: the API
server sends it everything it decides on.

``webhook certs``: a one-shot private CA and a serving certificate for the webhook's Service
(``ca.crt``, ``tls.crt``, ``tls.key`` in ``--out``); prints the caBundle (base64 of the CA) for
the webhook configurations.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import threading
from typing import Any

import structlog

from scheduler.commands.common import UserError
from scheduler.commands.common import bool_flag as _bool
from scheduler.commands.common import duration_flag as _duration

__all__ = ["add_webhook_parser"]

DEFAULT_MAX_REQUEST_BYTES = 3 << 20
"""An AdmissionReview carries the object and the old object, each at most ~1.5 MiB (etcd)."""


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def add_webhook_parser(sub: Any, log_flags: Any) -> None:
    """``webhook serve`` and ``webhook certs``; ``log_flags(parser)`` adds the log flags."""
    from scheduler.webhook.policy import (
        DEFAULT_AGENT,
        DEFAULT_GPU_RESOURCES,
        DEFAULT_SCHEDULER_IDENTITY,
    )

    hook = sub.add_parser(
        "webhook",
        help="the admission webhook: GPU pods to koord-scheduler, invalid ones refused",
        description="koord-webhook: an HTTPS admission webhook for pods (serve), and a "
        "one-shot certificate maker for it (certs).",
    )
    verbs = hook.add_subparsers(dest="webhook_command", required=True, metavar="VERB")
    serve = verbs.add_parser(
        "serve",
        help="serve the mutating and validating webhooks",
        description=(
            "Serve POST /mutate (GPU pods get spec.schedulerName), /validate (device requests "
            "and gang annotations koord-scheduler would refuse are refused at create) and "
            "/guard (only the listed identities may set or change allocation annotations), "
            "with /healthz, /readyz and /metrics, as HTTPS on --bind-address:--port."
        ),
    )
    serve.add_argument("--bind-address", default="0.0.0.0", metavar="ADDR")
    serve.add_argument("--port", type=int, default=9443, help="HTTPS port (default 9443; 0: any)")
    serve.add_argument(
        "--tls-cert-file",
        required=True,
        metavar="PATH",
        help="PEM serving certificate (chain), e.g. the mounted Secret's tls.crt; "
        "reloaded when it changes",
    )
    serve.add_argument(
        "--tls-private-key-file",
        required=True,
        metavar="PATH",
        help="PEM private key of --tls-cert-file",
    )
    serve.add_argument(
        "--scheduler-name",
        default="koord-scheduler",
        metavar="NAME",
        help="schedulerName given to GPU pods that name none (default koord-scheduler)",
    )
    serve.add_argument(
        "--gpu-resources",
        type=_names,
        default=DEFAULT_GPU_RESOURCES,
        metavar="NAMES",
        help="comma-separated resources that make a pod a GPU "
        "pod; a trailing * matches a prefix (default: "
        f"{','.join(DEFAULT_GPU_RESOURCES)})",
    )
    serve.add_argument(
        "--translate-nvidia-gpu",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="rewrite nvidia.com/gpu: N as "
        "koordinator.sh/gpu-core and gpu-memory-ratio N*100 (default false)",
    )
    serve.add_argument(
        "--gpushare-memory-unit",
        choices=("GiB", "MiB"),
        default="GiB",
        help="unit of aliyun.com/gpu-mem, as the scheduler's (default GiB)",
    )
    serve.add_argument(
        "--allocation-writers",
        type=_names,
        default=(DEFAULT_SCHEDULER_IDENTITY, DEFAULT_AGENT),
        metavar="USERS",
        help="comma-separated users that may set or change allocation "
        f"annotations (default {DEFAULT_SCHEDULER_IDENTITY},{DEFAULT_AGENT})",
    )
    serve.add_argument(
        "--allocation-writer-groups",
        type=_names,
        default=(),
        metavar="GROUPS",
        help="comma-separated groups whose members may too (default none)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="N",
        help=f"largest request body accepted, else 413 (default {DEFAULT_MAX_REQUEST_BYTES})",
    )
    serve.add_argument(
        "--shutdown-delay",
        type=_duration,
        default=0.0,
        metavar="DURATION",
        help="after SIGTERM, keep serving (not ready) this long (default 0s)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=_duration,
        default=10.0,
        metavar="DURATION",
        help="then wait this long for reviews in flight (default 10s)",
    )
    serve.add_argument(
        "--cert-reload-interval",
        type=_duration,
        default=10.0,
        metavar="DURATION",
        help="how often the certificate files are checked for a rotation (default 10s)",
    )
    log_flags(serve)
    serve.set_defaults(func=cmd_webhook_serve, serving_logs=True)

    certs = verbs.add_parser(
        "certs",
        help="make a CA and the webhook's serving certificate; print the caBundle",
        description=(
            "Write ca.crt, tls.crt and tls.key to --out: a new private CA and a serving "
            "certificate it signs for SERVICE.NAMESPACE.svc (and the names of --host). Print "
            "the caBundle (base64 of ca.crt) for the webhook configurations' "
            "clientConfig.caBundle. The CA's key is not kept: re-run to renew."
        ),
    )
    certs.add_argument("--service", default="koord-webhook", metavar="NAME")
    certs.add_argument("--namespace", default="koordinator-system", metavar="NS")
    certs.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="another DNS name or IP of the certificate (repeatable)",
    )
    certs.add_argument("--days", type=int, default=365, help="validity (default 365)")
    certs.add_argument("--out", required=True, metavar="DIR", help="directory to write to")
    certs.set_defaults(func=cmd_webhook_certs)


def cmd_webhook_certs(args: argparse.Namespace) -> int:
    from scheduler.observability.tls import TLSError, issue_serving

    svc, ns = args.service, args.namespace
    hosts = [f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local", f"{svc}.{ns}", *args.host]
    if args.days < 1:
        raise UserError("--days must be at least 1")
    try:
        ca, cert, key = issue_serving(hosts, days=args.days)
    except TLSError as exc:
        raise UserError(str(exc)) from None
    try:
        os.makedirs(args.out, exist_ok=True)
        for name, data, mode in (
            ("ca.crt", ca, 0o644),
            ("tls.crt", cert, 0o644),
            ("tls.key", key, 0o600),
        ):
            path = os.path.join(args.out, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(path, mode)
    except OSError as exc:
        raise UserError(f"--out {args.out}: {exc.strerror or exc}") from None
    print(base64.b64encode(ca).decode())
    return 0


def cmd_webhook_serve(args: argparse.Namespace) -> int:
    from apis.gpushare import MemoryUnit
    from scheduler.observability.health import Check, HealthServer
    from scheduler.observability.tls import CertReloader, TLSError, load_server_context
    from scheduler.webhook.policy import WebhookPolicy
    from scheduler.webhook.server import AdmissionRoutes, WebhookMetrics

    log = structlog.get_logger("koord-webhook")
    if args.max_request_bytes < 1024:
        raise UserError("--max-request-bytes must be at least 1024")
    if not args.gpu_resources:
        raise UserError("--gpu-resources: at least one resource name")
    policy = WebhookPolicy(
        scheduler_name=args.scheduler_name,
        gpu_resources=args.gpu_resources,
        translate_nvidia_gpu=args.translate_nvidia_gpu,
        gpushare_unit=MemoryUnit[args.gpushare_memory_unit],
        allocation_writers=args.allocation_writers,
        allocation_writer_groups=args.allocation_writer_groups,
    )
    try:
        tls = load_server_context(args.tls_cert_file, args.tls_private_key_file)
    except TLSError as exc:
        raise UserError(str(exc)) from None
    reloader = CertReloader(tls, args.tls_cert_file, args.tls_private_key_file)
    metrics = WebhookMetrics()
    metrics.watch_process()
    routes = AdmissionRoutes(policy, metrics)
    stopping = threading.Event()
    try:
        server = HealthServer(
            args.bind_address,
            args.port,
            live=[Check("ping", lambda: None)],
            ready=[Check("shutdown", lambda: "shutting down" if stopping.is_set() else None)],
            metrics=metrics.write,
            tls=tls,
            post=routes.routes(),
            max_body=args.max_request_bytes,
        )
    except OSError as exc:
        raise UserError(f"cannot listen on {args.bind_address}:{args.port}: {exc}") from None
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    log.info(
        "webhook serving",
        port=server.port,
        scheduler=policy.scheduler_name,
        allocation_writers=list(policy.allocation_writers),
    )
    while not stop.wait(args.cert_reload_interval):
        problem = reloader.check()
        if problem is not None:
            log.warning("certificate not reloaded", error=problem)
    stopping.set()
    log.info("stopping", delay=args.shutdown_delay, in_flight=routes.in_flight)
    if args.shutdown_delay > 0:
        threading.Event().wait(args.shutdown_delay)
    server.stop()
    drained = routes.drain(args.shutdown_grace)
    log.info("stopped", drained=drained, in_flight=routes.in_flight)
    return 0
