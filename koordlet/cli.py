"""``koordlet``: the node agent's command line and composition root (SPEC section 2).

Subcommands:
  report          print the Device CR the agent would write, and exit (no API server;
                  ``--once`` is accepted and changes nothing);
  run             the agent: discovery, health watcher, Device/Node sync loop, /metrics and
                  /healthz, and the runtime-hook server when ``runtimehooks.server`` exists.

This is the only module that builds adapters (NVML or fake library, the kube API, the hook
server) and configures logging (structlog, JSON by default, on stderr). User errors (bad
flags, unreadable files, no kubeconfig, a busy port) print one line on stderr and exit 2,
without a traceback. ``run`` stops cleanly on SIGTERM or SIGINT and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

import structlog
import yaml
from prometheus_client import CollectorRegistry

from apis.duration import DurationError, parse_go_duration_seconds
from apis.fairshare import DEFAULT_GEMINI_LIBRARY, DefaultLimit
from apis.logflags import LEVELS, log_level, verbosity
from apis.signals import StopSignals
from apis.version import version_line
from koordlet.agent import Agent, Service, report_once
from koordlet.devices.fake import FakeLibrary, FakeSpecError
from koordlet.devices.library import GPU, DeviceLibrary
from koordlet.devices.sysfs import DEFAULT_SYSFS_ROOT
from koordlet.devices.toolkit import (
    DEFAULT_TOOLKIT_CONFIG,
    DELIVERY_CDI,
    DELIVERY_ENV,
    ToolkitCheck,
)
from koordlet.fairshare.monitor import PodUsageMonitor, ProcessPods
from koordlet.fairshare.server import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNS_PER_POD,
    FairShareConfig,
    FairShareServer,
)
from koordlet.fairshare.service import EVENT_REASON as FAIRSHARE_EVENT_REASON
from koordlet.fairshare.service import FairShareService
from koordlet.hookserver import (
    DEFAULT_CDI_DIR,
    DEFAULT_HOOK_DIR,
    DEFAULT_SOCKET,
    FairShareWiring,
    HookServiceError,
    hook_service,
)
from koordlet.kubelet.checkpoint import DEFAULT_KUBELET_ROOT
from koordlet.metrics import DEFAULT_METRICS_PORT, FairShareMetrics, parse_bind_address
from koordlet.pods.record import PodRecord
from koordlet.reporting.reporter import DEFAULT_GPU_RESOURCE_NAMES, GPUResourceNames

PROG = "koordlet"
DEFAULT_FAIRSHARE_STATE = "/var/run/koordlet/fairshare.json"
EXIT_USAGE = 2

log = structlog.get_logger("koordlet")


class UserError(Exception):
    """Reported as one line on stderr with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def parse_duration(text: str) -> float:
    """A Go duration (``10s``, ``500ms``, ``1m30s``; Go's flag rules, so no bare seconds) in
    seconds (> 0); raises ValueError."""
    try:
        seconds = parse_go_duration_seconds(text)
    except DurationError:
        raise ValueError(f"invalid duration {text!r} (examples: 10s, 500ms, 1m)") from None
    if not seconds > 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


class _StderrLogger:
    """One JSON line per event on the current ``sys.stderr``, whole lines across threads."""

    _lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self._lock:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


_STDERR_LOGGER = _StderrLogger()


def configure_logging(fmt: str = "json", level: int | str = logging.INFO) -> None:
    """structlog on stderr: one JSON object per line (or a console rendering)."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper()) if isinstance(level, str) else level
        ),
        logger_factory=lambda *args: _STDERR_LOGGER,
        cache_logger_on_first_use=False,
    )


def _library(args: argparse.Namespace) -> DeviceLibrary:
    if args.fake_gpus:
        try:
            return FakeLibrary.from_file(args.fake_gpus)
        except FakeSpecError as exc:
            raise UserError(f"--fake-gpus {exc}") from None
    from koordlet.devices.nvml import NvmlLibrary

    return NvmlLibrary(sysfs_root=args.sysfs_root)


def _node_name(args: argparse.Namespace, required: bool) -> str:
    name: str = args.node_name or os.environ.get("NODE_NAME", "")
    if not name and required:
        raise UserError("--node-name is required (or set NODE_NAME)")
    return name or socket.gethostname()


def cmd_report(args: argparse.Namespace) -> int:
    device = report_once(
        _node_name(args, False),
        _library(args),
        args.kubelet_root,
        gpu_resources=_gpu_resources(args),
        sysfs_root=args.sysfs_root,
    )
    doc = device.to_dict()
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
    return 0


def _gpu_resources(args: argparse.Namespace) -> GPUResourceNames:
    try:
        return GPUResourceNames.parse(args.gpu_resource_names)
    except ValueError as exc:
        raise UserError(f"--gpu-resource-names: {exc}") from None


def cmd_run(args: argparse.Namespace) -> int:
    if args.query_kubelet and not args.gpushare_device_plugin:
        raise UserError("--query-kubelet is an option of --gpushare-device-plugin")
    node_name = _node_name(args, True)
    gpu_resources = _gpu_resources(args)
    if args.gpu_delivery == DELIVERY_CDI and args.visible_devices_by != "uuid":
        raise UserError("--gpu-delivery cdi names cards by UUID: add --visible-devices-by uuid")
    try:
        interval = parse_duration(args.sync_interval)
        address = parse_bind_address(args.metrics_bind_address)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    library = _library(args)
    from koordlet.kube import KubeConfigError, KubeNodeAPI

    try:
        api = KubeNodeAPI.from_kubeconfig(args.kubeconfig)
    except KubeConfigError as exc:
        raise UserError(str(exc)) from None
    if not api.verifies_tls:
        # Said once here rather than as a urllib3 warning on every request.
        warnings.filterwarnings("ignore", message="Unverified HTTPS request")
        log.warning("TLS certificate verification disabled by the kubeconfig")
    registry = CollectorRegistry()
    agent_ref: list[Agent] = []

    def observe(stage: str, result: str, seconds: float) -> None:
        if agent_ref:
            agent_ref[0].metrics.observe(stage, result, seconds)

    agent = Agent(
        node_name=node_name,
        library=library,
        api=api,
        registry=registry,
        sync_interval_s=interval,
        kubelet_root=args.kubelet_root,
        metrics_address=address,
        pod_getter=api,
        event_api=api,
        gpu_resources=gpu_resources,
        status_api=api,
        sysfs_root=args.sysfs_root,
        toolkit=(
            ToolkitCheck(args.nvidia_toolkit_config, args.gpu_delivery)
            if args.nvidia_toolkit_config else None
        ),
        require_gpu_isolation=args.require_gpu_isolation,
    )
    fairshare = _fairshare(args, node_name, api, registry, agent_ref, interval)
    if fairshare is not None:
        agent.add_service(fairshare)
    hooks = hook_service(
        socket_path=args.socket,
        hook_dir=args.hook_dir,
        visible_devices_by=args.visible_devices_by,
        observe=observe,
        fairshare=FairShareWiring(
            fairshare.server if fairshare is not None else None,
            args.fairshare_hook_library,
            DefaultLimit(args.fairshare_default_limit),
        ),
        pods=agent.pods,
        on_denied=agent.deny,
        on_kubelet_devices=agent.kubelet_devices,
        admission=agent.admission,
        sysfs_root=args.sysfs_root,
        cdi_dir=args.cdi_dir,
        kubelet_gpus=agent.kubelet_grants.container_gpus,
        failure_policy=args.hook_failure_policy,
        gpu_delivery=args.gpu_delivery,
    )
    if hooks is not None:
        agent.add_service(hooks)
        agent.on_pods_listed(hooks.pods_listed)
    if args.gpushare_device_plugin:
        agent.add_service(_gpushare_service(args, node_name, api, agent_ref))
    agent_ref.append(agent)
    signals = StopSignals()  # it never logs: see apis/signals.py
    stop = signals.event
    previous = signals.install()
    try:
        try:
            agent.start()
        except (OSError, HookServiceError) as exc:
            raise UserError(f"cannot start: {exc}") from None
        while not stop.wait(0.5):
            pass
        log.info("signal received: stopping", signal=signals.received)
    finally:
        agent.stop()
        api.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    log.info("koordlet stopped", node=node_name)
    return 0


def _fairshare(
    args: argparse.Namespace,
    node_name: str,
    api: Any,
    registry: CollectorRegistry,
    agent_ref: list[Agent],
    interval_s: float,
) -> FairShareService | None:
    """The Gemini fair-share server, its pod sync and its metrics (None when off)."""
    if args.fairshare == "off":
        log.info("fair-share (Gemini) server off: opted-in pods will be refused")
        return None
    monitor_ref: list[PodUsageMonitor] = []

    def gpus() -> tuple[GPU, ...]:
        return agent_ref[0].inventory.gpus if agent_ref else ()

    def measured() -> dict[int, dict[str, float]]:
        if not agent_ref:
            return {}
        if not monitor_ref:
            monitor_ref.append(
                PodUsageMonitor(agent_ref[0].inventory.library, gpus, ProcessPods(args.proc_root))
            )
        return monitor_ref[0].sample()

    server_ref: list[FairShareServer] = []
    metrics = FairShareMetrics(
        registry, node_name, lambda: server_ref[0].stats() if server_ref else [], measured
    )
    try:
        config = FairShareConfig(
            bind_address=args.fairshare_address,
            state_path=args.fairshare_state,
            max_conns_per_pod=args.fairshare_max_conns_per_pod,
            idle_timeout_s=args.fairshare_idle_timeout,
        )
    except ValueError as exc:
        raise UserError(f"fair share: {exc}") from None
    server = FairShareServer(config, on_grant=metrics.observe_grant)
    server_ref.append(server)

    def on_problem(pod: PodRecord, message: str) -> None:
        events = agent_ref[0].events if agent_ref else None
        if events is not None:
            events.warn(pod.namespace, pod.name, pod.uid, FAIRSHARE_EVENT_REASON, message)

    return FairShareService(
        server,
        lambda: api.list_node_pod_records(node_name),
        default_limit=DefaultLimit(args.fairshare_default_limit),
        interval_s=interval_s,
        on_problem=on_problem,
    )


def _fairshare_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--fairshare",
        choices=("on", "off"),
        default="on",
        help="serve Gemini's token scheduler for opted-in pods (off: such pods are refused)",
    )
    run.add_argument(
        "--fairshare-address",
        default=os.environ.get("HOST_IP") or "127.0.0.1",
        help="IP the fair-share sockets listen on and containers connect to "
        "(default $HOST_IP, else 127.0.0.1)",
    )
    run.add_argument(
        "--fairshare-hook-library",
        default=DEFAULT_GEMINI_LIBRARY,
        help=f"Gemini hook library put in LD_PRELOAD (default {DEFAULT_GEMINI_LIBRARY})",
    )
    run.add_argument(
        "--fairshare-default-limit",
        choices=[d.value for d in DefaultLimit],
        default=DefaultLimit.FULL.value,
        help="GPU-time limit of a pod without koordinator.sh/gpu-core-limit: full "
        "(work-conserving, default) or request (strict isolation)",
    )
    run.add_argument(
        "--fairshare-state",
        default=DEFAULT_FAIRSHARE_STATE,
        help=f"file remembering the fair-share ports across restarts "
        f"(default {DEFAULT_FAIRSHARE_STATE}; empty: none)",
    )
    run.add_argument(
        "--fairshare-max-conns-per-pod",
        type=int,
        default=DEFAULT_MAX_CONNS_PER_POD,
        help="open connections a pod may hold to its relay; at the bound the least recently "
        f"used idle one is closed (default {DEFAULT_MAX_CONNS_PER_POD})",
    )
    run.add_argument(
        "--fairshare-idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="seconds after which a fair-share connection with nothing in flight is closed "
        f"(0: never; default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    run.add_argument(
        "--proc-root", default="/proc", help="host /proc, to map GPU processes to pods"
    )


def _gpushare_service(
    args: argparse.Namespace, node_name: str, api: Any, agent_ref: list[Agent]
) -> Service:
    from koordlet.deviceplugin.gpushare import MemoryUnit
    from koordlet.deviceplugin.service import GPUShareService, cards_of

    def cards() -> list[Any]:
        if not agent_ref:
            return []
        inventory = agent_ref[0].inventory
        return cards_of(inventory.gpus, inventory.tracker.snapshot())

    return GPUShareService(
        node_name=node_name,
        cards=cards,
        pods=_gpushare_pods(args, api),
        api=api,
        plugin_dir=args.device_plugin_dir,
        unit=MemoryUnit[args.gpushare_memory_unit],
    )


def _gpushare_pods(args: argparse.Namespace, api: Any) -> Any:
    """Where the device plugin lists its candidate pods: the API server, or with
    ``--query-kubelet`` the kubelet's ``/pods`` (the API server when that fails)."""
    if not args.query_kubelet:
        return api
    from koordlet.deviceplugin.kubeletpods import KubeletPodsConfig, KubeletPodSource

    if not 0 < args.kubelet_port < 65536:
        raise UserError(f"--kubelet-port {args.kubelet_port}: not a port")
    config = KubeletPodsConfig(
        address=args.kubelet_address,
        port=args.kubelet_port,
        scheme=args.kubelet_scheme,
        token_file=args.kubelet_token_file,
        ca_file=args.kubelet_ca_file,
    )
    log.info("gpushare device plugin lists pods from the kubelet", url=config.url)
    return KubeletPodSource(config, api)


def _verbosity(text: str) -> int:
    try:
        return verbosity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def log_level_of(args: argparse.Namespace) -> str:
    """The log level from ``--log-level`` or ``-v`` (the same rule as koord-scheduler's)."""
    try:
        return log_level(args.log_level, args.v)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-name", metavar="N", help="the node's name (default: $NODE_NAME)")
    p.add_argument("--fake-gpus", metavar="FILE", help="GPUs described in YAML instead of NVML")
    p.add_argument(
        "--kubelet-root",
        metavar="DIR",
        default=DEFAULT_KUBELET_ROOT,
        help=f"kubelet root directory (default {DEFAULT_KUBELET_ROOT})",
    )
    p.add_argument(
        "--sysfs-root",
        metavar="DIR",
        default=DEFAULT_SYSFS_ROOT,
        help=f"sysfs mount for PCI topology and RDMA NICs (default {DEFAULT_SYSFS_ROOT})",
    )
    p.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="log format on stderr"
    )
    p.add_argument(
        "--log-level", choices=LEVELS, default=None, help="lowest level logged (default info)"
    )
    p.add_argument(
        "-v",
        "--v",
        type=_verbosity,
        default=None,
        metavar="N",
        help="klog verbosity, as Koordinator's koordlet: 0-3 log at info, 4 and more at debug "
        "(give -v or --log-level, not both)",
    )
    p.add_argument(
        "--gpu-resource-names",
        metavar="LIST",
        default=",".join(DEFAULT_GPU_RESOURCE_NAMES),
        help="comma list of the device-plugin resources whose devices are GPUs, published "
        "from the kubelet checkpoint (* is a wildcard; default: %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Koordinator-compatible GPU node agent.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rep = sub.add_parser(
        "report",
        help="print the Device CR the agent would write, and exit",
        description="Print the node's Device CR as the agent would write it (no API server).",
    )
    rep.add_argument(
        "--once",
        action="store_true",
        help="accepted for compatibility; report always prints one report and exits",
    )
    rep.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    _common(rep)
    rep.set_defaults(func=cmd_report)

    run = sub.add_parser(
        "run",
        help="run the node agent",
        description="Keep the node's Device CR, labels and extended resources up to date, "
        "serve /metrics and /healthz, and the runtime-hook API.",
    )
    _common(run)
    run.add_argument("--kubeconfig", metavar="F", help="kubeconfig (default: in-cluster)")
    run.add_argument("--sync-interval", default="10s", help="sync period (default 10s)")
    run.add_argument("--hook-dir", default=DEFAULT_HOOK_DIR, help="runtime proxy's hook dir")
    run.add_argument("--socket", default=DEFAULT_SOCKET, help="runtime-hook unix socket")
    run.add_argument(
        "--hook-failure-policy",
        choices=("Fail", "Ignore"),
        default="Fail",
        help="the failure policy koord-runtime-proxy applies when the agent cannot answer "
        "(default Fail: while the agent is down, containers not labelled "
        "runtimeproxy.koordinator.sh/skip-hookserver=true are refused, and the registration "
        "stays when the agent stops; Ignore starts them unchanged, so a CUDA image's "
        "NVIDIA_VISIBLE_DEVICES=all sees every GPU)",
    )
    run.add_argument("--visible-devices-by", choices=("minor", "uuid"), default="minor")
    run.add_argument(
        "--gpu-delivery",
        choices=(DELIVERY_ENV, DELIVERY_CDI),
        default=DELIVERY_ENV,
        help="how a container's cards reach the runtime: NVIDIA_VISIBLE_DEVICES (env, the "
        "default), or the CDI annotation cdi.k8s.io/koordinator.sh_gpu naming the NVIDIA CDI "
        "spec's devices by UUID (cdi; needs --visible-devices-by uuid, a CDI-enabled runtime "
        "and nvidia-ctk cdi generate; works with the toolkit's "
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false)",
    )
    run.add_argument(
        "--nvidia-toolkit-config",
        default=DEFAULT_TOOLKIT_CONFIG,
        metavar="FILE",
        help="the NVIDIA container toolkit's config.toml, judged for GPU isolation "
        "(koordlet_gpu_isolation, /readyz; default %(default)s; empty: not checked)",
    )
    run.add_argument(
        "--require-gpu-isolation",
        action="store_true",
        help="report not ready unless the toolkit's config lets no variable select GPUs in "
        "an unprivileged container (the verdict 'safe')",
    )
    run.add_argument(
        "--cdi-dir",
        default=DEFAULT_CDI_DIR,
        metavar="DIR",
        help="where the RDMA hook writes the CDI spec of each container's RDMA devices (the "
        "runtime's CDI spec directory; default %(default)s; empty: no CDI, no RDMA device "
        "reaches a container)",
    )
    run.add_argument(
        "--gpushare-device-plugin",
        action="store_true",
        help="serve gpushare's aliyun.com/gpu-mem kubelet device plugin",
    )
    run.add_argument(
        "--gpushare-memory-unit",
        choices=("GiB", "MiB"),
        default="GiB",
        help="the unit of one aliyun.com/gpu-mem (gpushare's --memory-unit; default GiB)",
    )
    run.add_argument(
        "--query-kubelet",
        action="store_true",
        help="the gpushare device plugin lists the node's pods from the kubelet's /pods, not the "
        "API server (gpushare's flag; the API server when the kubelet fails)",
    )
    run.add_argument(
        "--kubelet-address",
        default="127.0.0.1",
        help="the kubelet, for --query-kubelet (default 127.0.0.1: the DaemonSet's host network)",
    )
    run.add_argument(
        "--kubelet-port", type=int, default=10250, help="the kubelet's port (default 10250)"
    )
    run.add_argument(
        "--kubelet-scheme",
        choices=("https", "http"),
        default="https",
        help="https (port 10250, with the token) or http (the read-only port 10255)",
    )
    run.add_argument(
        "--kubelet-token-file",
        default="/var/run/secrets/kubernetes.io/serviceaccount/token",
        help="bearer token for the kubelet (default: the pod's service-account token)",
    )
    run.add_argument(
        "--kubelet-ca-file",
        default="",
        help="verify the kubelet's certificate with this CA (default: not verified, as gpushare)",
    )
    run.add_argument(
        "--device-plugin-dir",
        default="/var/lib/kubelet/device-plugins",
        help="the kubelet's device-plugin directory (kubelet.sock)",
    )
    run.add_argument(
        "--metrics-bind-address",
        "--addr",
        dest="metrics_bind_address",
        default=f":{DEFAULT_METRICS_PORT}",
        metavar="HOST:PORT",
        help=f"address of /metrics and /healthz; :PORT is every interface (default "
        f":{DEFAULT_METRICS_PORT}; --addr is Koordinator's koordlet name for it)",
    )
    _fairshare_flags(run)
    run.set_defaults(func=cmd_run)
    for p in (parser, rep, run):  # --version on the command and every subcommand
        p.add_argument("--version", action="version", version=version_line(PROG))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        configure_logging(args.log_format, log_level_of(args))
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
