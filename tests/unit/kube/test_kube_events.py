"""scheduler.kube.events: aggregation (count, FIFO, window, cap) and the recorder's writes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from apis.core import Pod
from scheduler.kube.events import (
    CORE_V1,
    EVENTS_V1,
    EventAggregator,
    EventKey,
    EventRecorder,
    micro_time,
    rfc3339,
)
from scheduler.kube.rest import RestClient
from tests.fakes import FakeClock
from tests.unit.kube.kube_fakes import FakeTransport, json_response, status_response

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def key(name: str, message: str = "0/3 nodes are available") -> EventKey:
    return EventKey("ns", name, f"uid-{name}", "Warning", "FailedScheduling", message)


def aggregator(clock: FakeClock, **kw: object) -> EventAggregator:
    return EventAggregator(
        clock=clock.now,
        wall=lambda: T0 + timedelta(seconds=clock.now()),
        **kw,  # type: ignore[arg-type]
    )


def test_repeats_fold_into_one_entry_with_a_count() -> None:
    clock = FakeClock()
    agg = aggregator(clock)
    for _ in range(3):
        agg.add(key("a"))
        clock.advance(1)
    assert len(agg) == 1 and agg.pending == 1
    entry = agg.next_dirty()
    assert entry is not None
    assert (entry.count, entry.written_count) == (3, 0)
    assert entry.first_seen == T0 and entry.last_seen == T0 + timedelta(seconds=2)
    agg.written(entry, 3, "a.1")
    assert agg.next_dirty() is None


def test_different_messages_are_different_events() -> None:
    agg = aggregator(FakeClock())
    agg.add(key("a", "x"))
    agg.add(key("a", "y"))
    assert len(agg) == 2


def test_dirty_entries_come_out_first_in_first_out() -> None:
    agg = aggregator(FakeClock())
    for name in ("a", "b", "a", "c", "a"):
        agg.add(key(name))
    order = []
    while (entry := agg.next_dirty()) is not None:
        order.append(entry.key.name)
        agg.written(entry, entry.count, "x")
    assert order == ["a", "b", "c"]


def test_occurrence_during_a_write_queues_the_entry_again() -> None:
    agg = aggregator(FakeClock())
    agg.add(key("a"))
    entry = agg.next_dirty()
    assert entry is not None
    count = entry.count
    agg.add(key("a"))  # arrives while the first write is in flight
    agg.written(entry, count, "a.1")
    again = agg.next_dirty()
    assert again is entry and again.count == 2 and again.written_count == 1


def test_idle_clean_entries_expire_after_the_window() -> None:
    clock = FakeClock()
    agg = aggregator(clock, window=600.0)
    agg.add(key("a"))
    entry = agg.next_dirty()
    assert entry is not None
    agg.written(entry, 1, "a.1")
    clock.advance(601)
    agg.add(key("a"))
    fresh = agg.next_dirty()
    assert fresh is not None and fresh is not entry and fresh.event_name == ""


def test_cap_drops_new_keys_when_everything_is_dirty() -> None:
    agg = aggregator(FakeClock(), max_entries=2)
    agg.add(key("a"))
    agg.add(key("b"))
    agg.add(key("c"))
    assert len(agg) == 2 and agg.dropped == 1
    agg.add(key("a"))  # known keys still count
    assert agg.occurrences == 4


def test_failed_write_forgets_the_backlog() -> None:
    agg = aggregator(FakeClock())
    agg.add(key("a"))
    entry = agg.next_dirty()
    assert entry is not None
    agg.failed(entry)
    assert not entry.dirty and agg.next_dirty() is None


def pod(name: str = "p") -> Pod:
    return Pod(namespace="ns", name=name, uid=f"uid-{name}", scheduler_name="koord-scheduler")


def wait_for(cond: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def test_recorder_posts_then_patches_the_count() -> None:
    t = FakeTransport()
    t.on("POST", "/api/v1/namespaces/ns/events", json_response({}, 201))
    recorder = EventRecorder(RestClient(t), api=CORE_V1, qps=0, burst=1, host="me", wall=lambda: T0)
    recorder.start()
    try:
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        (post,) = t.sent("POST", "/api/v1/namespaces/ns/events")
        body = post.body
        name = body["metadata"]["name"]
        assert name.startswith("p.")
        assert body["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "ns",
            "name": "p",
            "uid": "uid-p",
        }
        assert (body["type"], body["reason"], body["message"], body["count"]) == (
            "Warning",
            "FailedScheduling",
            "no fit",
            1,
        )
        assert body["source"] == {"component": "koord-scheduler", "host": "me"}
        assert body["firstTimestamp"] == body["lastTimestamp"] == rfc3339(T0)

        t.on("PATCH", f"/api/v1/namespaces/ns/events/{name}", json_response({}))
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        patches = t.sent("PATCH", f"/api/v1/namespaces/ns/events/{name}")
        assert patches and patches[-1].body["count"] == 3
        assert patches[-1].headers["Content-Type"] == "application/merge-patch+json"
    finally:
        recorder.stop()


def test_recorder_recreates_an_event_that_expired() -> None:
    t = FakeTransport()
    t.on("POST", "/api/v1/namespaces/ns/events", json_response({}, 201))
    recorder = EventRecorder(RestClient(t), api=CORE_V1, qps=0, burst=1)
    recorder.start()
    try:
        recorder.record(pod(), "Normal", "Scheduled", "ok")
        assert recorder.flush()
        name = t.sent("POST", "/api/v1/namespaces/ns/events")[0].body["metadata"]["name"]
        t.on(
            "PATCH",
            f"/api/v1/namespaces/ns/events/{name}",
            status_response(404, "NotFound", "gone"),
        )
        recorder.record(pod(), "Normal", "Scheduled", "ok")
        assert recorder.flush()
        posts = t.sent("POST", "/api/v1/namespaces/ns/events")
        assert len(posts) == 2 and posts[1].body["count"] == 2
    finally:
        recorder.stop()


def test_recorder_survives_write_errors() -> None:
    t = FakeTransport()
    t.on("POST", "/api/v1/namespaces/ns/events", status_response(403, "Forbidden", "no"))
    recorder = EventRecorder(RestClient(t), api=CORE_V1, qps=0, burst=1)
    recorder.start()
    try:
        recorder.record(pod("a"), "Normal", "Scheduled", "ok")
        recorder.record(pod("b"), "Normal", "Scheduled", "ok")
        assert recorder.flush()
        assert recorder.errors == 2 and recorder.writes == 0
    finally:
        recorder.stop()


def test_recorder_is_rate_limited_and_folds_what_waits() -> None:
    t = FakeTransport()
    t.on("POST", "/api/v1/namespaces/ns/events", json_response({}, 201))
    recorder = EventRecorder(RestClient(t), api=CORE_V1, qps=5, burst=2)
    started = time.monotonic()
    for name in ("a", "b", "c", "d"):
        recorder.record(pod(name), "Warning", "FailedScheduling", "no fit")
    recorder.start()
    try:
        assert recorder.flush()
        # Two tokens at once, then 5/s: four writes take about 0.4 s.
        assert time.monotonic() - started >= 0.35
        assert len(t.sent("POST", "/api/v1/namespaces/ns/events")) == 4
    finally:
        recorder.stop()


@pytest.mark.parametrize("length", [10, 5000])
def test_long_messages_are_truncated(length: int) -> None:
    agg = aggregator(FakeClock())
    t = FakeTransport()
    recorder = EventRecorder(RestClient(t), api=CORE_V1, aggregator=agg)
    recorder.record(pod(), "Warning", "FailedScheduling", "x" * length)
    entry = agg.next_dirty()
    assert entry is not None and len(entry.key.message) == min(length, 1024)


def test_occurrences_waiting_for_a_token_fold_into_one_write() -> None:
    t = FakeTransport()
    t.on("POST", "/api/v1/namespaces/ns/events", json_response({}, 201))
    recorder = EventRecorder(RestClient(t), api=CORE_V1, qps=4, burst=1)
    recorder.start()
    try:
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        name = t.sent("POST", "/api/v1/namespaces/ns/events")[0].body["metadata"]["name"]
        t.on("PATCH", f"/api/v1/namespaces/ns/events/{name}", json_response({}))
        for _ in range(10):  # all within the quarter second the next token takes
            recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        patches = t.sent("PATCH", f"/api/v1/namespaces/ns/events/{name}")
        assert [p.body["count"] for p in patches] == [11]
    finally:
        recorder.stop()


def test_cap_evicts_a_written_entry_before_dropping_a_new_key() -> None:
    """A burst of distinct events (one Scheduled event per pod, 50,000 pods in minutes): once
    the cache is full, the oldest entry already written makes room — no new event is dropped
    while a clean one can go (kube's correlator is an LRU, it never drops for a full cache)."""
    agg = aggregator(FakeClock(), max_entries=2)
    agg.add(key("a"))
    written = agg.next_dirty()
    assert written is not None
    agg.written(written, 1, "a.1")
    agg.add(key("b"))
    agg.add(key("c"))
    assert agg.dropped == 0 and len(agg) == 2
    assert {e.key for e in (agg.next_dirty(), agg.next_dirty()) if e is not None} == {
        key("b"),
        key("c"),
    }


# -- events.k8s.io/v1 -------------------------------------------------------------------------

V1_BASE = "/apis/events.k8s.io/v1/namespaces/ns/events"


def test_discovery_picks_events_v1_and_writes_it_as_kube_scheduler_does() -> None:
    t = FakeTransport()
    t.on("GET", "/apis/events.k8s.io/v1", json_response({"kind": "APIResourceList"}))
    t.on("POST", V1_BASE, json_response({}, 201))
    recorder = EventRecorder(RestClient(t), qps=0, burst=1, host="me", wall=lambda: T0)
    recorder.start()
    try:
        recorder.record(pod(), "Normal", "Scheduled", "Successfully assigned ns/p to n1")
        recorder.record(pod("q"), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        assert recorder.api == EVENTS_V1
        assert not t.sent("POST", "/api/v1/namespaces/ns/events")
        scheduled, failed = (r.body for r in t.sent("POST", V1_BASE))
        assert scheduled["apiVersion"] == EVENTS_V1 and scheduled["kind"] == "Event"
        assert scheduled["regarding"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "ns",
            "name": "p",
            "uid": "uid-p",
        }
        assert (scheduled["type"], scheduled["reason"], scheduled["action"]) == (
            "Normal",
            "Scheduled",
            "Binding",
        )
        assert scheduled["note"] == "Successfully assigned ns/p to n1"
        assert scheduled["reportingController"] == "koord-scheduler"
        assert scheduled["reportingInstance"] == "koord-scheduler-me"
        assert scheduled["eventTime"] == micro_time(T0) and micro_time(T0).endswith(".000000Z")
        # The v1 validation refuses the core fields: none is sent, nor a one-count series.
        for absent in ("count", "source", "firstTimestamp", "lastTimestamp", "series"):
            assert absent not in scheduled
        assert failed["action"] == "Scheduling"
        assert len(t.sent("GET", "/apis/events.k8s.io/v1")) == 1  # discovered once
    finally:
        recorder.stop()


def test_a_repeat_patches_the_series() -> None:
    t = FakeTransport()
    t.on("GET", "/apis/events.k8s.io/v1", json_response({}))
    t.on("POST", V1_BASE, json_response({}, 201))
    recorder = EventRecorder(RestClient(t), qps=0, burst=1, wall=lambda: T0)
    recorder.start()
    try:
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        (post,) = t.sent("POST", V1_BASE)
        name = post.body["metadata"]["name"]
        t.on("PATCH", f"{V1_BASE}/{name}", json_response({}))
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        patch = t.sent("PATCH", f"{V1_BASE}/{name}")[-1]
        assert patch.body == {"series": {"count": 3, "lastObservedTime": micro_time(T0)}}
        assert patch.headers["Content-Type"] == "application/merge-patch+json"
    finally:
        recorder.stop()


def test_a_server_without_events_v1_gets_core_events() -> None:
    t = FakeTransport()
    t.on(
        "GET",
        "/apis/events.k8s.io/v1",
        status_response(404, "NotFound", "the server could not find the requested resource"),
    )
    t.on("POST", "/api/v1/namespaces/ns/events", json_response({}, 201))
    recorder = EventRecorder(RestClient(t), qps=0, burst=1)
    recorder.start()
    try:
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        assert recorder.api == CORE_V1
        (post,) = t.sent("POST", "/api/v1/namespaces/ns/events")
        assert post.body["involvedObject"]["name"] == "p" and post.body["count"] == 1
    finally:
        recorder.stop()


def test_a_failed_discovery_is_retried_and_loses_no_event() -> None:
    """The discovery GET fails (500): the write counts as failed, the entry stays, and the
    next occurrence discovers again and is written."""
    t = FakeTransport()
    t.on(
        "GET",
        "/apis/events.k8s.io/v1",
        status_response(500, "InternalError", "etcdserver: request timed out"),
        json_response({}),
    )
    t.on("POST", V1_BASE, json_response({}, 201))
    recorder = EventRecorder(RestClient(t), qps=0, burst=1)
    recorder.start()
    try:
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        assert recorder.api is None and recorder.errors == 1
        recorder.record(pod(), "Warning", "FailedScheduling", "no fit")
        assert recorder.flush()
        assert recorder.api == EVENTS_V1
        (post,) = t.sent("POST", V1_BASE)
        assert post.body["series"]["count"] == 2
    finally:
        recorder.stop()


@pytest.mark.parametrize(
    ("component", "controller"),
    [
        ("koord-scheduler", "koord-scheduler"),
        ("gpu.example.com", "gpu.example.com"),
        ("x" * 64, "koord-scheduler"),  # too long for a qualified name
        ("bad name", "koord-scheduler"),
    ],
)
def test_reporting_controller_is_always_a_qualified_name(component: str, controller: str) -> None:
    from scheduler.kube.events import reporting_controller

    assert reporting_controller(component) == controller


def test_an_unknown_api_is_refused() -> None:
    with pytest.raises(ValueError, match="api must be"):
        EventRecorder(RestClient(FakeTransport()), api="events.k8s.io/v1beta1")
