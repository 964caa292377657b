"""Prometheus metrics of the node agent and the HTTP server for ``/metrics`` and ``/healthz``.

Role: per-card gauges read from the device library at scrape time (a custom collector), the
agent's own counters (device sync passes, checkpoint errors) and the runtime-hook observer
(``observe(stage, result, seconds)``) that the hook registry calls; all on an explicit
``CollectorRegistry`` given by the caller. ``docs/metrics.md`` documents each metric.

Invariants:

- Nothing registers at import time; every metric lives in the registry passed in.
- Card gauges carry the labels ``node``, ``minor``, ``uuid``, ``model``. A card whose usage
  cannot be read at scrape time has no ``used``/``utilization`` samples (its ``total`` and
  ``healthy`` stay); a card that does not report utilization has no utilization sample.
- ``MetricsServer`` serves on its own daemon threads, started and stopped explicitly; ``stop``
  closes the socket. Port 0 binds a free port (``port`` tells which). ``/readyz`` answers
  ``readyz`` (200 or 503) with the ``readyz_notes`` lines after its first line.
"""

from __future__ import annotations

import copy
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from apis.version import python_version, version
from koordlet.devices.library import GPU, HEALTHY, DeviceLibrary, DeviceQueryError, Health
from koordlet.devices.toolkit import STATES, Verdict

__all__ = [
    "DEFAULT_METRICS_PORT",
    "FairShareMetrics",
    "GPUCollector",
    "GPUIsolationCollector",
    "KoordletMetrics",
    "MetricsServer",
    "PodShareStats",
    "parse_bind_address",
]

DEFAULT_METRICS_PORT: Final = 9316
SYNC_RESULTS: Final = ("created", "updated", "unchanged", "error")
HOOK_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_GPU_LABELS: Final = ("node", "minor", "uuid", "model")

log = structlog.get_logger("koordlet.metrics")


class KoordletMetrics:
    """The agent's counters and histogram; also the runtime-hook observer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.device_sync = Counter(
            "koordlet_device_sync",
            "Device CR sync passes by result (created, updated, unchanged, error).",
            ["result"],
            registry=registry,
        )
        for result in SYNC_RESULTS:
            self.device_sync.labels(result=result)
        self.checkpoint_errors = Counter(
            "koordlet_checkpoint_errors",
            "Reads of the kubelet device checkpoint that failed (corrupt, truncated, unreadable).",
            registry=registry,
        )
        self.hook_requests = Counter(
            "koordlet_runtime_hook_requests",
            "Runtime-hook requests served, by hook stage and result.",
            ["stage", "result"],
            registry=registry,
        )
        self.hook_duration = Histogram(
            "koordlet_runtime_hook_duration_seconds",
            "Time to serve one runtime-hook request, by hook stage.",
            ["stage"],
            buckets=HOOK_BUCKETS,
            registry=registry,
        )

        self.hook_denied = Counter(
            "koordlet_runtime_hook_denied",
            "Containers of pods with a GPU allocation started without any GPU because the "
            "allocation could not be served (fail closed), by reason.",
            ["reason"],
            registry=registry,
        )
        self.admission_refused = Counter(
            "koordlet_gpu_admission_refused",
            "Pods refused at the node because their device shares would over-commit a device, "
            "or a VF they name is held, beside the pods already admitted (set Failed, reason "
            "DeviceOvercommit).",
            registry=registry,
        )

        self.build_info = Gauge(
            "koordlet_build_info",
            "Always 1; the labels say which koord-py version and Python this agent runs.",
            ["version", "python_version"],
            registry=registry,
        )
        self.build_info.labels(version(), python_version()).set(1)

    def hook_denial(self, reason: str) -> None:
        """Count one container the GPU hook started without GPUs."""
        self.hook_denied.labels(reason=reason).inc()

    def admission_refusal(self) -> None:
        """Count one pod refused at the node (GPU over-commit)."""
        self.admission_refused.inc()

    def sync_done(self, result: str) -> None:
        """``koordlet.reporting.sync.SyncObserver``: count one sync pass."""
        self.device_sync.labels(result=result).inc()

    def checkpoint_error(self) -> None:
        """Count one failed read of the kubelet checkpoint."""
        self.checkpoint_errors.inc()

    def observe(self, stage: str, result: str, seconds: float) -> None:
        """Record one runtime-hook request (called by the hook registry)."""
        self.hook_requests.labels(stage=stage, result=result).inc()
        self.hook_duration.labels(stage=stage).observe(seconds)


class GPUCollector:
    """Per-card gauges, read from the library at scrape time."""

    def __init__(
        self,
        node_name: str,
        library: DeviceLibrary,
        gpus: Callable[[], Iterable[GPU]],
        health: Callable[[], Mapping[str, Health]],
    ) -> None:
        self._node = node_name
        self._library = library
        self._gpus = gpus
        self._health = health

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "koordlet_gpu_memory_total_bytes", "Total memory of the GPU.", labels=_GPU_LABELS
            ),
            GaugeMetricFamily(
                "koordlet_gpu_memory_used_bytes", "Memory in use on the GPU.", labels=_GPU_LABELS
            ),
            GaugeMetricFamily(
                "koordlet_gpu_utilization_ratio",
                "Fraction of the last sample period the GPU was busy (0 to 1).",
                labels=_GPU_LABELS,
            ),
            GaugeMetricFamily(
                "koordlet_gpu_healthy",
                "1 when the GPU is healthy as reported on the Device CR, else 0.",
                labels=_GPU_LABELS,
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        total, used, utilization, healthy = self._families()
        health = self._health()
        for gpu in self._gpus():
            labels = [self._node, str(gpu.minor), gpu.uuid, gpu.model]
            total.add_metric(labels, float(gpu.memory_total))
            healthy.add_metric(labels, 1.0 if health.get(gpu.uuid, HEALTHY).healthy else 0.0)
            try:
                usage = self._library.usage(gpu)
            except DeviceQueryError as exc:
                log.debug("gpu usage unreadable at scrape", uuid=gpu.uuid, error=str(exc))
                continue
            used.add_metric(labels, float(usage.memory_used))
            if usage.utilization is not None:
                utilization.add_metric(labels, usage.utilization)
        return (total, used, utilization, healthy)


class GPUIsolationCollector:
    """``koordlet_gpu_isolation{node,state}``: 1 for the toolkit verdict now (read at scrape
    time, ``koordlet.devices.toolkit``), 0 for the other states."""

    def __init__(self, node: str, verdict: Callable[[], Verdict]) -> None:
        self._node = node
        self._verdict = verdict

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "koordlet_gpu_isolation",
            "Whether a container's environment can select GPUs on this node, from the NVIDIA "
            "container toolkit's config: 1 for the current state (safe, unsafe, "
            "misconfigured, unknown), 0 for the others.",
            labels=["node", "state"],
        )

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        now = self._verdict().state
        for state in STATES:
            family.add_metric([self._node, state], 1.0 if state == now else 0.0)
        return [family]


class PodShareStats(Protocol):
    """One fair-shared pod as the collector reads it (``koordlet.fairshare.ClientStats``)."""

    @property
    def minor(self) -> int: ...
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def share(self) -> float: ...
    @property
    def granted_ratio(self) -> float: ...
    @property
    def throttled_s(self) -> float: ...


_POD_LABELS: Final = ("node", "minor", "namespace", "pod")
GRANT_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


class FairShareMetrics:
    """Per-pod fair-share gauges read at scrape time, and the token grant latency histogram.

    ``stats`` lists the served pods (the fair-share server); ``measured`` returns NVML's
    measured usage ``{minor: {pod uid: ratio}}`` (the usage monitor; cards it could not read
    are absent, and so are their ``usage`` samples).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        node_name: str,
        stats: Callable[[], Iterable[PodShareStats]],
        measured: Callable[[], Mapping[int, Mapping[str, float]]] | None = None,
    ) -> None:
        self._node = node_name
        self._stats = stats
        self._measured = measured
        self.grant_latency = Histogram(
            "koordlet_gpu_token_grant_latency_seconds",
            "Time from a token request becoming servable (arrival, or the token coming free) "
            "to its grant being sent.",
            buckets=GRANT_BUCKETS,
            registry=registry,
        )
        registry.register(self)

    def observe_grant(self, seconds: float) -> None:
        self.grant_latency.observe(seconds)

    def _families(
        self,
    ) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "koordlet_gpu_pod_share_ratio",
                "The pod's target share of its GPU's time (gpu-core/100, scaled down when the "
                "card is over-subscribed).",
                labels=_POD_LABELS,
            ),
            GaugeMetricFamily(
                "koordlet_gpu_pod_usage_ratio",
                "The pod's measured share of its GPU since the last scrape (NVML per-process "
                "SM utilization, summed over the pod's processes).",
                labels=_POD_LABELS,
            ),
            GaugeMetricFamily(
                "koordlet_gpu_pod_granted_ratio",
                "GPU time granted to the pod by the token scheduler in the sliding window / "
                "the window.",
                labels=_POD_LABELS,
            ),
            CounterMetricFamily(
                "koordlet_gpu_pod_throttled_seconds",
                "Time the pod's token requests waited for a token.",
                labels=_POD_LABELS,
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        share, usage, granted, throttled = self._families()
        measured = self._measured() if self._measured is not None else {}
        for st in self._stats():
            labels = [self._node, str(st.minor), st.namespace, st.name]
            share.add_metric(labels, st.share)
            granted.add_metric(labels, st.granted_ratio)
            throttled.add_metric(labels, st.throttled_s)
            card = measured.get(st.minor)
            if card is not None:
                usage.add_metric(labels, card.get(st.uid, 0.0))
        return (share, usage, granted, throttled)


def parse_bind_address(address: str, default_port: int = DEFAULT_METRICS_PORT) -> tuple[str, int]:
    """``:9316``, ``0.0.0.0:9316``, ``[::]:9316``, ``127.0.0.1:0`` -> (host, port).

    An empty host means every IPv4 interface. Raises ValueError.
    """
    text = address.strip()
    if not text:
        return "0.0.0.0", default_port
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid bind address {address!r}")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        raise ValueError(f"invalid bind address {address!r}: expected HOST:PORT")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"invalid port in bind address {address!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in bind address {address!r}")
    return host or "0.0.0.0", port


class _WithoutCreated:
    """The registry as Kubernetes components expose theirs: no ``*_created`` samples."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            kept = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(kept) != len(metric.samples):
                metric = copy.copy(metric)
                metric.samples = kept
            yield metric


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsServer:
    """``/metrics`` and ``/healthz`` over HTTP; see the module docstring."""

    def __init__(
        self,
        registry: CollectorRegistry,
        address: tuple[str, int] = ("0.0.0.0", DEFAULT_METRICS_PORT),
        healthz: Callable[[], bool] | None = None,
        readyz: Callable[[], bool] | None = None,
        readyz_notes: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self._registry = registry
        self._address = address
        self._healthz = healthz
        self._readyz = readyz
        self._readyz_notes = readyz_notes
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("MetricsServer not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind and serve; raises OSError when the address cannot be bound."""
        if self._server is not None:
            raise RuntimeError("MetricsServer already started")
        registry, healthz, readyz = _WithoutCreated(self._registry), self._healthz, self._readyz
        notes = self._readyz_notes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = healthz() if healthz is not None else True
                    self._reply(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
                elif path == "/readyz":
                    ok = readyz() if readyz is not None else True
                    body = "ok\n" if ok else "not ready\n"
                    body += "".join(f"{n}\n" for n in (notes() if notes is not None else ()))
                    self._reply(200 if ok else 503, body.encode())
                else:
                    self._reply(404, b"not found\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # scrapes every few seconds would flood the logs

        host, port = self._address
        server_cls = _Server6 if ":" in host else _Server
        self._server = server_cls((host, port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="koordlet-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics server listening", address=host, port=self.port)

    def stop(self) -> None:
        """Stop serving and close the socket; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
