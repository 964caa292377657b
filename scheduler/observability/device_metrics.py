"""The per-card device metrics, written straight to exposition text at scrape time.

Role: ``DeviceCollector`` computes, at each scrape, the per-card account of
``scheduler.observability.inspect`` (the Device CRs and the pods' ``device-allocated`` annotations
as the caches know them) and yields the four per-card gauge families (capacity, allocated, pods,
healthy) as ``CardFamily`` objects, then the annotation error counter and the per-node gauge of
bound pods whose annotation is invalid (counted by ``scheduler.observability.inspect``'s rule, the
ledger's). ``SchedulerMetrics.exposition`` has a ``CardFamily`` write its own text, so a scrape of
5,000 nodes x 8 GPUs builds no object per sample; any other reader of the registry (a plain
``generate_latest``) gets ordinary samples, built when first read. docs/metrics.md documents every
series.

Invariants:

- ``CardFamily.write`` writes exactly what prometheus_client's ``generate_latest`` writes for
  its ``samples``: HELP and TYPE lines made by prometheus_client itself, labels in sorted
  name order with values escaped as it escapes them, values through its ``floatToGoString``.
- What a scrape keeps for the next one is keyed by object identity and holds the object, so
  it is never served for another object: the uncharged cards and label text of a Device while
  the view holds the same Device record (records are immutable and replaced on update; the
  informer keeps the old record when a relist brings the same resourceVersion, so identity
  is the finer key), and a decoded annotation while a pod of the last scrape carried the same
  text. Both caches hold only what the last scrape saw: deleted or replaced Devices and gone
  annotation texts are dropped at the next scrape. Equal capacities share one dict and its
  text (a table emptied at 4,096 shapes); value and resource texts are memoized (bounded).
- Never raises: a failing source or account yields no samples (the families still appear).
- One scrape computes at a time (a lock); the families it yields are the caller's alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any, TextIO

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationReading, read_allocations
from apis.core import Pod
from apis.device import Device
from scheduler.observability.inspect import (
    INVALID,
    CardUsage,
    ObjectsView,
    account_cards,
    device_cards,
)

__all__ = [
    "ALLOCATED",
    "CAPACITY",
    "HEALTHY",
    "INVALID_PODS",
    "PODS",
    "CardFamily",
    "DeviceCollector",
    "call_or_none",
    "render_one",
]

INVALID_PODS = "koord_scheduler_device_invalid_allocation_pods"
CAPACITY = "koord_scheduler_device_capacity"
ALLOCATED = "koord_scheduler_device_allocated"
PODS = "koord_scheduler_device_pods"
HEALTHY = "koord_scheduler_device_healthy"

_HELP = {
    CAPACITY: "Capacity of one device as its Device CR declares it, per resource.",
    ALLOCATED: "Amount of one device allocated to bound pods by their device-allocated "
    "annotations, per resource.",
    PODS: "Number of bound pods holding a share of one device.",
    HEALTHY: "1 when the Device CR reports the device healthy, else 0.",
}
_CARD_LABELS = ("node", "device_type", "minor", "uuid")


def call_or_none(source: Callable[[], Any]) -> Any:
    """``source()``, or None when it raises (scrape-time sources never fail a scrape)."""
    try:
        return source()
    except Exception:
        return None


class _Only:
    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self._metric]


def render_one(metric: Metric) -> bytes:
    """prometheus_client's text for one family."""
    return generate_latest(_Only(metric))


# -- text pieces, each as prometheus_client writes it -----------------------------------------


def _esc(value: str) -> str:
    """A label value, escaped (prometheus_client's ``_escape`` for label values)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@lru_cache(maxsize=4096)
def _go(value: float) -> str:
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


@lru_cache(maxsize=1024)
def _resource(name: str) -> str:
    return f'resource="{_esc(name)}",'


@cache
def _header(name: str) -> str:
    return render_one(GaugeMetricFamily(name, _HELP[name])).decode()


def _holders(card: CardUsage) -> int:
    """Pods holding a share of ``card`` (a pod whose annotation does not decode holds none)."""
    return sum(1 for p in card.pods if not p.endswith(INVALID))


_Pairs = tuple[tuple[str, str], ...]
"""A capacity as text: (``resource="..."``, value) in resource order."""


def _pairs(capacity: Mapping[str, int]) -> _Pairs:
    return tuple((_resource(name), _go(capacity[name])) for name in sorted(capacity))


class _Shapes:
    """One capacity dict, and its text, for all the cards that declare the same capacity
    (a cluster has few shapes; the table is emptied if it ever holds 4,096)."""

    def __init__(self) -> None:
        self._known: dict[tuple[tuple[str, int], ...], tuple[dict[str, int], _Pairs]] = {}

    def get(self, capacity: dict[str, int]) -> tuple[dict[str, int], _Pairs]:
        key = tuple(sorted(capacity.items()))
        hit = self._known.get(key)
        if hit is None:
            if len(self._known) >= 4096:
                self._known.clear()
            hit = self._known[key] = (capacity, _pairs(capacity))
        return hit


class _NodeText:
    """The label text of one node's cards (sorted by type and minor), and their capacity as
    text. ``heads[i]`` + ``tails[i]`` are card i's labels in sorted name order (``resource``
    goes between them); ``tails[i]`` ends with the space before the value."""

    __slots__ = ("caps", "heads", "tails")

    def __init__(self, cards: Sequence[CardUsage], caps: Sequence[_Pairs]) -> None:
        self.heads = [
            f'{{device_type="{_esc(c.device_type)}",minor="{c.minor}",node="{_esc(c.node)}",'
            for c in cards
        ]
        self.tails = [f'uuid="{_esc(c.uuid)}"}} ' for c in cards]
        self.caps = caps


_Card = tuple[str, str, int, str, str, bool, dict[str, int]]
"""A card's fields, uncharged, in ``CardUsage``'s order (``CardUsage(*card)``)."""


class _Entry:
    """What one Device record gives every scrape: its uncharged cards (spec order), the
    positions of the cards that count in (type, minor) order, and their text."""

    __slots__ = ("cards", "device", "order", "text")

    def __init__(self, device: Device, shapes: _Shapes) -> None:
        self.device = device
        own = device_cards(device)
        shaped = [shapes.get(c.capacity) for c in own]
        self.cards: list[_Card] = [
            (c.node, c.device_type, c.minor, c.uuid, c.model, c.healthy, capacity)
            for c, (capacity, _) in zip(own, shaped, strict=True)
        ]
        last = {(c.device_type, c.minor): i for i, c in enumerate(own)}  # later wins
        order = [last[k] for k in sorted(last)]
        self.order = None if order == list(range(len(own))) else order
        self.text = _NodeText([own[i] for i in order], [shaped[i][1] for i in order])


_Group = tuple[_NodeText, Sequence[CardUsage]]
"""One node: its text and its charged cards, in the same order."""


def _write_capacity(out: TextIO, groups: Sequence[_Group]) -> None:
    for text, _ in groups:
        out.write(
            "".join(
                f"{CAPACITY}{head}{resource}{tail}{value}\n"
                for head, tail, pairs in zip(text.heads, text.tails, text.caps, strict=True)
                for resource, value in pairs
            )
        )


def _write_healthy(out: TextIO, groups: Sequence[_Group]) -> None:
    healthy, unhealthy = _go(1.0), _go(0.0)
    for text, cards in groups:
        out.write(
            "".join(
                f"{HEALTHY}{head}{tail}{healthy if card.healthy else unhealthy}\n"
                for head, tail, card in zip(text.heads, text.tails, cards, strict=True)
            )
        )


def _write_allocated(out: TextIO, groups: Sequence[_Group]) -> None:
    for text, cards in groups:
        out.write(
            "".join(
                f"{ALLOCATED}{head}{_resource(name)}{tail}{_go(card.allocated[name])}\n"
                for head, tail, card in zip(text.heads, text.tails, cards, strict=True)
                for name in sorted(card.allocated)
            )
        )


def _write_pods(out: TextIO, groups: Sequence[_Group]) -> None:
    for text, cards in groups:
        out.write(
            "".join(
                f"{PODS}{head}{tail}{_go(_holders(card))}\n"
                for head, tail, card in zip(text.heads, text.tails, cards, strict=True)
            )
        )


_WRITERS = {
    CAPACITY: _write_capacity,
    ALLOCATED: _write_allocated,
    PODS: _write_pods,
    HEALTHY: _write_healthy,
}


class CardFamily(Metric):
    """One per-card gauge family of one scrape. ``write`` renders its exposition text;
    ``samples`` are built on first read, for any other reader of the registry."""

    def __init__(self, name: str, groups: Sequence[_Group]) -> None:
        super().__init__(name, _HELP[name], "gauge")
        self._groups = groups
        self._samples: list[Sample] | None = None

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = self._build()
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._samples = value

    def write(self, out: TextIO) -> None:
        """What ``generate_latest`` writes for this family, without making its samples."""
        out.write(_header(self.name))
        _WRITERS[self.name](out, self._groups)

    def _build(self) -> list[Sample]:
        per_resource = self.name in (CAPACITY, ALLOCATED)
        labels = [*_CARD_LABELS, "resource"] if per_resource else list(_CARD_LABELS)
        family = GaugeMetricFamily(self.name, self.documentation, labels=labels)
        for _, cards in self._groups:
            for c in cards:
                card = [c.node, c.device_type, str(c.minor), c.uuid]
                if per_resource:
                    amounts = c.capacity if self.name == CAPACITY else c.allocated
                    for name in sorted(amounts):
                        family.add_metric([*card, name], float(amounts[name]))
                elif self.name == PODS:
                    family.add_metric(card, float(_holders(c)))
                else:
                    family.add_metric(card, 1.0 if c.healthy else 0.0)
        return family.samples


class DeviceCollector(Collector):
    """Per-card capacity, allocation, pods and health, plus the annotation error counter and
    the per-node gauge of pods with an invalid annotation."""

    def __init__(self, source: Callable[[], ObjectsView | None]) -> None:
        self._source = source
        self._entries: dict[int, _Entry] = {}
        self._shapes = _Shapes()
        self._decoded: dict[str, AllocationReading] = {}
        self._bad_seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.annotation_errors = 0
        self.invalid_by_node: dict[str, int] = {}
        """Bound pods with an invalid annotation, per node, at the last scrape."""

    def collect(self) -> Iterator[Metric]:
        view = call_or_none(self._source)
        with self._lock:
            groups = self._scrape(view) if view is not None else []
            errors = float(self.annotation_errors)
            invalid = sorted(self.invalid_by_node.items())
        for name in (CAPACITY, ALLOCATED, PODS, HEALTHY):
            yield CardFamily(name, groups)
        yield CounterMetricFamily(
            "koord_scheduler_device_annotation_errors",
            "Bound pods seen with an invalid device-allocated annotation (counted once per "
            "pod and annotation text).",
            value=errors,
        )
        family = GaugeMetricFamily(
            INVALID_PODS,
            "Bound pods on the node whose device-allocated annotation is invalid: the cards "
            "it names (every card of the node when it does not decode) count as fully used.",
            labels=["node"],
        )
        for node, count in invalid:
            family.add_metric([node], float(count))
        yield family

    def describe(self) -> Iterable[Metric]:
        return []

    def _scrape(self, view: ObjectsView) -> list[_Group]:
        errors: list[Pod] = []
        try:
            groups = self._account(view, errors)
        except Exception:  # never fail a scrape
            groups = []
        bad = {(p.uid, p.annotations.get(ANNOTATION_DEVICE_ALLOCATED, "")) for p in errors}
        self.annotation_errors += len(bad - self._bad_seen)
        self._bad_seen = bad
        by_node: dict[str, set[str]] = {}
        for p in errors:
            by_node.setdefault(p.node_name, set()).add(p.uid)
        self.invalid_by_node = {node: len(uids) for node, uids in by_node.items()}
        return groups

    def _account(self, view: ObjectsView, errors: list[Pod]) -> list[_Group]:
        old_decoded: dict[str, AllocationReading] = self._decoded
        decoded: dict[str, AllocationReading] = {}

        def read(text: str) -> AllocationReading:
            hit = decoded.get(text)
            if hit is None:
                hit = old_decoded.get(text)
                if hit is None:
                    hit = read_allocations(text)
                decoded[text] = hit
            return hit

        old_entries, entries = self._entries, {}
        uncharged: list[tuple[Device, list[CardUsage]]] = []
        used: list[_Entry] = []
        for device in sorted(view.devices, key=lambda d: d.name):
            entry = old_entries.get(id(device))
            if entry is None or entry.device is not device:
                entry = _Entry(device, self._shapes)
            entries[id(device)] = entry
            used.append(entry)
            uncharged.append((device, [CardUsage(*card) for card in entry.cards]))
        cards = account_cards(uncharged, view.pods, read=read, errors=errors)
        self._entries, self._decoded = entries, decoded

        groups: list[_Group] = []
        i = 0
        while i < len(used):
            name = used[i].device.name
            j = i + 1
            while j < len(used) and used[j].device.name == name:
                j += 1
            if j == i + 1:  # the usual case: one Device CR per node
                entry, fresh = used[i], uncharged[i][1]
                order = entry.order
                groups.append((entry.text, fresh if order is None else [fresh[k] for k in order]))
            else:  # several records of one name: the later cards win, as in card_usage
                own = [c for _, cards_of_one in uncharged[i:j] for c in cards_of_one]
                winners = [
                    cards[k] for k in sorted({(c.node, c.device_type, c.minor) for c in own})
                ]
                groups.append((_NodeText(winners, [_pairs(c.capacity) for c in winners]), winners))
            i = j
        return groups
