"""scheduler.observability.device_metrics: the per-card families written straight to text are what
prometheus_client writes for the same samples (the reference is built here with
``GaugeMetricFamily`` and ``generate_latest`` from ``inspect.card_usage``); the kept work
follows replaced and deleted Device records and changed annotations."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.core import Node, Pod, decode_node, decode_pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, Device
from scheduler.observability.device_metrics import DeviceCollector
from scheduler.observability.inspect import INVALID, card_usage
from scheduler.observability.metrics import SchedulerMetrics

ALLOCATED = "scheduling.koordinator.sh/device-allocated"
CORE = "koordinator.sh/gpu-core"
MEMORY = "koordinator.sh/gpu-memory"
RATIO = "koordinator.sh/gpu-memory-ratio"
DEVICE_FAMILIES = (
    "koord_scheduler_device_capacity",
    "koord_scheduler_device_allocated",
    "koord_scheduler_device_pods",
    "koord_scheduler_device_healthy",
)


@dataclass
class View:
    nodes: dict[str, Node] = field(default_factory=dict)
    devices: list[Device] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)


def gpu(
    minor: int, uuid: str = "", healthy: bool = True, memory: str = "16Gi", core: str = "100"
) -> dict[str, Any]:
    return {"type": "gpu", "id": uuid or f"GPU-{minor}", "minor": minor, "health": healthy,
            "resources": {CORE: core, MEMORY: memory, RATIO: "100"}}  # fmt: skip


def other(kind: str, minor: int, uuid: str) -> dict[str, Any]:
    return {"type": kind, "id": uuid, "minor": minor, "health": True,
            "resources": {f"koordinator.sh/{kind}": "100"}}  # fmt: skip


def device(name: str, *cards: dict[str, Any], rv: str = "", checkpoint: str = "") -> Device:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if checkpoint:
        entries = [PodDeviceEntry("u-legacy", "cuda", "nvidia.com/gpu", (checkpoint,))]
        meta["annotations"] = {ANNOTATION_DEVICES_CHECKPOINTS: encode_devices_checkpoints(entries)}
    return Device.from_dict({"metadata": meta, "spec": {"devices": list(cards)}})


def pod(name: str, node: str, alloc: Any, phase: str = "Running") -> Pod:
    text = alloc if isinstance(alloc, str) else json.dumps(alloc)
    return decode_pod({"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                                    "annotations": {ALLOCATED: text}},
                       "spec": {"nodeName": node}, "status": {"phase": phase}})  # fmt: skip


def share(minor: int, **resources: str) -> dict[str, Any]:
    return {"gpu": [{"minor": minor, "resources": resources}]}


def cluster() -> View:
    """Every case the text must get right, in one cluster."""
    return View(
        nodes={n: decode_node({"metadata": {"name": n}}) for n in ("n1", "n2", "n3")},
        devices=[
            # declared out of (type, minor) order, one card unhealthy, gpu and rdma and fpga
            device("n1", gpu(1, healthy=False), other("rdma", 0, "0000:1f:00.0"), gpu(0),
                   other("fpga", 0, "fpga-0")),
            # label values that need escaping; a capacity Go writes with an exponent
            device("n2", gpu(0, uuid='GPU-"quoted"\\back\nline', memory="1000000", core="7")),
            # a card the kubelet holds (device checkpoint); a pod of another node's name
            device("n3", gpu(0), gpu(1, uuid="GPU-held"), checkpoint="GPU-held"),
            # two records of one name (the later cards win) and one card listed twice
            device("n4", gpu(0), gpu(1)),
            device("n4", gpu(1, memory="32Gi"), gpu(2), gpu(2, uuid="GPU-2-again")),
            device("n5"),  # no cards
        ],
        pods=[
            pod("a", "n1", share(0, **{CORE: "30", RATIO: "25"})),
            pod("b", "n1", {"gpu": [{"minor": 0, "resources": {CORE: "20", MEMORY: "4Gi"}}],
                            "rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "50"}}]}),
            pod("bad", "n1", "{nope"),  # does not decode: counted, holds every card of n1
            pod("neg", "n4", share(0, **{CORE: "-100"})),  # invalid: holds n4's card 0 whole
            pod("lost", "n5", share(3, **{CORE: "-1"})),  # invalid, on a node without cards
            pod("done", "n1", share(0, **{CORE: "50"}), phase="Succeeded"),
            pod("c", "n2", share(0, **{CORE: "3", MEMORY: "1000"})),
            pod("d", "n4", share(1, **{CORE: "10"})),
            pod("e", "n4", share(2, **{CORE: "10"})),
            pod("f", "nowhere", share(0, **{CORE: "10"})),
        ],
    )  # fmt: skip


def reference_device_families(view: View | None, errors: int) -> list[Metric]:
    """The five device families as prometheus_client objects, from ``card_usage``."""
    labels = ["node", "device_type", "minor", "uuid"]
    fams = {
        "koord_scheduler_device_capacity": GaugeMetricFamily(
            "koord_scheduler_device_capacity",
            "Capacity of one device as its Device CR declares it, per resource.",
            labels=[*labels, "resource"],
        ),
        "koord_scheduler_device_allocated": GaugeMetricFamily(
            "koord_scheduler_device_allocated",
            "Amount of one device allocated to bound pods by their device-allocated "
            "annotations, per resource.",
            labels=[*labels, "resource"],
        ),
        "koord_scheduler_device_pods": GaugeMetricFamily(
            "koord_scheduler_device_pods",
            "Number of bound pods holding a share of one device.",
            labels=labels,
        ),
        "koord_scheduler_device_healthy": GaugeMetricFamily(
            "koord_scheduler_device_healthy",
            "1 when the Device CR reports the device healthy, else 0.",
            labels=labels,
        ),
    }
    bad: list[Pod] = []
    cards = card_usage(view.nodes, view.devices, view.pods, errors=bad) if view else []
    for c in cards:
        card = [c.node, c.device_type, str(c.minor), c.uuid]
        for name in sorted(c.capacity):
            fams["koord_scheduler_device_capacity"].add_metric([*card, name], c.capacity[name])
        for name in sorted(c.allocated):
            fams["koord_scheduler_device_allocated"].add_metric([*card, name], c.allocated[name])
        holders = sum(1 for p in c.pods if not p.endswith(INVALID))
        fams["koord_scheduler_device_pods"].add_metric(card, holders)
        fams["koord_scheduler_device_healthy"].add_metric(card, 1 if c.healthy else 0)
    errors_total = CounterMetricFamily(
        "koord_scheduler_device_annotation_errors",
        "Bound pods seen with an invalid device-allocated annotation (counted once per "
        "pod and annotation text).",
        value=errors,
    )
    invalid = GaugeMetricFamily(
        "koord_scheduler_device_invalid_allocation_pods",
        "Bound pods on the node whose device-allocated annotation is invalid: the cards "
        "it names (every card of the node when it does not decode) count as fully used.",
        labels=["node"],
    )
    for node in sorted({p.node_name for p in bad}):
        invalid.add_metric([node], len({p.uid for p in bad if p.node_name == node}))
    return [*fams.values(), errors_total, invalid]


class Reference:
    """``m``'s registry in its order, the device families replaced by the reference ones and
    without ``*_created`` samples: what ``generate_latest`` makes of it is the expected text."""

    def __init__(self, m: SchedulerMetrics, view: View | None, errors: int) -> None:
        self._m = m
        self._device = reference_device_families(view, errors)

    def collect(self) -> Iterator[Metric]:
        names = {f.name for f in self._device}
        for metric in self._m.registry.collect():
            if metric.name == "koord_scheduler_device_capacity":
                yield from self._device
            elif metric.name not in names:
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
                yield metric


def watched(source: Callable[[], Any]) -> SchedulerMetrics:
    """Scheduler metrics as ``run`` wires them: queue, devices, then leader after them."""
    m = SchedulerMetrics()
    m.attempt("scheduled", "koord-scheduler", 0.004)
    m.watch_queue(lambda: None)
    m.watch_devices(source)
    m.watch_leader("koord-scheduler", lambda: True)
    return m


def test_exposition_is_prometheus_clients_rendering_of_the_same_samples() -> None:
    view = cluster()
    m = watched(lambda: view)
    got = m.exposition()
    assert got == generate_latest(Reference(m, view, errors=3))
    assert b'uuid="GPU-\\"quoted\\"\\\\back\\nline"' in got  # escaped as Go writes it
    assert b'resource="koordinator.sh/gpu-memory",uuid="GPU-0"} 1.7179869184e+10\n' in got
    assert m.exposition() == got  # a second scrape, from the kept work


@pytest.mark.parametrize(
    "source",
    [lambda: View(), lambda: None, lambda: (_ for _ in ()).throw(RuntimeError("informer"))],
    ids=["empty-view", "no-view", "source-raises"],
)
def test_no_cards_is_headers_only(source: Callable[[], Any]) -> None:
    m = watched(source)
    got = m.exposition()
    assert got == generate_latest(Reference(m, None, errors=0))
    assert b"# TYPE koord_scheduler_device_capacity gauge\n# HELP koord_scheduler_device_" in got


def test_registry_readers_get_the_same_samples() -> None:
    view = cluster()
    m = watched(lambda: view)
    plain = generate_latest(m.registry)  # a reader that knows nothing of the fast path
    fams = {f.name: f for f in text_string_to_metric_families(plain.decode())}
    expected = {f.name: f for f in reference_device_families(view, errors=3)}
    for name in DEVICE_FAMILIES:
        assert fams[name].samples == expected[name].samples, name
    fast = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    for name in DEVICE_FAMILIES:
        assert fast[name].samples == fams[name].samples, name


def test_a_collector_alone_renders_with_generate_latest() -> None:
    view = cluster()
    registry = CollectorRegistry()
    registry.register(DeviceCollector(lambda: view))

    class Expected:
        def collect(self) -> Iterable[Metric]:
            return reference_device_families(view, errors=3)

    assert generate_latest(registry) == generate_latest(Expected())


def core_line(m: SchedulerMetrics, node: str) -> str:
    (line,) = [line for line in capacity_lines(m, node) if CORE in line]
    return line


def capacity_lines(m: SchedulerMetrics, node: str) -> list[str]:
    return [
        line
        for line in m.exposition().decode().splitlines()
        if line.startswith("koord_scheduler_device_capacity{") and f'node="{node}"' in line
    ]


def test_a_replaced_device_shows_its_new_capacity() -> None:
    view = View(devices=[device("n1", gpu(0), rv="1"), device("n2", gpu(0), rv="1")])
    m = watched(lambda: view)
    assert core_line(m, "n1").endswith("} 100.0")
    view.devices[0] = device("n1", gpu(0, core="200"), rv="2")
    assert core_line(m, "n1").endswith("} 200.0")
    # a new record with the old resourceVersion is still read: the key is the record itself
    view.devices[0] = device("n1", gpu(0, core="300"), rv="2")
    assert core_line(m, "n1").endswith("} 300.0")
    assert m.exposition() == generate_latest(Reference(m, view, errors=0))


def test_a_deleted_device_leaves_the_exposition() -> None:
    view = View(devices=[device("n1", gpu(0)), device("n2", gpu(0))])
    m = watched(lambda: view)
    assert capacity_lines(m, "n1")
    del view.devices[0]
    assert capacity_lines(m, "n1") == []
    assert len(capacity_lines(m, "n2")) == 3
    view.devices.append(device("n1", gpu(0, uuid="GPU-new")))  # back, as a new record
    assert all('uuid="GPU-new"' in line for line in capacity_lines(m, "n1"))
    assert m.exposition() == generate_latest(Reference(m, view, errors=0))


def test_a_pod_update_changes_the_allocation() -> None:
    view = View(devices=[device("n1", gpu(0))], pods=[pod("a", "n1", share(0, **{CORE: "30"}))])
    m = watched(lambda: view)
    before = m.exposition()
    view.pods = [pod("a", "n1", share(0, **{CORE: "60"}))]
    after = m.exposition()
    assert before != after
    assert after == generate_latest(Reference(m, view, errors=0))
    view.pods = []
    assert b"koord_scheduler_device_allocated{" not in m.exposition()
