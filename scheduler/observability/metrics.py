"""Prometheus metrics of the scheduler: kube-scheduler's, plus the device view per card.

Role: ``SchedulerMetrics`` is the ``SchedulerObserver`` the ``run`` command gives the
scheduler (and the scheduling queue's ``on_incoming`` hook). It owns an explicit
``CollectorRegistry`` with kube-scheduler's metrics under their exact names, types, label
names and buckets (``pkg/scheduler/metrics/metrics.go``), and custom collectors computed
at scrape time: the queue gauges (from the snapshot the scheduling thread publishes), the
leader gauge and the device metrics (``scheduler.observability.device_metrics``: from the
Device CRs and the pods' ``device-allocated`` annotations, as the caches know them). docs/metrics.md
documents every series.

Invariants:

- No module-level registration: importing this module registers nothing; every metric lives
  in the registry given to (or made by) ``SchedulerMetrics``.
- Buckets are generated the way Go's ``prometheus.ExponentialBuckets`` does (repeated
  multiplication), so the ``le`` labels match kube-scheduler's byte for byte.
- Observer calls come from the scheduling thread and the bind workers; they only touch
  prometheus_client's thread-safe children (cached per label tuple to keep the hot path cheap).
- Scrape-time collectors never raise: a failing source yields no samples for that family.
- ``exposition`` is ``generate_latest`` of the registry without ``*_created`` samples, byte
  for byte; the per-card device families write their own text into the one output buffer
  (at 5,000 nodes x 8 GPUs they are ~320,000 samples that are never built as objects).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, BinaryIO, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from apis.version import python_version, version
from scheduler.observability.device_metrics import CardFamily, DeviceCollector, render_one
from scheduler.observability.device_metrics import call_or_none as _safe
from scheduler.observability.inspect import ObjectsView

__all__ = [
    "ATTEMPT_BUCKETS",
    "EXTENSION_POINT_BUCKETS",
    "PLUGIN_BUCKETS",
    "POD_ATTEMPTS_BUCKETS",
    "SLI_BUCKETS",
    "DeviceCollector",
    "InformerLike",
    "QueueCollector",
    "SchedulerMetrics",
    "exponential_buckets",
    "plain_exposition",
]


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Go's ``prometheus.ExponentialBuckets``: ``start``, then each times ``factor``."""
    if count < 1 or start <= 0 or factor <= 1:
        raise ValueError("need count >= 1, start > 0, factor > 1")
    out = []
    value = start
    for _ in range(count):
        out.append(value)
        value *= factor
    return tuple(out)


ATTEMPT_BUCKETS = exponential_buckets(0.001, 2, 15)
SLI_BUCKETS = exponential_buckets(0.01, 2, 20)
POD_ATTEMPTS_BUCKETS = exponential_buckets(1, 2, 5)
EXTENSION_POINT_BUCKETS = exponential_buckets(0.0001, 2, 12)
PLUGIN_BUCKETS = exponential_buckets(0.00001, 1.5, 20)
PREEMPTION_VICTIMS_BUCKETS = exponential_buckets(1, 2, 7)

QUEUES = ("active", "backoff", "unschedulable", "gated")


class QueueStatsLike(Protocol):
    """What the scheduling thread publishes (``scheduler.core.QueueStats``)."""

    @property
    def pending(self) -> Mapping[str, int]: ...

    @property
    def unschedulable(self) -> Mapping[tuple[str, str], int]: ...


class QueueCollector(Collector):
    """``scheduler_pending_pods{queue}`` and ``scheduler_unschedulable_pods{plugin,profile}``."""

    def __init__(self, source: Callable[[], QueueStatsLike | None]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = _safe(self._source)
        pending = GaugeMetricFamily(
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type. 'active' means number of pods in "
            "activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means number "
            "of pods in unschedulablePods that the scheduler attempted to schedule and failed; "
            "'gated' is the number of unschedulable pods that the scheduler never attempted to "
            "schedule because they are gated.",
            labels=["queue"],
        )
        unschedulable = GaugeMetricFamily(
            "scheduler_unschedulable_pods",
            "The number of unschedulable pods broken down by plugin name. A pod will increment "
            "the gauge for all plugins that caused it to not schedule and so this metric have "
            "meaning only when broken down by plugin.",
            labels=["plugin", "profile"],
        )
        if stats is not None:
            for queue in QUEUES:
                pending.add_metric([queue], float(stats.pending.get(queue, 0)))
            for (plugin, profile), count in sorted(stats.unschedulable.items()):
                unschedulable.add_metric([plugin, profile], float(count))
        yield pending
        yield unschedulable

    def describe(self) -> Iterable[Metric]:
        return []


class SchedulerMetrics:
    """kube-scheduler's metrics in an explicit registry; implements ``SchedulerObserver``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._attempts = Counter(
            "scheduler_schedule_attempts_total",
            "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod "
            "could not be scheduled, while 'error' means an internal scheduler problem.",
            ["result", "profile"],
            registry=r,
        )
        self._attempt_duration = Histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            ["result", "profile"],
            buckets=ATTEMPT_BUCKETS,
            registry=r,
        )
        self._sli = Histogram(
            "scheduler_pod_scheduling_sli_duration_seconds",
            "E2e latency for a pod being scheduled, from the time the pod enters the scheduling "
            "queue and might involve multiple scheduling attempts.",
            ["attempts"],
            buckets=SLI_BUCKETS,
            registry=r,
        )
        self._pod_attempts = Histogram(
            "scheduler_pod_scheduling_attempts",
            "Number of attempts to successfully schedule a pod.",
            buckets=POD_ATTEMPTS_BUCKETS,
            registry=r,
        )
        self._extension_point = Histogram(
            "scheduler_framework_extension_point_duration_seconds",
            "Latency for running all plugins of a specific extension point.",
            ["extension_point", "status", "profile"],
            buckets=EXTENSION_POINT_BUCKETS,
            registry=r,
        )
        self._plugin = Histogram(
            "scheduler_plugin_execution_duration_seconds",
            "Duration for running a plugin at a specific extension point.",
            ["plugin", "extension_point", "status"],
            buckets=PLUGIN_BUCKETS,
            registry=r,
        )
        self._incoming = Counter(
            "scheduler_queue_incoming_pods_total",
            "Number of pods added to scheduling queues by event and queue type.",
            ["queue", "event"],
            registry=r,
        )
        # client-go's (k8s.io/component-base/metrics/prometheus/restclient, v1.20), which the
        # kubernetes-mixin scheduler dashboard reads.
        self._rest_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"],
            registry=r,
        )
        self._rest_latency = Histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb and URL.",
            ["verb", "url"],
            buckets=exponential_buckets(0.001, 2, 10),
            registry=r,
        )
        self._extender = Histogram(
            "koord_scheduler_extender_request_duration_seconds",
            "Extender requests answered (koord-scheduler extender), by verb and HTTP code.",
            ["verb", "code"],
            buckets=exponential_buckets(0.0005, 2, 16),
            registry=r,
        )
        self._preemption_attempts = Counter(
            "scheduler_preemption_attempts",
            "Total preemption attempts in the cluster till now",
            registry=r,
        )
        self._preemption_victims = Histogram(
            "scheduler_preemption_victims",
            "Number of selected preemption victims",
            buckets=PREEMPTION_VICTIMS_BUCKETS,
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}
        build_info = Gauge(
            "koord_scheduler_build_info",
            "Always 1; the labels say which koord-py version and Python this process runs.",
            ["version", "python_version"],
            registry=r,
        )
        build_info.labels(version(), python_version()).set(1)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- the observers ------------------------------------------------------------------------

    def extension_point(
        self, profile: str, extension_point: str, status: str, seconds: float
    ) -> None:
        self._child(self._extension_point, extension_point, status, profile).observe(seconds)

    def plugin(self, plugin: str, extension_point: str, status: str, seconds: float) -> None:
        self._child(self._plugin, plugin, extension_point, status).observe(seconds)

    def attempt(self, result: str, profile: str, seconds: float) -> None:
        self._child(self._attempts, result, profile).inc()
        self._child(self._attempt_duration, result, profile).observe(seconds)

    def scheduled(self, attempts: int, sli_seconds: float) -> None:
        self._child(self._sli, str(attempts)).observe(sli_seconds)
        self._pod_attempts.observe(attempts)

    def preemption(self, victims: int | None) -> None:
        """One PostFilter run (kube counts every one as an attempt) and, when it evicted
        pods, how many."""
        self._preemption_attempts.inc()
        if victims is not None:
            self._preemption_victims.observe(victims)

    def extender_request(self, verb: str, code: int, seconds: float) -> None:
        """One answered extender request (``koord-scheduler extender``)."""
        self._child(self._extender, verb, str(code)).observe(seconds)

    def rest_request(self, server: str, verb: str, url: str, code: str, seconds: float) -> None:
        """One API request (``RestClient``'s observer): ``server`` is ``https://host:port``,
        ``url`` the path template; labelled as client-go labels them (the url label is the
        whole URL, its ``{}`` escaped as Go's ``url.URL.String`` escapes them)."""
        host = server.split("://", 1)[-1].rstrip("/")
        self._child(self._rest_requests, code, verb, host).inc()
        full = server.rstrip("/") + url.replace("{", "%7B").replace("}", "%7D")
        self._child(self._rest_latency, verb, full).observe(seconds)

    def incoming(self, queue: str, event: str) -> None:
        """The scheduling queue's ``on_incoming`` hook."""
        self._child(self._incoming, queue, event).inc()

    # -- scrape-time collectors ---------------------------------------------------------------

    def watch_queue(self, source: Callable[[], QueueStatsLike | None]) -> None:
        self.registry.register(QueueCollector(source))

    def watch_devices(self, source: Callable[[], ObjectsView | None]) -> DeviceCollector:
        collector = DeviceCollector(source)
        self.registry.register(collector)
        return collector

    def watch_process(self) -> None:
        """``process_*`` of this process (prometheus_client's collector: the names of Go's),
        which the kubernetes-mixin dashboard reads for the scheduler's memory and CPU."""
        ProcessCollector(registry=self.registry)

    def watch_informers(self, source: Callable[[], Iterable[InformerLike]]) -> None:
        """``koord_scheduler_informer_decode_errors_total{resource}`` and
        ``koord_scheduler_informer_quarantined_objects{resource}``: objects of each cache that
        do not decode (counted every time; held now). Labelled by kind only, so the series
        stay few whatever a tenant creates; the objects are named in the log."""
        self.registry.register(_InformerCollector(source))

    def watch_leader(self, name: str, leading: Callable[[], bool]) -> None:
        """``leader_election_master_status{name}`` (client-go's gauge, as kube-scheduler exposes
        it): 1 while this replica leads (always, without leader election), else 0."""
        self.registry.register(_LeaderCollector(name, leading))

    def exposition(self) -> bytes:
        """The Prometheus text format (0.0.4) of the registry, as kube-scheduler serves it:
        ``generate_latest`` of the registry without ``*_created``, byte for byte."""
        buffer = io.BytesIO()
        self.write_exposition(buffer)
        return buffer.getvalue()

    def write_exposition(self, out: BinaryIO) -> None:
        """``exposition`` written to ``out`` as it is made (what ``/metrics`` streams): the
        per-card device families write their own text, node by node, so no whole body is
        ever held."""
        text = io.TextIOWrapper(out, encoding="utf-8", newline="\n")
        try:
            for metric in _WithoutCreated(self.registry).collect():
                if isinstance(metric, CardFamily):
                    metric.write(text)
                else:
                    text.flush()
                    out.write(render_one(metric))
            text.flush()
        finally:
            text.detach()  # the stream stays open: it is the caller's


class InformerLike(Protocol):
    """What the informer collector reads of each cache (``scheduler.kube.informer.Informer``)."""

    @property
    def kind(self) -> str: ...

    @property
    def decode_errors(self) -> int: ...

    def quarantined(self) -> Mapping[str, str]: ...


class _InformerCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[InformerLike]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "koord_scheduler_informer_decode_errors",
            "Objects listed or watched that did not decode (quarantined), by resource.",
            labels=["resource"],
        )
        held = GaugeMetricFamily(
            "koord_scheduler_informer_quarantined_objects",
            "Objects that do not decode now, held out of the cache (named in the log), by "
            "resource.",
            labels=["resource"],
        )
        informers: list[InformerLike] | None = _safe(lambda: list(self._source()))
        for informer in informers or ():
            try:
                kind, count, now = informer.kind, informer.decode_errors, informer.quarantined()
            except Exception:  # a scrape never fails on one source
                continue
            errors.add_metric([kind], float(count))
            held.add_metric([kind], float(len(now)))
        yield errors
        yield held

    def describe(self) -> Iterable[Metric]:
        return []


class _LeaderCollector(Collector):
    def __init__(self, name: str, leading: Callable[[], bool]) -> None:
        self._name = name
        self._leading = leading

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease.",
            labels=["name"],
        )
        leading = _safe(self._leading)
        if leading is not None:
            family.add_metric([self._name], 1.0 if leading else 0.0)
        yield family

    def describe(self) -> Iterable[Metric]:
        return []


def plain_exposition(registry: CollectorRegistry) -> bytes:
    """``generate_latest`` of any registry without ``*_created`` samples (the webhook's)."""
    return generate_latest(_WithoutCreated(registry))


class _WithoutCreated:
    """The registry without prometheus_client's ``*_created`` samples, which kube-scheduler
    (Go's client) does not expose."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            if isinstance(metric, CardFamily):  # gauges: no *_created; samples made lazily
                yield metric
                continue
            kept = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(kept) != len(metric.samples):
                metric.samples = kept
            yield metric
