"""scheduler.kube.informer: list + watch against a fake at the HTTP boundary — decoding, resume
from the last resourceVersion, relist on 410 and on errors with synthesised deletes, subscribe
semantics, sync and health, stop."""

from __future__ import annotations

import dataclasses
import queue
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler.framework.events import Action, Change
from scheduler.kube.cluster import (
    CONFIGMAPS_PATH,
    POD_GROUPS_PATH,
    device_spec,
    node_spec,
    pod_group_spec,
    pod_spec,
    unhealthy_gpus_spec,
)
from scheduler.kube.informer import Informer, ResourceSpec
from scheduler.kube.ratelimit import Backoff
from scheduler.kube.rest import RestClient, TransportError
from tests.unit.kube.kube_fakes import (
    FakeStream,
    FakeTransport,
    event,
    object_list,
    status_response,
)

NODES = "/api/v1/nodes"


def node(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": labels},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


class Recorder:
    def __init__(self) -> None:
        self.q: queue.Queue[Change] = queue.Queue()

    def __call__(self, change: Change) -> None:
        self.q.put(change)

    def take(self, n: int, timeout: float = 5.0) -> list[tuple[str, str, str]]:
        """The next ``n`` changes as (action, name, resourceVersion of the newest state)."""
        out = []
        for _ in range(n):
            change = self.q.get(timeout=timeout)
            rec = change.new if change.new is not None else change.old
            out.append((change.action.name or "", rec.name, rec.resource_version))
        return out

    def empty_for(self, seconds: float) -> bool:
        try:
            change = self.q.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected change {change}")


@pytest.fixture
def transport() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
def make(transport: FakeTransport) -> Iterator[Callable[..., Informer]]:
    made: list[Informer] = []

    def factory(spec: ResourceSpec | None = None, **kw: Any) -> Informer:
        inf = Informer(
            RestClient(transport),
            spec or node_spec(),
            backoff=Backoff(0.01, 0.02, rng=random.Random(1)),
            watch_timeout=(5, 5),
            **kw,
        )
        made.append(inf)
        return inf

    yield factory
    for inf in made:
        inf.stop()


def wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def test_list_then_watch_delivers_decoded_changes(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on("GET", NODES, object_list([node("a", "5"), node("b", "6")], rv="7"))
    transport.on_watch(
        NODES,
        FakeStream(
            [
                event("MODIFIED", node("a", "8", zone="x")),
                event("ADDED", node("c", "9")),
                event("DELETED", node("b", "10")),
            ],
            end=False,
        ),
    )
    inf = make()
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    assert inf.wait_for_sync(5)
    assert rec.take(5) == [
        ("ADD", "a", "5"),
        ("ADD", "b", "6"),
        ("UPDATE", "a", "8"),
        ("ADD", "c", "9"),
        ("DELETE", "b", "6"),
    ]
    assert sorted(n.name for n in inf.items()) == ["a", "c"]
    assert inf.get("a").labels == {"zone": "x"}
    wait(lambda: inf.resource_version == "10")
    assert inf.healthy
    (watch,) = transport.watches
    assert watch.query["resourceVersion"] == "7"
    assert watch.query["watch"] == "1" and watch.query["allowWatchBookmarks"] == "true"


def test_list_is_paginated_and_uses_the_field_selector(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "3"}, "spec": {}}
    pod2 = {"metadata": {"name": "q", "namespace": "ns", "resourceVersion": "4"}, "spec": {}}
    transport.on(
        "GET",
        "/api/v1/pods",
        object_list([pod], rv="4", cont="next"),
        object_list([pod2], rv="4"),
    )
    inf = make(pod_spec(), page_size=1)
    inf.start()
    assert inf.wait_for_sync(5)
    first, second = transport.sent("GET", "/api/v1/pods")[:2]
    assert first.query["limit"] == "1" and "continue" not in first.query
    assert second.query["continue"] == "next"
    assert first.query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"
    assert sorted(p.key for p in inf.items()) == ["ns/p", "ns/q"]


def test_watch_end_resumes_from_the_last_resource_version(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on("GET", NODES, object_list([node("a", "5")], rv="5"))
    transport.on_watch(
        NODES,
        FakeStream([event("MODIFIED", node("a", "6"))]),  # the server's timeout ends it
        FakeStream([event("BOOKMARK", {"metadata": {"resourceVersion": "12"}})]),
    )
    inf = make()
    inf.start()
    wait(lambda: len(transport.watches) >= 3)
    assert [w.query["resourceVersion"] for w in transport.watches[:3]] == ["5", "6", "12"]
    assert len(transport.sent("GET", NODES)) == 1  # no relist


def test_relist_replaces_a_quiet_watch_with_a_fresh_list(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    """A new leader's catch-up gate asks for a relist when the watch proves nothing (a quiet
    watch never reaches a later resourceVersion): the open watch is closed, a list is made
    and delivered as changes, and the watch resumes from that list's version."""
    transport.on(
        "GET",
        NODES,
        object_list([node("a", "5")], rv="7"),
        object_list([node("a", "9"), node("b", "8")], rv="20"),
    )
    inf = make()
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    assert rec.take(1) == [("ADD", "a", "5")]
    wait(lambda: len(transport.open_streams) == 1)  # a quiet watch, open until closed
    assert (inf.lists_started, inf.list_delivered) == (1, 1)
    mark = inf.lists_started
    inf.relist()
    assert rec.take(2) == [("UPDATE", "a", "9"), ("ADD", "b", "8")]
    wait(lambda: len(transport.watches) == 2)
    assert transport.open_streams[0].closed.is_set()
    assert inf.resource_version == "20" and inf.list_delivered > mark
    assert transport.watches[1].query["resourceVersion"] == "20"


@pytest.mark.parametrize("how", ["error-event", "http-410"])
def test_gone_relists_and_synthesises_deletes(
    transport: FakeTransport, make: Callable[..., Informer], how: str
) -> None:
    transport.on(
        "GET",
        NODES,
        object_list([node("a", "5"), node("b", "6"), node("keep", "4")], rv="6"),
        object_list([node("a", "11"), node("c", "12"), node("keep", "4")], rv="12"),
    )
    if how == "error-event":
        gone = FakeStream([event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})])
    else:
        gone = FakeStream(status=410, body=status_response(410, "Gone", "too old").body)
    transport.on_watch(NODES, gone)
    inf = make()
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    assert rec.take(3) == [("ADD", "a", "5"), ("ADD", "b", "6"), ("ADD", "keep", "4")]
    assert rec.take(3) == [("DELETE", "b", "6"), ("UPDATE", "a", "11"), ("ADD", "c", "12")]
    assert rec.empty_for(0.05)  # "keep" did not change: no event
    assert inf.relists == 2


def test_errors_back_off_then_relist_and_health_tracks_them(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on(
        "GET",
        NODES,
        TransportError("connection refused"),
        TransportError("connection refused"),
        object_list([node("a", "5")], rv="5"),
    )
    transport.on_watch(NODES, FakeStream([], error=TransportError("reset")))
    inf = make()
    assert not inf.healthy and not inf.synced
    inf.start()
    assert inf.wait_for_sync(5)
    assert len(transport.sent("GET", NODES)) >= 3
    # The watch broke: relisted again (same object, same version: no new change).
    wait(lambda: len(transport.sent("GET", NODES)) >= 4)
    wait(lambda: inf.healthy)
    assert inf.synced


def test_health_goes_false_while_failing(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on("GET", NODES, object_list([], rv="1"), TransportError("refused"))
    transport.on_watch(NODES, TransportError("refused"))
    inf = make()
    inf.start()
    assert inf.wait_for_sync(5)
    wait(lambda: not inf.healthy)
    assert "refused" in inf.last_error
    assert inf.synced  # synced stays true


def test_subscribe_later_gets_the_state_then_the_changes(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on("GET", NODES, object_list([node("a", "5")], rv="5"))
    stream = FakeStream(end=False)
    transport.on_watch(NODES, stream)
    inf = make()
    inf.start()
    assert inf.wait_for_sync(5)
    rec = Recorder()
    inf.subscribe(rec)
    assert rec.take(1) == [("ADD", "a", "5")]
    inf.stop()
    assert stream.closed.is_set()
    assert not inf.alive


def test_undecodable_objects_are_counted_and_absent(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    bad_device = {"metadata": {"name": "n1", "resourceVersion": "2"}, "spec": {"devices": "x"}}
    good = {"metadata": {"name": "n2", "resourceVersion": "3"}, "spec": {"devices": []}}
    transport.on(
        "GET",
        "/apis/scheduling.koordinator.sh/v1alpha1/devices",
        object_list([bad_device, good], rv="3"),
    )
    transport.on_watch(
        "/apis/scheduling.koordinator.sh/v1alpha1/devices",
        FakeStream([event("MODIFIED", {**good, "spec": {"devices": 7}})], end=False),
    )
    inf = make(device_spec())
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    assert rec.take(1) == [("ADD", "n2", "3")]
    # An update that does not decode removes the object (a delete of its last good state).
    assert rec.take(1) == [("DELETE", "n2", "3")]
    assert inf.decode_errors == 2
    assert inf.items() == []


def test_changes_carry_old_and_new_records(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on("GET", NODES, object_list([node("a", "5")], rv="5"))
    transport.on_watch(NODES, FakeStream([event("MODIFIED", node("a", "6"))], end=False))
    inf = make()
    got: list[Change] = []
    inf.subscribe(got.append)
    inf.start()
    wait(lambda: len(got) == 2)
    assert got[1].action is Action.UPDATE
    assert got[1].old.resource_version == "5" and got[1].new.resource_version == "6"
    assert got[1].kind == "Node"


def test_a_missing_crd_is_named_in_the_error(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    path = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
    transport.on("GET", path, status_response(404, "NotFound", "the server could not find it"))
    required = dataclasses.replace(device_spec(), optional=False)  # a CRD the caller needs
    inf = make(required)
    inf.start()
    wait(lambda: "CRD" in inf.last_error)
    assert "kubectl apply -f config/crd/" in inf.last_error
    assert not inf.synced and not inf.healthy


def test_without_the_device_crd_the_informer_is_synced_empty_and_picks_it_up_later(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    """A gpushare cluster swapping only the extender has no Device CRD: the scheduler must
    still become ready (it serves nodes and pods), and find Device CRs once the CRD exists."""
    path = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
    device = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "n1", "resourceVersion": "5"},
        "spec": {"devices": []},
    }
    not_found = status_response(404, "NotFound", "the server could not find the requested resource")
    transport.on("GET", path, not_found)
    inf = make(device_spec(), absent_retry=0.05)
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    assert inf.wait_for_sync(5)  # while the CRD is absent
    assert inf.healthy and inf.items() == []
    transport.replace("GET", path, object_list([device], rv="5"))  # the CRD installed
    assert rec.take(1) == [("ADD", "n1", "5")]


def test_managed_fields_are_not_kept(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    """Server-side apply's bookkeeping is dropped at decode: nothing reads it, and every
    record keeps its raw object (memory at 50,000 pods)."""
    listed = node("a", "5")
    listed["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    transport.on("GET", NODES, object_list([listed], rv="7"))
    transport.on_watch(NODES, FakeStream([], end=False))
    inf = make()
    inf.start()
    assert inf.wait_for_sync(5)
    assert "managedFields" not in inf.get("a").raw["metadata"]


def pod_group(name: str, rv: str, min_member: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "team", "resourceVersion": rv},
        "spec": {"minMember": min_member},
    }


def test_an_optional_crd_not_installed_is_synced_healthy_and_empty(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    """No PodGroup CRD: the scheduler stays ready (gangs by annotation still work); the list is
    tried again later, and a CRD installed meanwhile is picked up."""
    transport.on(
        "GET",
        POD_GROUPS_PATH,
        status_response(404, "NotFound", "the server could not find the requested resource"),
        object_list([pod_group("job", "4")], rv="5"),
    )
    inf = make(pod_group_spec(), absent_retry=0.05)
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    assert inf.wait_for_sync(5)
    assert inf.healthy and inf.last_error == ""
    change = rec.q.get(timeout=5)  # installed later: the next list delivers it
    assert change.action is Action.ADD and change.new.id == "team/job"
    wait(lambda: not inf.absent)


def test_namespaced_objects_are_deleted_by_namespace_and_name(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    transport.on("GET", POD_GROUPS_PATH, object_list([pod_group("job", "4")], rv="5"))
    transport.on_watch(
        POD_GROUPS_PATH, FakeStream([event("DELETED", pod_group("job", "6"))], end=False)
    )
    inf = make(pod_group_spec())
    rec = Recorder()
    inf.subscribe(rec)
    inf.start()
    first, second = rec.q.get(timeout=5), rec.q.get(timeout=5)
    assert first.action is Action.ADD and second.action is Action.DELETE
    assert second.old.id == "team/job" and inf.items() == []


def test_unhealthy_gpu_configmaps_only_are_kept_and_delivered(
    transport: FakeTransport, make: Callable[..., Informer]
) -> None:
    """kube-system's other ConfigMaps (leader election, kube-proxy, ...) are neither decoded,
    stored nor delivered; ours come and go with their gpus list."""

    def cm(name: str, rv: str, gpus: str | None = None) -> dict[str, Any]:
        meta = {"name": name, "namespace": "kube-system", "resourceVersion": rv}
        return {"metadata": meta, "data": {"gpus": gpus} if gpus is not None else {}}

    transport.on(
        "GET",
        CONFIGMAPS_PATH,
        object_list([cm("kube-proxy", "3"), cm("unhealthy-gpu-a", "4", "0,2")], rv="5"),
    )
    transport.on_watch(
        CONFIGMAPS_PATH,
        FakeStream(
            [
                event("MODIFIED", cm("kube-proxy", "6")),
                event("ADDED", cm("unhealthy-gpu-b", "7", "1,x")),
                event("DELETED", cm("kube-proxy", "8")),
                event("DELETED", cm("unhealthy-gpu-a", "9", "0,2")),
            ],
            end=False,
        ),
    )
    inf = make(unhealthy_gpus_spec())
    got: queue.Queue[Change] = queue.Queue()
    inf.subscribe(got.put)
    inf.start()
    assert inf.wait_for_sync(5)
    changes = [got.get(timeout=5) for _ in range(3)]
    assert [(c.action, (c.new or c.old).node) for c in changes] == [
        (Action.ADD, "a"), (Action.ADD, "b"), (Action.DELETE, "a"),
    ]  # fmt: skip
    assert changes[0].new.minors == {0, 2}
    assert (changes[1].new.minors, changes[1].new.problems) == (
        {1}, ("gpus: 'x' is not a card index",)
    )  # fmt: skip
    assert got.empty() and inf.decode_errors == 0
    wait(lambda: inf.resource_version == "9")
    assert [u.key for u in inf.items()] == ["kube-system/unhealthy-gpu-b"]
