"""The extender's verbs answered by the scheduler's own core (in-memory cluster)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from scheduler.devices import ledger_of
from scheduler.extender.engine import NotLeader
from scheduler.extender.protocol import BindingArgs, PreemptionArgs
from tests.adversarial_cluster import AdversarialCluster
from tests.builders import PodBuilder, make_pod
from tests.unit.extender.harness import PROFILE, gpu_cluster, running

GI = 1 << 30


def gs_pod(name: str, units: int) -> PodBuilder:
    """A gpushare pod as gpushare users write it: limits only, default scheduler."""
    return make_pod(name).req(cpu="100m").limit({"aliyun.com/gpu-mem": str(units)})


def koord_pod(name: str, percent: int) -> PodBuilder:
    return make_pod(name).req(
        cpu="100m",
        **{
            "koordinator.sh/gpu-core": str(percent),
            "koordinator.sh/gpu-memory-ratio": str(percent),
        },
    )


def bind_args(r: Any, name: str, node: str) -> BindingArgs:
    pod = r.cluster.pods[f"default/{name}"]
    return BindingArgs(pod.namespace, pod.name, pod.uid, node)


def card_use(r: Any) -> dict[tuple[str, int], int]:
    """GPU memory held per (node, minor), from the bound pods' annotations."""
    used: dict[tuple[str, int], int] = {}
    for pod in r.cluster.pods.values():
        text = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if not pod.node_name or not text:
            continue
        for alloc in json.loads(text)["gpu"]:
            key = (pod.node_name, alloc["minor"])
            mem = alloc["resources"]["koordinator.sh/gpu-memory"]
            used[key] = used.get(key, 0) + _bytes(mem)
    return used


def _bytes(q: str) -> int:
    from apis.quantity import Quantity, int_value

    return int_value(Quantity.parse(q))


def test_filter_keeps_nodes_with_a_card_that_fits_and_says_why_others_fail() -> None:
    cluster = gpu_cluster({"big": ["16Gi", "16Gi"], "small": ["4Gi"]})
    with running(cluster) as r:
        pod = cluster.apply_pod(gs_pod("p", 8).obj())
        result = r.engine.filter(pod, ["big", "small", "ghost"])
    assert result.node_names == ["big"]
    assert set(result.failed) == {"small"}
    assert result.failed["small"]
    assert set(result.unresolvable) == {"ghost"}
    assert not result.error


def test_bind_chooses_cards_on_kube_schedulers_node_and_writes_both_annotations() -> None:
    cluster = gpu_cluster({"n": ["16Gi", "16Gi"]})
    with running(cluster) as r:
        cluster.apply_pod(gs_pod("p", 6).obj())
        assert r.engine.bind(bind_args(r, "p", "n")) == ""
    pod = cluster.pods["default/p"]
    assert pod.node_name == "n"
    assert pod.annotations["ALIYUN_COM_GPU_MEM_POD"] == "6"
    assert pod.annotations["ALIYUN_COM_GPU_MEM_DEV"] == "16"
    assert pod.annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    idx = int(pod.annotations["ALIYUN_COM_GPU_MEM_IDX"])
    assert card_use(r) == {("n", idx): 6 * GI}


def test_a_burst_of_binds_to_one_node_never_over_commits_a_card() -> None:
    cluster = gpu_cluster({"n": ["16Gi", "16Gi"]})
    names = [f"p{i}" for i in range(40)]
    with running(cluster) as r:
        for name in names:
            cluster.apply_pod(gs_pod(name, 5).obj())
        args = [bind_args(r, name, "n") for name in names]
        with ThreadPoolExecutor(16) as pool:
            errors = list(pool.map(r.engine.bind, args))
        bound = [e for e in errors if e == ""]
        assert len(bound) == 6  # three 5 GiB pods per 16 GiB card
        assert all("failed (unschedulable)" in e for e in errors if e)
        assert all(used <= 16 * GI for used in card_use(r).values())
        assert sum(1 for p in cluster.pods.values() if p.node_name) == 6


def test_a_pod_re_created_under_the_same_name_is_not_bound_by_the_old_uid() -> None:
    cluster = gpu_cluster({"n": ["16Gi"]})
    with running(cluster) as r:
        cluster.apply_pod(gs_pod("p", 2).uid("old").obj())
        old = bind_args(r, "p", "n")
        cluster.delete_pod("default/p")
        cluster.apply_pod(gs_pod("p", 2).uid("new").obj())
        error = r.engine.bind(old)
    assert "re-created" in error or "not found" in error
    assert cluster.pods["default/p"].node_name == ""


RECREATED = "pod default/p was re-created (uid new, not old): not bound"
GONE = "pod default/p (uid old) no longer exists: not bound"


@pytest.mark.parametrize(
    ("successor", "informer_lags", "error"),
    [
        pytest.param(True, False, RECREATED, id="re-created-informer-saw-it"),
        pytest.param(True, True, RECREATED, id="re-created-informer-lags"),
        pytest.param(False, True, GONE, id="deleted-informer-lags"),
    ],
)
def test_a_bind_for_a_filtered_uid_deleted_since_is_refused(
    successor: bool, informer_lags: bool, error: str
) -> None:
    """kube-scheduler filtered ``p`` (uid old); it was deleted (and re-created: uid new)
    before the bind came. The bind names the old UID: binding it would land on the successor
    (a v1.20 API server binds by name) and hold the old reservation for good. Refused, with
    no write and no ledger change, whether or not our informer has seen the delete."""
    truth = gpu_cluster({"n": ["16Gi"]})
    port = AdversarialCluster(truth)
    port.ignore_binding_uid = True
    with running(truth, port=port) as r:
        old = truth.apply_pod(koord_pod("p", 50).uid("old").obj())
        port.deliver_all()
        assert r.engine.filter(old, ["n"]).node_names == ["n"]
        truth.delete_pod("default/p")
        if successor:
            truth.apply_pod(koord_pod("p", 50).uid("new").obj())
        if not informer_lags:
            port.deliver_all()
        ledger = ledger_of(r.sched.profiles[PROFILE].handle)
        before = r.sched.call_soon(ledger.snapshot_state).result(10)
        answer = r.engine.bind(BindingArgs("default", "p", "old", "n"))
        after = r.sched.call_soon(ledger.snapshot_state).result(10)
    assert answer == error
    assert port.bind_calls == 0
    assert all(not p.node_name for p in truth.pods.values())
    assert after == before

def test_bind_of_a_pod_already_bound_answers_an_error_without_a_write() -> None:
    cluster = gpu_cluster({"n": ["16Gi"]})
    with running(cluster) as r:
        cluster.apply_pod(gs_pod("p", 2).obj())
        args = bind_args(r, "p", "n")
        assert r.engine.bind(args) == ""
        binds = cluster.binds
        assert "already" in r.engine.bind(args)
    assert cluster.binds == binds


def test_a_failed_bind_releases_its_cards() -> None:
    from scheduler.framework.interfaces import BindError

    cluster = gpu_cluster({"n": ["16Gi"]})
    with running(cluster) as r:
        cluster.apply_pod(gs_pod("a", 10).obj())
        cluster.apply_pod(gs_pod("b", 10).obj())
        cluster.bind_hook = lambda pod, node: BindError("injected: API down")
        assert "injected" in r.engine.bind(bind_args(r, "a", "n"))
        cluster.bind_hook = None
        assert r.engine.bind(bind_args(r, "b", "n")) == ""  # a's 10 GiB were released


def test_a_standby_answers_not_leader_for_every_verb() -> None:
    cluster = gpu_cluster({"n": ["16Gi"]})
    with running(cluster) as r:
        pod = cluster.apply_pod(gs_pod("p", 2).obj())
        r.leading[0] = False
        with pytest.raises(NotLeader):
            r.engine.filter(pod, ["n"])
        with pytest.raises(NotLeader):
            r.engine.bind(bind_args(r, "p", "n"))
        with pytest.raises(NotLeader):
            r.engine.prioritize(pod, ["n"])
    assert cluster.binds == 0


def test_binpack_puts_a_gpushare_pod_on_the_fullest_card_that_fits() -> None:
    # gpushare's rule: the card with the least free memory that still fits, per card.
    cluster = gpu_cluster({"n": ["40Gi", "16Gi", "24Gi"]})
    with running(cluster, scoring="MostAllocated") as r:
        cluster.apply_pod(gs_pod("first", 12).obj())
        assert r.engine.bind(bind_args(r, "first", "n")) == ""
        first = int(cluster.pods["default/first"].annotations["ALIYUN_COM_GPU_MEM_IDX"])
        cluster.apply_pod(gs_pod("second", 4).obj())
        assert r.engine.bind(bind_args(r, "second", "n")) == ""
        second = int(cluster.pods["default/second"].annotations["ALIYUN_COM_GPU_MEM_IDX"])
    assert first == 1  # 16 GiB card: 4 GiB left, the least that fits 12
    assert second == 1  # 4 GiB free on card 1: exactly fits, the least free


def test_prioritize_ranks_nodes_by_the_profiles_device_score() -> None:
    cluster = gpu_cluster({"empty": ["16Gi"], "used": ["16Gi"]})
    with running(cluster, scoring="MostAllocated") as r:
        cluster.apply_pod(koord_pod("filler", 50).obj())
        assert r.engine.bind(bind_args(r, "filler", "used")) == ""
        pod = cluster.apply_pod(koord_pod("p", 25).obj())
        scores = dict(r.engine.prioritize(pod, ["empty", "used"]))
    assert scores["used"] == 10
    assert 0 <= scores["empty"] < scores["used"]


def test_preempt_keeps_only_nodes_where_the_victims_free_the_device() -> None:
    cluster = gpu_cluster({"a": ["16Gi"], "b": ["16Gi"]})
    with running(cluster) as r:
        for name, node in (("va", "a"), ("vb", "b")):
            cluster.apply_pod(koord_pod(name, 100).obj())
            assert r.engine.bind(bind_args(r, name, node)) == ""
        cpu_only = cluster.apply_pod(make_pod("cpu").req(cpu="1").node("b").obj())
        pod = cluster.apply_pod(koord_pod("hi", 100).priority(100).obj())
        va = cluster.pods["default/va"].uid
        args = PreemptionArgs(pod, {"a": ((va,), 0), "b": ((cpu_only.uid,), 0)}, meta=True)
        kept = r.engine.preempt(args)
    assert kept == {"a": ((va,), 0)}


def test_binpack_compares_free_memory_not_the_profiles_card_score() -> None:
    # Card 0 holds a pod gpushare placed (10 GiB, no cores); card 1 a koordinator pod (50 %
    # of the card: cores, ratio and 8 GiB). MostAllocated prefers card 1 (more of it is used);
    # gpushare's rule takes card 0: 6 GiB free, the least that fits 6.
    cluster = gpu_cluster({"n": ["16Gi", "16Gi"]})
    with running(cluster, scoring="MostAllocated") as r:
        old = gs_pod("old", 10).node("n").annotation("ALIYUN_COM_GPU_MEM_IDX", "0")
        cluster.apply_pod(old.annotation("ALIYUN_COM_GPU_MEM_POD", "10").obj())
        cluster.apply_pod(koord_pod("half", 50).obj())
        assert r.engine.bind(bind_args(r, "half", "n")) == ""
        cluster.apply_pod(gs_pod("six", 6).obj())
        assert r.engine.bind(bind_args(r, "six", "n")) == ""
    assert cluster.pods["default/six"].annotations["ALIYUN_COM_GPU_MEM_IDX"] == "0"


def gpu_minors(r: Any, name: str) -> list[int]:
    text = r.cluster.pods[f"default/{name}"].annotations[ANNOTATION_DEVICE_ALLOCATED]
    return [alloc["minor"] for alloc in json.loads(text)["gpu"]]



@pytest.mark.parametrize(
    ("cleared", "thief_card"),
    [pytest.param(False, 0, id="nominated"), pytest.param(True, 1, id="nomination-cleared")],
)
def test_a_bind_keeps_the_card_of_a_pod_kube_scheduler_nominated_there(
    cleared: bool, thief_card: int
) -> None:
    """kube-scheduler preempted for ``high`` and nominated it to n (its status says so; the
    victims are gone). ``thief``, as important, fits on card 0 beside ``keeper``: its bind
    must not take card 1, the whole card kept for ``high`` — kube-scheduler's pods are not
    ours by schedulerName, yet their nominations count, until kube-scheduler clears them."""
    cluster = gpu_cluster({"n": ["16Gi", "16Gi"]})
    with running(cluster) as r:
        cluster.apply_pod(koord_pod("keeper", 50).priority(10).obj())
        assert r.engine.bind(bind_args(r, "keeper", "n")) == ""
        assert gpu_minors(r, "keeper") == [0]
        high = cluster.apply_pod(koord_pod("high", 100).priority(10).nominated("n").obj())
        if cleared:
            cluster.set_nominated_node(high, "")
        cluster.apply_pod(koord_pod("thief", 50).priority(10).obj())
        assert r.engine.bind(bind_args(r, "thief", "n")) == ""
        assert gpu_minors(r, "thief") == [thief_card]
        if not cleared:
            assert r.engine.bind(bind_args(r, "high", "n")) == ""
            assert gpu_minors(r, "high") == [1]
