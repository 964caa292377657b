"""scheduler.kube against deep, huge and malformed objects (issue 45, finding 1).

A tenant's object whose ``metadata.managedFields[].fieldsV1`` nests 1,500 levels is served by
the API server; plain ``json.loads`` raised ``RecursionError`` on it, which escaped
``RestClient.request``, the watch decoder and the error-body reader, and the informer relisted
for ever. Here: every such answer decodes (managedFields dropped), an answer deeper than any Go
server serves is a ``TransportError``, and the informers of every kind keep the other objects
while an undecodable one is quarantined: logged once, counted, absent."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from apis.jsonload import MAX_DEPTH
from scheduler.kube.cluster import (
    CONFIGMAPS_PATH,
    DEVICES_PATH,
    NODES_PATH,
    PDB_PATHS,
    POD_GROUPS_PATH,
    PODS_PATH,
    device_spec,
    node_spec,
    pdb_spec,
    pod_group_spec,
    pod_spec,
    unhealthy_gpus_spec,
)
from scheduler.kube.informer import Informer, ResourceSpec
from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import ApiError, RestClient, TransportError, WatchStream
from scheduler.kube.transport import RawResponse
from scheduler.observability.metrics import SchedulerMetrics
from tests.deepjson import chain, deep_list_page, with_deep_managed_fields
from tests.unit.kube.kube_fakes import FakeStream, FakeTransport, object_list

DEEP = 1_500


def pod(name: str, rv: str = "5") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }


def deep_event(kind: str, obj: dict[str, Any], levels: int = DEEP) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (
        kind.encode(),
        with_deep_managed_fields(obj, levels).encode(),
    )


# -- RestClient and WatchStream -----------------------------------------------------------------


def test_a_list_page_holding_a_deep_object_decodes_without_its_managed_fields() -> None:
    t = FakeTransport()
    objects = [json.dumps(pod("a")), with_deep_managed_fields(pod("deep"), DEEP)]
    t.on("GET", PODS_PATH, RawResponse(200, deep_list_page(objects)))
    page = RestClient(t).request("GET", PODS_PATH)
    assert [o["metadata"]["name"] for o in page["items"]] == ["a", "deep"]
    assert "managedFields" not in page["items"][1]["metadata"]
    json.dumps(page)  # nothing deep is left


def test_a_single_deep_object_decodes_without_its_managed_fields() -> None:
    t = FakeTransport()
    t.on("GET", "/x", RawResponse(200, with_deep_managed_fields(pod("deep"), 9_990).encode()))
    doc = RestClient(t).request("GET", "/x")
    assert doc["metadata"]["name"] == "deep" and "managedFields" not in doc["metadata"]


def test_an_answer_deeper_than_any_go_server_serves_is_a_transport_error() -> None:
    t = FakeTransport()
    t.on("GET", "/x", RawResponse(200, chain(MAX_DEPTH + 1).encode()))
    with pytest.raises(TransportError, match=r"undecodable answer.*nested deeper"):
        RestClient(t).request("GET", "/x")


@pytest.mark.parametrize("body", [chain(DEEP).encode(), chain(MAX_DEPTH + 1).encode()])
def test_a_deep_error_body_is_an_api_error(body: bytes) -> None:
    t = FakeTransport()
    t.on("GET", "/x", RawResponse(500, body))
    with pytest.raises(ApiError) as exc:
        RestClient(t).request("GET", "/x")
    assert exc.value.status == 500 and exc.value.message.startswith('{"f:a":')


def test_a_watch_event_with_a_deep_object_decodes_without_its_managed_fields() -> None:
    events = list(WatchStream(FakeStream([deep_event("ADDED", pod("deep"))])))
    ((etype, obj),) = events
    assert etype == "ADDED" and obj["metadata"]["name"] == "deep"
    assert "managedFields" not in obj["metadata"]


def test_a_watch_event_deeper_than_any_go_server_serves_is_a_transport_error() -> None:
    with pytest.raises(TransportError, match=r"undecodable event.*nested deeper"):
        list(WatchStream(FakeStream([deep_event("ADDED", pod("deep"), MAX_DEPTH)])))


# -- informers of every kind --------------------------------------------------------------------


def node(name: str, rv: str = "5") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": {"allocatable": {}}}


def pdb(name: str, rv: str = "5") -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "team", "resourceVersion": rv},
        "spec": {"selector": {"matchLabels": {"app": name}}},
        "status": {"disruptionsAllowed": 1},
    }


def pod_group(name: str, rv: str = "5") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "team", "resourceVersion": rv},
        "spec": {"minMember": 2},
    }


def device(name: str, rv: str = "5") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"devices": []}}


def unhealthy(name: str, rv: str = "5") -> dict[str, Any]:
    meta = {"name": f"unhealthy-gpu-{name}", "namespace": "kube-system", "resourceVersion": rv}
    return {"metadata": meta, "data": {"gpus": "0"}}


# kind -> (its spec, its collection path, a valid object of it by name and resourceVersion)
KINDS: dict[str, tuple[Callable[[], ResourceSpec], str, Callable[..., dict[str, Any]]]] = {
    "Pod": (pod_spec, PODS_PATH, pod),
    "Node": (node_spec, NODES_PATH, node),
    "PodDisruptionBudget": (pdb_spec, PDB_PATHS[0], pdb),
    "PodGroup": (pod_group_spec, POD_GROUPS_PATH, pod_group),
    "Device": (device_spec, DEVICES_PATH, device),
    "UnhealthyGPUs": (unhealthy_gpus_spec, CONFIGMAPS_PATH, unhealthy),
}


def broken(obj: dict[str, Any]) -> dict[str, Any] | None:
    """``obj`` with a field its decoder refuses (each kind's own); None for gpushare's
    ConfigMaps, whose decoder takes any (a bad ``gpus`` entry is a listed problem)."""
    kind = obj.get("kind")
    if kind == "PodDisruptionBudget":
        return {**obj, "status": {"disruptionsAllowed": "many"}}
    if kind == "PodGroup":
        return {**obj, "spec": {"minMember": "two"}}
    if "data" in obj:
        return None
    if obj["metadata"].get("uid"):  # a pod
        return {**obj, "spec": {"containers": "c"}}
    if "status" in obj:  # a node
        return {**obj, "status": {"allocatable": {"cpu": "lots"}}}
    return {**obj, "spec": {"devices": "x"}}


@pytest.fixture
def informers() -> Iterator[Callable[[ResourceSpec, FakeTransport], Informer]]:
    made: list[Informer] = []

    def factory(spec: ResourceSpec, transport: FakeTransport) -> Informer:
        inf = Informer(
            RestClient(transport),
            spec,
            backoff=Backoff(0.01, 0.02, rng=random.Random(1)),
            watch_timeout=(5, 5),
        )
        made.append(inf)
        return inf

    yield factory
    for inf in made:
        inf.stop()


def names(inf: Informer) -> list[str]:
    return sorted(
        inf.spec.key(r).rsplit("/", 1)[-1].removeprefix("unhealthy-gpu-") for r in inf.items()
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_deep_and_one_undecodable_object_never_block_a_list_or_a_watch(
    kind: str, informers: Callable[[ResourceSpec, FakeTransport], Informer]
) -> None:
    make_spec, path, make = KINDS[kind]
    bad = broken(make("bad"))
    bad_again = broken(make("bad", "8"))
    t = FakeTransport()
    listed = [json.dumps(make("a")), with_deep_managed_fields(make("deep"), DEEP)]
    if bad is not None:
        listed.append(json.dumps(bad))
    t.on("GET", path, RawResponse(200, deep_list_page(listed, rv="6")))
    # the watch: another deep object, the bad one again (same reason), a deep update
    events = [deep_event("ADDED", make("deep2", "7"))]
    if bad_again is not None:
        events.append(b'{"type":"MODIFIED","object":%s}\n' % json.dumps(bad_again).encode())
    events.append(deep_event("MODIFIED", make("a", "9")))
    t.on_watch(path, FakeStream(events), FakeStream(end=False))
    inf = informers(make_spec(), t)
    with capture_logs() as logs:
        inf.start()
        assert inf.wait_for_sync(5)
        _wait(lambda: inf.resource_version == "9" and names(inf) == ["a", "deep", "deep2"])
        inf.relist()  # the same list again: the bad object is still quarantined
        _wait(lambda: inf.relists >= 2)
    assert inf.healthy and inf.last_error == ""
    assert not [e for e in logs if e["log_level"] == "error"]
    said = [e for e in logs if e["event"].startswith("object quarantined")]
    if bad is None:
        assert inf.decode_errors == 0 and inf.quarantined() == {} and not said
        return
    assert inf.decode_errors == 3  # list, watch, relist
    assert list(inf.quarantined()) == [_key(inf, "bad")]
    assert len(said) == 1  # once, not on every relist or event
    assert said[0]["resource"] == inf.kind and said[0]["object"] == _key(inf, "bad")
    assert said[0]["log_level"] == "warning" and said[0]["error"]


def scraped(metrics: SchedulerMetrics) -> dict[str, float]:
    """The Pod informer's two series as /metrics shows them."""
    text = metrics.exposition().decode()
    got = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("resource") != "Pod":
                continue
            if sample.name == "koord_scheduler_informer_decode_errors_total":
                got["errors"] = sample.value
            if sample.name == "koord_scheduler_informer_quarantined_objects":
                got["held"] = sample.value
    return got


def _key(inf: Informer, name: str) -> str:
    if inf.kind == "UnhealthyGPUs":
        return f"kube-system/unhealthy-gpu-{name}"
    if inf.kind in ("Node", "Device"):
        return name
    return f"team/{name}"


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def test_a_quarantined_object_leaves_quarantine_when_fixed_deleted_or_gone(
    informers: Callable[[ResourceSpec, FakeTransport], Informer],
) -> None:
    t = FakeTransport()
    bad = [json.dumps(broken(pod(n))) for n in ("fixed", "deleted", "gone")]
    t.on("GET", PODS_PATH, RawResponse(200, deep_list_page(bad, rv="6")))
    t.on_watch(
        PODS_PATH,
        FakeStream(
            [
                b'{"type":"MODIFIED","object":%s}\n' % json.dumps(pod("fixed", "7")).encode(),
                b'{"type":"DELETED","object":%s}\n'
                % json.dumps(broken(pod("deleted", "8"))).encode(),
            ]
        ),
        FakeStream(end=False),
    )
    inf = informers(pod_spec(), t)
    metrics = SchedulerMetrics()
    metrics.watch_informers(lambda: [inf])
    with capture_logs() as logs:
        inf.start()
        _wait(lambda: inf.resource_version == "8")
        assert set(inf.quarantined()) == {"team/gone"}
        assert names(inf) == ["fixed"]
        assert scraped(metrics) == {"errors": 3.0, "held": 1.0}
        t.replace("GET", PODS_PATH, object_list([pod("fixed", "7")], rv="9"))
        inf.relist()
        _wait(lambda: inf.resource_version == "9")
    assert inf.quarantined() == {}
    assert scraped(metrics) == {"errors": 3.0, "held": 0.0}
    released = sorted(e["object"] for e in logs if e["event"].startswith("object left quarantine"))
    assert released == ["team/deleted", "team/fixed", "team/gone"]
