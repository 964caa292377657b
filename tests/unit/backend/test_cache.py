"""Tests for scheduler.backend.cache: assume/confirm/forget (no expiry), UIDs, events, columns."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis.core import CPU, MEMORY, Node, Pod, decode_node, decode_pod
from scheduler.backend.cache import Cache, CacheError
from scheduler.framework.events import Change
from tests.fakes import FakeClock

GPU = "koordinator.sh/gpu"

# ---------------------------------------------------------------------------------------------
# helpers


def make_node(name: str, cpu: str = "8", memory: str = "32Gi", **extra: str) -> Node:
    alloc = {"cpu": cpu, "memory": memory, "pods": "110", **extra}
    return decode_node({"metadata": {"name": name}, "status": {"allocatable": alloc}})


def make_pod(
    name: str,
    node: str = "",
    cpu: str = "1",
    memory: str = "1Gi",
    phase: str = "Running",
    uid: str = "",
    **extra: str,
) -> Pod:
    requests = {k: v for k, v in {"cpu": cpu, "memory": memory, **extra}.items() if v}
    return decode_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "resources": {"requests": requests}}],
            },
            "status": {"phase": phase},
        }
    )


def on(pod: Pod, node: str) -> Pod:
    return dataclasses.replace(pod, node_name=node)


def requested(cache: Cache, node: str, resource: str = CPU) -> int:
    slot = cache.snapshot.index[node]
    return int(cache.snapshot.requested(resource)[slot])


def pod_count(cache: Cache, node: str) -> int:
    return int(cache.snapshot.pod_count[cache.snapshot.index[node]])


def new_cache(*nodes: str) -> tuple[Cache, FakeClock]:
    clock = FakeClock()
    cache = Cache(clock)
    for name in nodes:
        cache.add_node(make_node(name))
    return cache, clock


def assert_snapshot_matches(cache: Cache, nodes: dict[str, Node], pods: dict[str, Pod]) -> None:
    """Every snapshot column equals a from-scratch recomputation from ``nodes`` and ``pods``."""
    snap = cache.snapshot
    referenced = set(nodes) | {p.node_name for p in pods.values()}
    assert set(snap.index) == referenced
    assert sorted(info.name for info in snap.node_infos()) == sorted(nodes)
    resources = set(snap.resources()) | {r for p in pods.values() for r in p.requests}
    for name in referenced:
        slot = snap.index[name]
        on_node = [p for p in pods.values() if p.node_name == name]
        assert bool(snap.live[slot]) == (name in nodes)
        assert int(snap.pod_count[slot]) == len(on_node)
        counted = cache.snapshot.info(slot).pods.values()
        assert sorted(p.key for p in counted) == sorted(p.key for p in on_node)
        assert int(snap.non_zero_cpu[slot]) == sum(p.non_zero_request(CPU) for p in on_node)
        assert int(snap.non_zero_memory[slot]) == sum(p.non_zero_request(MEMORY) for p in on_node)
        alloc = nodes[name].allocatable if name in nodes else {}
        for r in resources:
            assert int(snap.requested(r)[slot]) == sum(p.requests.get(r, 0) for p in on_node), r
            assert int(snap.allocatable(r)[slot]) == alloc.get(r, 0), r
    free = [s for s in range(snap.size) if snap.infos[s] is None]
    for r in resources:
        assert not np.any(snap.requested(r)[free]), r
        assert not np.any(snap.allocatable(r)[free]), r
    assert cache.pod_count() == len(pods)
    assert cache.node_count() == len(nodes)


# ---------------------------------------------------------------------------------------------
# assume, confirm, forget


def test_assume_then_confirm_counts_once() -> None:
    cache, _ = new_cache("n1")
    pod = make_pod("a", cpu="2")
    cache.assume_pod(on(pod, "n1"))
    assert cache.is_assumed(pod)
    assert requested(cache, "n1") == 2000
    cache.finish_binding(on(pod, "n1"))
    bound = make_pod("a", node="n1", cpu="2")
    cache.apply(Change("Pod", pod, bound))  # the update that shows the binding
    assert not cache.is_assumed(pod)
    assert (requested(cache, "n1"), pod_count(cache, "n1")) == (2000, 1)
    assert cache.get_pod(pod) is bound
    assert_snapshot_matches(cache, {"n1": make_node("n1")}, {pod.key: bound})


def test_assume_then_forget_releases() -> None:
    cache, _ = new_cache("n1")
    pod = on(make_pod("a", cpu="2", **{GPU: "1"}), "n1")
    cache.assume_pod(pod)
    assert requested(cache, "n1", GPU) == 1
    assert cache.forget_pod(pod)
    assert (requested(cache, "n1"), requested(cache, "n1", GPU), pod_count(cache, "n1")) == (
        0,
        0,
        0,
    )
    assert not cache.is_assumed(pod) and cache.get_pod(pod) is None
    assert not cache.forget_pod(pod)  # nothing left to forget


def test_forget_after_confirmation_is_refused() -> None:
    cache, _ = new_cache("n1")
    pod = on(make_pod("a"), "n1")
    cache.assume_pod(pod)
    cache.add_pod(pod)
    assert not cache.forget_pod(pod)
    assert pod_count(cache, "n1") == 1


def test_assumed_on_a_confirmed_on_b_moves() -> None:
    cache, _ = new_cache("a", "b")
    pod = make_pod("p", cpu="3")
    cache.assume_pod(on(pod, "a"))
    cache.add_pod(on(pod, "b"))
    assert (requested(cache, "a"), pod_count(cache, "a")) == (0, 0)
    assert (requested(cache, "b"), pod_count(cache, "b")) == (3000, 1)
    assert [p.key for p in cache.pods_on("b")] == [pod.key] and cache.pods_on("a") == []
    assert not cache.is_assumed(pod)


@pytest.mark.parametrize(
    ("pod", "match"),
    [
        pytest.param(make_pod("x"), "no node name", id="unassigned"),
        pytest.param(make_pod("known", node="n1"), "already", id="known"),
    ],
)
def test_assume_errors(pod: Pod, match: str) -> None:
    cache, _ = new_cache("n1")
    cache.add_pod(make_pod("known", node="n1"))
    with pytest.raises(CacheError, match=match):
        cache.assume_pod(pod)


# ---------------------------------------------------------------------------------------------
# expiry


@pytest.mark.parametrize(
    "finish",
    [
        pytest.param(True, id="bind-succeeded-event-late"),
        pytest.param(False, id="bind-still-in-flight"),
    ],
)
def test_an_assumed_pod_never_expires(finish: bool) -> None:
    """kubernetes#106361: only the bind outcome or the informer ends an assumption."""
    cache, clock = new_cache("n1")
    pod = on(make_pod("a", cpu="2"), "n1")
    cache.assume_pod(pod)
    if finish:
        cache.finish_binding(pod)
    clock.advance(10_000)
    assert cache.is_assumed(pod)
    assert cache.assumed_pods() == [pod]
    assert requested(cache, "n1") == 2000
    cache.add_pod(pod)  # the add event, however late, confirms it: counted once
    assert not cache.is_assumed(pod) and pod_count(cache, "n1") == 1


def test_an_assumed_pod_leaves_with_its_delete_event() -> None:
    cache, _ = new_cache("n1")
    pod = on(make_pod("a", cpu="2"), "n1")
    cache.assume_pod(pod)
    cache.finish_binding(pod)
    cache.apply(Change("Pod", pod, None))
    assert not cache.is_assumed(pod) and requested(cache, "n1") == 0


# ---------------------------------------------------------------------------------------------
# identity is the UID


def test_a_recreated_pod_is_another_pod() -> None:
    """uid-1 is assumed on n1 (its bind in flight); the pod is deleted and re-created under
    the same name (uid-2) and assumed on n2. Both count until uid-1's bind outcome; forgetting
    uid-1 never touches uid-2."""
    cache, _ = new_cache("n1", "n2")
    old = on(make_pod("a", cpu="2", uid="uid-1"), "n1")
    new = on(make_pod("a", cpu="3", uid="uid-2"), "n2")
    cache.assume_pod(old)
    assert cache.get_pod(make_pod("a", uid="uid-2")) is None  # not "already assumed"
    cache.assume_pod(new)
    assert (requested(cache, "n1"), requested(cache, "n2")) == (2000, 3000)
    assert cache.forget_pod(old)
    assert not cache.forget_pod(dataclasses.replace(old, node_name="n2"))  # uid-1 is gone
    assert cache.is_assumed(new) and (requested(cache, "n1"), requested(cache, "n2")) == (0, 3000)


def test_a_recreated_pod_on_the_same_node_counts_apart() -> None:
    cache, _ = new_cache("n1")
    old = on(make_pod("a", cpu="2", uid="uid-1"), "n1")
    new = on(make_pod("a", cpu="3", uid="uid-2"), "n1")
    cache.assume_pod(old)
    cache.assume_pod(new)
    assert (requested(cache, "n1"), pod_count(cache, "n1")) == (5000, 2)
    cache.remove_pod(old)  # uid-1's delete event
    assert (requested(cache, "n1"), pod_count(cache, "n1")) == (3000, 1)
    assert cache.get_pod(new) is new


# ---------------------------------------------------------------------------------------------
# events


@pytest.mark.parametrize(
    ("old", "new", "expected_cpu", "expected_pods"),
    [
        pytest.param(None, make_pod("a", "n1"), 1000, 1, id="add-assigned"),
        pytest.param(None, make_pod("a"), 0, 0, id="add-unassigned-ignored"),
        pytest.param(None, make_pod("a", "n1", phase="Succeeded"), 0, 0, id="add-terminal"),
        pytest.param(make_pod("a"), make_pod("a", "n1"), 1000, 1, id="bound-by-update"),
        pytest.param(
            make_pod("a", "n1"), make_pod("a", "n1", cpu="3"), 3000, 1, id="update-resized"
        ),
        pytest.param(
            make_pod("a", "n1"), make_pod("a", "n1", phase="Succeeded"), 0, 0, id="succeeded"
        ),
        pytest.param(make_pod("a", "n1"), make_pod("a", "n1", phase="Failed"), 0, 0, id="failed"),
        pytest.param(make_pod("a", "n1"), None, 0, 0, id="deleted"),
        pytest.param(
            make_pod("a", "n1"),
            make_pod("a", "n1", cpu="2", uid="other"),
            2000,
            1,
            id="recreated-new-uid",
        ),
    ],
)
def test_pod_events(
    old: Pod | None, new: Pod | None, expected_cpu: int, expected_pods: int
) -> None:
    cache, _ = new_cache("n1")
    if old is not None:
        cache.add_pod(old)
    cache.apply(Change("Pod", old, new))
    assert (requested(cache, "n1"), pod_count(cache, "n1")) == (expected_cpu, expected_pods)
    assert cache.pod_count() == expected_pods


def test_second_add_replaces_without_double_counting() -> None:
    cache, _ = new_cache("n1")
    cache.add_pod(make_pod("a", "n1"))
    cache.add_pod(make_pod("a", "n1", cpu="2"))
    assert (requested(cache, "n1"), pod_count(cache, "n1")) == (2000, 1)


def test_unassigned_update_leaves_assumed_pod_alone() -> None:
    cache, _ = new_cache("n1")
    pending = make_pod("a")
    cache.assume_pod(on(pending, "n1"))
    meta = {**pending.raw["metadata"], "labels": {"x": "y"}}
    relabelled = decode_pod({**pending.raw, "metadata": meta})
    cache.update_pod(pending, relabelled)
    assert cache.is_assumed(pending) and pod_count(cache, "n1") == 1


def test_delete_of_assumed_pod_releases_it() -> None:
    cache, _ = new_cache("n1")
    pending = make_pod("a")
    cache.assume_pod(on(pending, "n1"))
    cache.apply(Change("Pod", pending, None))  # the pod was deleted before the bind landed
    assert not cache.is_assumed(pending) and pod_count(cache, "n1") == 0
    cache.remove_pod(pending)  # a second delete is harmless


@pytest.mark.parametrize(
    ("change", "nodes"),
    [
        pytest.param(Change("Node", None, make_node("n2")), ["n1", "n2"], id="node-add"),
        pytest.param(Change("Node", make_node("n1"), None), [], id="node-delete"),
        pytest.param(
            Change("Node", make_node("n1"), make_node("n1", cpu="4")), ["n1"], id="node-update"
        ),
        pytest.param(Change("Device", None, object()), ["n1"], id="device-ignored"),
        pytest.param(Change("Other", None, object()), ["n1"], id="unknown-kind-ignored"),
    ],
)
def test_node_changes(change: Change, nodes: list[str]) -> None:
    cache, _ = new_cache("n1")
    cache.apply(change)
    assert sorted(info.name for info in cache.snapshot.node_infos()) == nodes
    if change.kind == "Node" and change.new is not None:
        assert cache.snapshot.get(change.new.name).node is change.new  # type: ignore[union-attr]


def test_node_removal_keeps_imaginary_node_until_pods_go() -> None:
    cache, _ = new_cache("n1", "n2")
    slot = cache.snapshot.index["n1"]
    a, b = make_pod("a", "n1"), make_pod("b", "n1", cpu="2")
    cache.add_pod(a)
    cache.add_pod(b)
    cache.remove_node(make_node("n1"))
    assert cache.node_count() == 1
    assert cache.snapshot.get("n1") is None
    assert cache.snapshot.index["n1"] == slot and not cache.snapshot.live[slot]
    assert requested(cache, "n1") == 3000
    assert int(cache.snapshot.allocatable(CPU)[slot]) == 0
    assert {p.name for p in cache.pods_on("n1")} == {"a", "b"}
    cache.remove_pod(a)
    assert cache.snapshot.index["n1"] == slot
    cache.remove_pod(b)
    assert "n1" not in cache.snapshot.index
    assert cache.pods_on("n1") == []
    cache.add_node(make_node("n3"))
    assert cache.snapshot.index["n3"] == slot  # the slot is reused


def test_node_comes_back_while_its_pods_remain() -> None:
    cache, _ = new_cache("n1")
    slot = cache.snapshot.index["n1"]
    cache.add_pod(make_pod("a", "n1"))
    cache.remove_node(make_node("n1"))
    cache.add_node(make_node("n1", cpu="16"))
    assert cache.snapshot.index["n1"] == slot and cache.snapshot.live[slot]
    assert (requested(cache, "n1"), int(cache.snapshot.allocatable(CPU)[slot])) == (1000, 16000)


def test_pod_before_its_node() -> None:
    cache, _ = new_cache()
    cache.add_pod(make_pod("a", "late"))
    assert cache.node_count() == 0 and requested(cache, "late") == 1000
    cache.add_node(make_node("late"))
    assert cache.node_count() == 1 and requested(cache, "late") == 1000


def test_dump() -> None:
    cache, _ = new_cache("n1")
    cache.add_pod(make_pod("a", "n1"))
    cache.assume_pod(make_pod("b", "n1"))
    dump = cache.dump()
    assert dump["pods"] == 2
    assert dump["nodes"][0]["name"] == "n1" and dump["nodes"][0]["pods"] == ["ns/a", "ns/b"]
    assert dump["assumed"] == {"ns/b": {"uid": "uid-b", "node": "n1", "binding_finished": False}}


# ---------------------------------------------------------------------------------------------
# random operation sequences: the snapshot equals a recomputation from scratch

NODES = ["n0", "n1", "n2", "n3"]
_ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "add_node",
                "update_node",
                "remove_node",
                "add_pod",
                "update_pod",
                "terminate_pod",
                "remove_pod",
                "assume",
                "finish_binding",
                "forget",
                "confirm",
                "tick",
            ]
        ),
        st.integers(0, len(NODES) - 1),
        st.integers(0, 7),
        st.integers(0, 4),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_snapshot_equals_recomputation(ops: list[tuple[str, int, int, int]]) -> None:
    cache, clock = new_cache()
    nodes: dict[str, Node] = {}
    pods: dict[str, Pod] = {}  # what the cache should count: key -> record with node
    assumed: dict[str, bool] = {}  # key -> binding finished

    def pod(i: int, node: str, size: int) -> Pod:
        extra: dict[str, Any] = {GPU: str(size)} if size % 2 else {}
        return make_pod(f"p{i}", node, cpu=f"{size * 250}m", memory="" if size else "1Mi", **extra)

    for op, n, i, size in ops:
        node, key = NODES[n], f"ns/p{i}"
        if op in ("add_node", "update_node"):
            new_node = make_node(node, cpu=str(4 + size), **({GPU: "4"} if size % 2 else {}))
            cache.apply(Change("Node", nodes.get(node), new_node))
            nodes[node] = new_node
        elif op == "remove_node" and node in nodes:
            cache.apply(Change("Node", nodes.pop(node), None))
        elif op in ("add_pod", "update_pod"):
            new = pod(i, node, size)
            cache.apply(Change("Pod", pods.get(key), new))
            pods[key] = new
            assumed.pop(key, None)
        elif op == "terminate_pod" and key in pods:
            old = pods.pop(key)
            cache.update_pod(old, dataclasses.replace(old, phase="Succeeded"))
            assumed.pop(key, None)
        elif op == "remove_pod":
            cache.remove_pod(make_pod(f"p{i}"))
            pods.pop(key, None)
            assumed.pop(key, None)
        elif op == "assume" and key not in pods:
            pods[key] = pod(i, node, size)
            cache.assume_pod(pods[key])
            assumed[key] = False
        elif op == "finish_binding" and key in assumed:
            cache.finish_binding(pods[key])
            assumed[key] = True
        elif op == "forget":
            assert cache.forget_pod(make_pod(f"p{i}")) == (key in assumed)
            if assumed.pop(key, "absent") != "absent":
                del pods[key]
        elif op == "confirm" and key in assumed:
            new = pod(i, node, size)  # maybe on another node than assumed
            cache.add_pod(new)
            pods[key] = new
            del assumed[key]
        elif op == "tick":
            clock.advance(size * 30)  # time alone never ends an assumption
        assert {k for k, p in pods.items() if cache.is_assumed(p)} == set(assumed)
        assert_snapshot_matches(cache, nodes, pods)
