"""The scheduling loop on the in-memory cluster: cycles, binding failures, feedback, ties."""

from __future__ import annotations

import random

import pytest

from scheduler.config import SchedulerConfiguration, default_config, parse_config
from scheduler.core import Scheduler
from scheduler.framework.interfaces import BindError
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from tests.builders import make_node, make_pod

OURS = "koord-scheduler"
NO_VICTIMS_1 = (
    " preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
)


def _setup(
    nodes: int = 2, seed: int = 0, config: SchedulerConfiguration | None = None
) -> tuple[InMemoryCluster, Scheduler, SimulatedClock]:
    cluster = InMemoryCluster()
    for i in range(nodes):
        cluster.apply_node(make_node(f"n{i}").cpu("4").memory("8Gi").obj())
    clock = SimulatedClock()
    sched = Scheduler(
        config or default_config(),
        cluster,
        in_tree_registry(),
        default_plugins(),
        clock=clock,
        rng=random.Random(seed),
        bind_workers=1,
    )
    return cluster, sched, clock


def _requests(cluster: InMemoryCluster, sched: Scheduler, node: str) -> int:
    snap = sched.cache.snapshot
    return int(snap.requested("cpu")[snap.index[node]])


def test_pods_are_bound_and_spread_by_least_allocated() -> None:
    cluster, sched, _ = _setup(nodes=2)
    for i in range(4):
        cluster.apply_pod(make_pod(f"p{i}").req(cpu="1").scheduler(OURS).obj())
    sched.run_until_idle()
    sched.close()
    placed = sorted(p.node_name for p in cluster.pods.values())
    assert placed == ["n0", "n0", "n1", "n1"]
    assert cluster.binds == 4
    assert [e.reason for e in cluster.events] == ["Scheduled"] * 4
    assert any(
        e.message == "Successfully assigned default/p0 to n0"
        or e.message == "Successfully assigned default/p0 to n1"
        for e in cluster.events
    )


def test_pods_of_other_schedulers_are_ignored_but_counted() -> None:
    cluster, sched, _ = _setup(nodes=1)
    cluster.apply_pod(make_pod("theirs").req(cpu="3").obj())  # default-scheduler, pending
    cluster.apply_pod(make_pod("running").req(cpu="3").node("n0").obj())
    cluster.apply_pod(make_pod("ours").req(cpu="2").scheduler(OURS).obj())
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/theirs"].node_name == ""
    assert cluster.pods["default/ours"].node_name == ""
    assert sched.failures["default/ours"] == (
        "0/1 nodes are available: 1 Insufficient cpu." + NO_VICTIMS_1
    )


def test_unschedulable_pod_gets_event_and_condition_then_moves_on_node_add() -> None:
    cluster, sched, clock = _setup(nodes=1)
    cluster.apply_pod(make_pod("big").req(cpu="6").scheduler(OURS).obj())
    sched.run_until_idle()
    message = "0/1 nodes are available: 1 Insufficient cpu." + NO_VICTIMS_1
    assert [(e.reason, e.message) for e in cluster.events] == [("FailedScheduling", message)]
    sched.drain()
    conditions = cluster.pods["default/big"].raw["status"]["conditions"]
    assert conditions == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    assert sched.queue.pending_counts()["unschedulable"] == 1
    # Our own condition write must not requeue the pod; a new node must (after its backoff).
    clock.advance(5)
    sched.run_until_idle()
    assert sched.queue.pending_counts()["unschedulable"] == 1
    cluster.apply_node(make_node("big-node").cpu("8").memory("8Gi").obj())
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/big"].node_name == "big-node"


def test_bind_failure_releases_resources_and_retries_after_backoff() -> None:
    cluster, sched, clock = _setup(nodes=1)
    failures = iter([BindError("etcd timeout")])
    cluster.bind_hook = lambda pod, node: next(failures, None)
    cluster.apply_pod(make_pod("p").req(cpu="3").scheduler(OURS).obj())
    sched.run_until_idle()
    sched.wait_for_writes()
    assert cluster.pods["default/p"].node_name == ""
    assert _requests(cluster, sched, "n0") == 0  # assumed pod forgotten
    assert sched.queue.pending_counts()["backoff"] == 1
    assert sched.failures["default/p"] == "Binding rejected: etcd timeout"
    clock.advance(1.0)  # the first backoff is 1 s
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/p"].node_name == "n0"
    assert _requests(cluster, sched, "n0") == 3000


def test_bind_of_a_gone_pod_is_forgotten_without_retry() -> None:
    cluster, sched, clock = _setup(nodes=1)
    cluster.bind_hook = lambda pod, node: BindError("pods 'p' not found", gone=True)
    cluster.apply_pod(make_pod("p").req(cpu="3").scheduler(OURS).obj())
    sched.run_until_idle()
    clock.advance(60)
    sched.run_until_idle()
    sched.close()
    assert _requests(cluster, sched, "n0") == 0
    assert len(sched.queue) == 0


def test_terminal_pod_releases_its_resources() -> None:
    cluster, sched, _ = _setup(nodes=1)
    cluster.apply_pod(make_pod("done").req(cpu="3").node("n0").obj())
    sched.drain()
    assert _requests(cluster, sched, "n0") == 3000
    cluster.apply_pod(make_pod("done").req(cpu="3").node("n0").phase("Succeeded").obj())
    cluster.apply_pod(make_pod("next").req(cpu="3").scheduler(OURS).obj())
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/next"].node_name == "n0"


def test_higher_priority_is_scheduled_first() -> None:
    cluster, sched, _ = _setup(nodes=1)
    cluster.apply_pod(make_pod("low").req(cpu="3").scheduler(OURS).obj())
    cluster.apply_pod(make_pod("high").req(cpu="3").priority(100).scheduler(OURS).obj())
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/high"].node_name == "n0"
    assert cluster.pods["default/low"].node_name == ""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ties_are_broken_by_the_seeded_generator(seed: int) -> None:
    def run(seed: int) -> list[str]:
        cluster, sched, _ = _setup(nodes=8, seed=seed)
        for i in range(6):
            cluster.apply_pod(make_pod(f"p{i}").req(cpu="4").scheduler(OURS).obj())
        sched.run_until_idle()
        sched.close()
        return [cluster.pods[f"default/p{i}"].node_name for i in range(6)]

    assert run(seed) == run(seed)
    assert len({tuple(run(s)) for s in range(5)}) > 1


def test_percentage_of_nodes_to_score_samples_but_places_everything() -> None:
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "percentageOfNodesToScore": 10,
            "profiles": [{"schedulerName": OURS}],
        }
    )
    cluster, sched, _ = _setup(nodes=300, config=config)
    for i in range(300):
        cluster.apply_pod(make_pod(f"p{i}").req(cpu="4").scheduler(OURS).obj())
    sched.run_until_idle()
    sched.close()
    assert sorted(p.node_name for p in cluster.pods.values()) == sorted(f"n{i}" for i in range(300))


class GatePermit:
    """Permit that parks every pod (a gang plugin would allow them together)."""

    name = "Gate"

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def permit(self, state: object, pod: object, node_name: str) -> tuple[object, float]:
        from scheduler.framework.status import WAIT

        return WAIT, self.timeout


def _gated(timeout: float) -> tuple[InMemoryCluster, Scheduler, SimulatedClock]:
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [
                {"schedulerName": OURS, "plugins": {"permit": {"enabled": [{"name": "Gate"}]}}}
            ],
        }
    )
    registry = in_tree_registry() | {"Gate": lambda args, handle: GatePermit(timeout)}
    cluster = InMemoryCluster()
    cluster.apply_node(make_node("n0").cpu("4").memory("8Gi").obj())
    clock = SimulatedClock()
    sched = Scheduler(
        config,
        cluster,
        registry,
        default_plugins(),
        clock=clock,
        rng=random.Random(0),
        bind_workers=2,
    )
    return cluster, sched, clock


def test_a_waiting_pod_binds_once_its_permit_plugin_allows_it() -> None:
    cluster, sched, _ = _gated(timeout=30)
    cluster.apply_pod(make_pod("p").req(cpu="3").uid("uid-p").scheduler(OURS).obj())
    assert sched.schedule_one()
    waiting = sched.waiting_pods.get("uid-p")
    assert waiting is not None and waiting.pending_plugins == ["Gate"]
    assert _requests(cluster, sched, "n0") == 3000  # assumed while it waits
    waiting.allow("Gate")
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/p"].node_name == "n0"
    assert len(sched.waiting_pods) == 0


def test_a_waiting_pod_times_out_and_releases_its_resources() -> None:
    cluster, sched, _ = _gated(timeout=0.05)
    cluster.apply_pod(make_pod("p").req(cpu="3").scheduler(OURS).obj())
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert cluster.pods["default/p"].node_name == ""
    assert _requests(cluster, sched, "n0") == 0
    assert (
        sched.failures["default/p"] == "rejected due to timeout after waiting 0.05s at plugin Gate"
    )
    assert sched.queue.pending_counts()["unschedulable"] == 1


def test_call_soon_runs_on_the_scheduling_thread_between_cycles() -> None:
    _, sched, _ = _setup()
    ran: list[str] = []
    ok = sched.call_soon(lambda: ran.append("x") or sched.cache.node_count())
    failing = sched.call_soon(lambda: 1 // 0)
    assert not ok.done() and ran == []  # nothing runs until the scheduling thread drains
    sched.drain()
    assert ok.result(timeout=0) == 2 and ran == ["x"]
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=0)


def test_gpushare_pods_on_capacity_cards_wait_for_an_unhealthy_card_to_come_back() -> None:
    """Issue 27 items 1 and 3 in ``run`` mode: a node with gpushare's device plugin alone (no
    Device CR) takes gpushare pods on the cards of its capacity, never on a card the
    unhealthy-gpu ConfigMap names; deleting the ConfigMap moves the waiting pod back."""
    cluster, sched, clock = _setup(nodes=0)
    cluster.apply_node(make_node("g").cpu("8").memory("8Gi").gpushare(32, 2).obj())
    cm = {"metadata": {"name": "unhealthy-gpu-g", "namespace": "kube-system"},
          "data": {"gpus": "1"}}
    cluster.apply_unhealthy_gpus(cm)

    def gs(name: str, units: int) -> None:
        pod = make_pod(name).limit({"aliyun.com/gpu-mem": str(units)}).scheduler(OURS)
        cluster.apply_pod(pod.obj())

    gs("a", 10)
    gs("b", 10)
    sched.run_until_idle()
    sched.wait_for_writes()
    a, b = cluster.pods["default/a"], cluster.pods["default/b"]
    assert a.annotations["ALIYUN_COM_GPU_MEM_IDX"] == "0" and not b.node_name
    assert sched.failures["default/b"].startswith("0/1 nodes are available: 1 Insufficient gpu")
    cluster.delete_unhealthy_gpus("g")
    clock.advance(10)
    sched.run_until_idle()
    sched.close()
    assert cluster.pods["default/b"].annotations["ALIYUN_COM_GPU_MEM_IDX"] == "1"
