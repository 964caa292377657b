"""koordlet.metrics: scraped over real HTTP and parsed with prometheus_client.parser."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from koordlet.devices.fake import FakeLibrary, parse_fake_spec
from koordlet.devices.library import HEALTHY, Health
from koordlet.metrics import GPUCollector, KoordletMetrics, MetricsServer, parse_bind_address

GIB = 1024**3


@pytest.fixture
def fake(tmp_path: Path) -> FakeLibrary:
    spec = parse_fake_spec(
        {
            "healthFile": "h.yaml",
            "gpus": [
                {
                    "uuid": "GPU-0",
                    "minor": 0,
                    "name": "NVIDIA A100-SXM4-80GB",
                    "memory": "80Gi",
                    "memoryUsed": "10Gi",
                    "utilization": 0.75,
                },
                {
                    "uuid": "GPU-1",
                    "minor": 1,
                    "name": "NVIDIA A100-SXM4-80GB",
                    "memory": "80Gi",
                    "memoryUsed": "1Gi",
                },
            ],
        },
        tmp_path,
    )
    return FakeLibrary(spec)


class State:
    def __init__(self) -> None:
        self.health: dict[str, Health] = {}
        self.ok = True


@pytest.fixture
def state() -> State:
    return State()


@pytest.fixture
def served(fake: FakeLibrary, state: State) -> Iterator[tuple[str, KoordletMetrics]]:
    registry = CollectorRegistry()
    metrics = KoordletMetrics(registry)
    gpus = fake.discover().gpus
    registry.register(GPUCollector("node-1", fake, lambda: gpus, lambda: state.health))
    server = MetricsServer(registry, ("127.0.0.1", 0), healthz=lambda: state.ok)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", metrics
    finally:
        server.stop()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, ctype, text = _get(base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _gpu_labels(minor: int) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            {
                "node": "node-1",
                "minor": str(minor),
                "uuid": f"GPU-{minor}",
                "model": "A100-SXM4-80GB",
            }.items()
        )
    )


def test_card_gauges_are_read_at_scrape_time(
    served: tuple[str, KoordletMetrics], state: State, tmp_path: Path
) -> None:
    base, _ = served
    got = _samples(base)
    g0, g1 = _gpu_labels(0), _gpu_labels(1)
    assert got[("koordlet_gpu_memory_total_bytes", g0)] == 80 * GIB
    assert got[("koordlet_gpu_memory_used_bytes", g0)] == 10 * GIB
    assert got[("koordlet_gpu_memory_used_bytes", g1)] == 1 * GIB
    assert got[("koordlet_gpu_utilization_ratio", g0)] == 0.75
    assert ("koordlet_gpu_utilization_ratio", g1) not in got  # not reported by the card
    assert got[("koordlet_gpu_healthy", g0)] == 1.0
    assert got[("koordlet_gpu_healthy", g1)] == 1.0

    state.health = {"GPU-1": Health(False, "Xid79", "x"), "GPU-0": HEALTHY}
    (tmp_path / "h.yaml").write_text(yaml.safe_dump({"GPU-1": {"healthy": True, "lost": True}}))
    got = _samples(base)
    assert got[("koordlet_gpu_healthy", g1)] == 0.0
    assert ("koordlet_gpu_memory_used_bytes", g1) not in got  # unreadable now
    assert got[("koordlet_gpu_memory_total_bytes", g1)] == 80 * GIB


def test_agent_counters_and_hook_observer(served: tuple[str, KoordletMetrics]) -> None:
    base, metrics = served
    got = _samples(base)
    for result in ("created", "updated", "unchanged", "error"):
        assert got[("koordlet_device_sync_total", (("result", result),))] == 0
    metrics.sync_done("created")
    metrics.sync_done("unchanged")
    metrics.sync_done("unchanged")
    metrics.checkpoint_error()
    metrics.observe("PreCreateContainer", "success", 0.002)
    metrics.observe("PreCreateContainer", "success", 0.2)
    metrics.observe("PreCreateContainer", "error", 0.0001)
    got = _samples(base)
    assert got[("koordlet_device_sync_total", (("result", "created"),))] == 1
    assert got[("koordlet_device_sync_total", (("result", "unchanged"),))] == 2
    assert got[("koordlet_checkpoint_errors_total", ())] == 1
    stage = ("stage", "PreCreateContainer")
    assert got[("koordlet_runtime_hook_requests_total", (("result", "success"), stage))] == 2
    assert got[("koordlet_runtime_hook_requests_total", (("result", "error"), stage))] == 1
    assert got[("koordlet_runtime_hook_duration_seconds_count", (stage,))] == 3
    assert got[("koordlet_runtime_hook_duration_seconds_bucket", (("le", "0.0025"), stage))] == 2
    assert got[("koordlet_runtime_hook_duration_seconds_sum", (stage,))] == pytest.approx(0.2021)


@pytest.mark.parametrize(
    ("ok", "status", "body"),
    [
        pytest.param(True, 200, "ok\n", id="healthy"),
        pytest.param(False, 503, "unhealthy\n", id="down"),
    ],
)
def test_healthz(
    served: tuple[str, KoordletMetrics], state: State, ok: bool, status: int, body: str
) -> None:
    state.ok = ok
    assert _get(served[0] + "/healthz")[::2] == (status, body)


def test_metrics_have_no_created_series(served: tuple[str, KoordletMetrics]) -> None:
    """Like every Kubernetes component (and koord-scheduler), no ``*_created`` samples: they
    double the series of every counter and histogram for nothing a dashboard reads."""
    url, metrics = served
    metrics.sync_done("created")
    text = _get(url + "/metrics")[2]
    assert 'koordlet_device_sync_total{result="created"} 1.0' in text
    assert "_created" not in text.replace('result="created"', "")


@pytest.mark.parametrize(
    ("ready", "status", "body"),
    [
        pytest.param(True, 200, "ok\n", id="reporting"),
        pytest.param(False, 503, "not ready\n", id="cannot-report"),
    ],
)
def test_readyz_says_whether_the_agent_can_report(
    fake: FakeLibrary, ready: bool, status: int, body: str
) -> None:
    server = MetricsServer(
        CollectorRegistry(), ("127.0.0.1", 0), healthz=lambda: True, readyz=lambda: ready
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert _get(url + "/readyz")[::2] == (status, body)
        assert _get(url + "/healthz")[::2] == (200, "ok\n")  # alive either way
    finally:
        server.stop()


def test_unknown_path_is_404(served: tuple[str, KoordletMetrics]) -> None:
    assert _get(served[0] + "/nope")[0] == 404


def test_server_stops_and_frees_the_port(fake: FakeLibrary) -> None:
    server = MetricsServer(CollectorRegistry(), ("127.0.0.1", 0))
    server.start()
    port = server.port
    with pytest.raises(RuntimeError):
        server.start()
    server.stop()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    again = MetricsServer(CollectorRegistry(), ("127.0.0.1", port))
    again.start()  # the port is free again
    again.stop()


def test_busy_port_is_an_oserror() -> None:
    first = MetricsServer(CollectorRegistry(), ("127.0.0.1", 0))
    first.start()
    try:
        with pytest.raises(OSError):
            MetricsServer(CollectorRegistry(), ("127.0.0.1", first.port)).start()
    finally:
        first.stop()


def test_metrics_live_only_in_the_given_registry() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    KoordletMetrics(a)
    KoordletMetrics(b)  # no clash: nothing global
    assert a.get_sample_value("koordlet_checkpoint_errors_total") == 0


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param(":9316", ("0.0.0.0", 9316), id="any"),
        pytest.param("127.0.0.1:0", ("127.0.0.1", 0), id="loopback-free-port"),
        pytest.param("0.0.0.0:8080", ("0.0.0.0", 8080), id="explicit"),
        pytest.param("[::]:9316", ("::", 9316), id="ipv6"),
        pytest.param("", ("0.0.0.0", 9316), id="empty"),
        pytest.param("localhost:", ("localhost", 9316), id="default-port"),
    ],
)
def test_parse_bind_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_bind_address(address) == expected


@pytest.mark.parametrize("address", ["9316", "a:b", "1.2.3.4:70000", "::1:80", "[::1]x"])
def test_parse_bind_address_rejects(address: str) -> None:
    with pytest.raises(ValueError):
        parse_bind_address(address)


def test_fairshare_pod_metrics() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from koordlet.fairshare.server import ClientStats
    from koordlet.metrics import FairShareMetrics

    registry = CollectorRegistry()
    stats = [
        ClientStats(0, "u1", "ns", "a", share=0.5, limit=1.0, granted_ratio=0.6, throttled_s=2.5),
        ClientStats(1, "u2", "ns", "b", share=0.2, limit=0.2, granted_ratio=0.1, throttled_s=0.0),
    ]
    m = FairShareMetrics(registry, "n1", lambda: stats, lambda: {0: {"u1": 0.55}})
    m.observe_grant(0.0004)
    text = generate_latest(registry).decode()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    a = (("minor", "0"), ("namespace", "ns"), ("node", "n1"), ("pod", "a"))
    b = (("minor", "1"), ("namespace", "ns"), ("node", "n1"), ("pod", "b"))
    assert got[("koordlet_gpu_pod_share_ratio", a)] == 0.5
    assert got[("koordlet_gpu_pod_usage_ratio", a)] == 0.55
    assert ("koordlet_gpu_pod_usage_ratio", b) not in got  # card 1 not measured
    assert got[("koordlet_gpu_pod_granted_ratio", b)] == 0.1
    assert got[("koordlet_gpu_pod_throttled_seconds_total", a)] == 2.5
    assert got[("koordlet_gpu_token_grant_latency_seconds_count", ())] == 1.0
    assert got[("koordlet_gpu_token_grant_latency_seconds_bucket", (("le", "0.0005"),))] == 1.0
