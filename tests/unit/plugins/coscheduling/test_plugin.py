"""Coscheduling on the in-memory cluster: gangs bind together, or not at all."""

from __future__ import annotations

import random

import pytest

from scheduler.config import parse_config
from scheduler.core import Scheduler
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from tests.builders import make_node, make_pod
from tests.fakes import ManualExecutor

OURS = "koord-scheduler"
G = "gang.scheduling.koordinator.sh"


def _setup(cpu: str = "8") -> tuple[InMemoryCluster, Scheduler, SimulatedClock]:
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [
                {
                    "schedulerName": OURS,
                    "plugins": {
                        "queueSort": {
                            "enabled": [{"name": "Coscheduling"}],
                            "disabled": [{"name": "*"}],
                        },
                        "preFilter": {"enabled": [{"name": "Coscheduling"}]},
                        "reserve": {"enabled": [{"name": "Coscheduling"}]},
                        "permit": {"enabled": [{"name": "Coscheduling"}]},
                    },
                }
            ],
        }
    )
    cluster = InMemoryCluster()
    cluster.apply_node(make_node("n0").cpu(cpu).memory("64Gi").obj())
    clock = SimulatedClock()
    sched = Scheduler(
        config,
        cluster,
        in_tree_registry(),
        default_plugins(),
        clock=clock,
        rng=random.Random(0),
        bind_workers=4,
    )
    return cluster, sched, clock


def _member(
    name: str, gang: str, min_available: int, *, uid: str = "", **extra: str
) -> dict[str, object]:
    b = (
        make_pod(name)
        .req(cpu="2")
        .uid(uid or f"uid-{name}")
        .scheduler(OURS)
        .annotation(f"{G}/name", gang)
        .annotation(f"{G}/min-available", str(min_available))
    )
    for key, value in extra.items():
        b = b.annotation(f"{G}/{key.replace('_', '-')}", value)
    return b.obj()


def _bound(cluster: InMemoryCluster) -> list[str]:
    return sorted(p.name for p in cluster.pods.values() if p.node_name)


def _cpu_requested(sched: Scheduler) -> int:
    snap = sched.cache.snapshot
    return int(snap.requested("cpu")[snap.index["n0"]])


def test_a_gang_binds_once_min_available_members_are_assumed() -> None:
    cluster, sched, _clock = _setup()
    for i in range(3):
        cluster.apply_pod(_member(f"p{i}", "job", 3))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["p0", "p1", "p2"]
    waits = [e.message for e in cluster.events if e.reason == "GangWaiting"]
    assert "waiting for its gang group: gang default/job: 1/3 members assumed" in waits
    assert "waiting for its gang group: gang default/job: 2/3 members assumed" in waits


def test_prefilter_rejects_members_until_min_available_pods_exist() -> None:
    cluster, sched, clock = _setup()
    for i in range(2):
        cluster.apply_pod(_member(f"p{i}", "job", 3))
    sched.run_until_idle()
    assert _bound(cluster) == []
    assert sched.failures["default/p0"] == (
        "0/1 nodes are available: gang default/job has 2/3 pods created (min-available 3). "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    )
    clock.advance(60)  # past the rejected members' backoff
    cluster.apply_pod(_member("p2", "job", 3))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["p0", "p1", "p2"]


@pytest.mark.parametrize("mode", ["Strict", "NonStrict"])
def test_a_gang_that_cannot_fit_times_out_and_releases_everything(mode: str) -> None:
    cluster, sched, _clock = _setup(cpu="4")  # room for two of three members
    for i in range(3):
        cluster.apply_pod(_member(f"p{i}", "job", 3, waiting_time="0.3s", mode=mode))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == []
    assert _cpu_requested(sched) == 0
    assert len(sched.waiting_pods) == 0
    # Koordinator's mark on every member, and one GangTimeout event each.
    assert {k: p.annotations.get(f"{G}/timeout") for k, p in cluster.pods.items()} == {
        f"default/p{i}": "true" for i in range(3)
    }
    timeouts = sorted(e.pod_key for e in cluster.events if e.reason == "GangTimeout")
    assert timeouts == ["default/p0", "default/p1", "default/p2"]


def test_a_timed_out_gang_is_not_scheduled_again_until_re_created() -> None:
    cluster, sched, clock = _setup()
    for i in range(3):
        cluster.apply_pod(_member(f"p{i}", "job", 3, timeout="true"))
    sched.run_until_idle()
    sched.wait_for_writes()
    assert _bound(cluster) == []
    assert sched.failures["default/p0"].startswith(
        "0/1 nodes are available: gang default/job timed out "
        "(gang.scheduling.koordinator.sh/timeout=true): re-create its pods"
    )
    for i in range(3):  # re-created without the mark: a fresh attempt
        cluster.delete_pod(f"default/p{i}")
        cluster.apply_pod(_member(f"p{i}", "job", 3, uid=f"uid-new-p{i}"))
    clock.advance(60)
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["p0", "p1", "p2"]


def _labelled(name: str, group: str) -> dict[str, object]:
    return (
        make_pod(name)
        .req(cpu="2")
        .uid(f"uid-{name}")
        .scheduler(OURS)
        .label("pod-group.scheduling.sigs.k8s.io", group)
        .obj()
    )


def _pod_group(name: str, min_member: int, timeout: int | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def test_a_pod_group_defines_the_gang_of_its_labelled_pods() -> None:
    cluster, sched, clock = _setup()
    cluster.apply_pod_group(_pod_group("job", 3))
    for i in range(2):
        cluster.apply_pod(_labelled(f"p{i}", "job"))
    sched.run_until_idle()
    assert _bound(cluster) == []
    assert "gang default/job has 2/3 pods created" in sched.failures["default/p0"]
    clock.advance(60)
    cluster.apply_pod(_labelled("p2", "job"))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["p0", "p1", "p2"]


def test_labelled_pods_wait_for_their_pod_group() -> None:
    cluster, sched, clock = _setup()
    for i in range(2):
        cluster.apply_pod(_labelled(f"p{i}", "job"))
    sched.run_until_idle()
    assert _bound(cluster) == []
    assert "PodGroup default/job not found" in sched.failures["default/p0"]
    clock.advance(60)
    cluster.apply_pod_group(_pod_group("job", 2, timeout=30))  # moves them back (PodGroup add)
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["p0", "p1"]


def test_groups_wait_for_every_gang_in_the_group() -> None:
    cluster, sched, clock = _setup()
    groups = '["default/a", "default/b"]'
    cluster.apply_pod(_member("a0", "a", 1, groups=groups))
    cluster.apply_pod(_member("b0", "b", 2, groups=groups))
    sched.run_until_idle()
    assert _bound(cluster) == []  # b has one pod of two: a0 waits, b0 is rejected at PreFilter
    clock.advance(60)
    cluster.apply_pod(_member("b1", "b", 2, groups=groups))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["a0", "b0", "b1"]


def test_a_member_deleted_while_waiting_rejects_the_strict_gang() -> None:
    cluster, sched, _clock = _setup(cpu="4")
    for i in range(3):
        cluster.apply_pod(_member(f"p{i}", "job", 3, waiting_time="60s"))
    for _ in range(3):
        sched.schedule_one()
    assert len(sched.waiting_pods) == 2  # p2 does not fit while p0, p1 hold the CPU
    cluster.delete_pod("default/p0")
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == []
    assert len(sched.waiting_pods) == 0
    assert sched.failures["default/p1"].startswith("gang default/job: member default/p0")


def test_a_pod_group_change_applies_to_its_waiting_gang() -> None:
    cluster, sched, clock = _setup()
    cluster.apply_pod_group(_pod_group("job", 3))
    for i in range(2):
        cluster.apply_pod(_labelled(f"p{i}", "job"))
    sched.run_until_idle()
    assert _bound(cluster) == []
    clock.advance(60)
    cluster.apply_pod_group(_pod_group("job", 2))  # an update moves its pods back
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.close()
    assert _bound(cluster) == ["p0", "p1"]


def test_the_timeout_mark_is_written_off_the_scheduling_thread() -> None:
    """The mark goes through the scheduler's worker pool (here a ManualExecutor): nothing is
    written while Unreserve runs; the writes land when the pool runs them."""
    cluster = InMemoryCluster()
    cluster.apply_node(make_node("n0").cpu("8").memory("64Gi").obj())
    executor = ManualExecutor()
    _, sched, _ = _setup()
    sched.close()
    sched = Scheduler(
        sched.config, cluster, in_tree_registry(), default_plugins(),
        clock=SimulatedClock(), rng=random.Random(0), executor=executor,
    )  # fmt: skip
    for i in range(2):
        cluster.apply_pod(_member(f"p{i}", "job", 2, waiting_time="10ms"))
    sched.schedule_one()  # p0 waits at Permit for a second member
    cluster.delete_pod("default/p1")  # which will never come
    sched.drain()
    executor.run(0)  # p0's binding cycle: its wait times out
    sched.drain()  # Unreserve on the scheduling thread: the mark is queued, not written
    assert cluster.pods["default/p0"].annotations.get(f"{G}/timeout") is None
    executor.run_all()
    assert cluster.pods["default/p0"].annotations.get(f"{G}/timeout") == "true"
    assert "GangTimeout" in {e.reason for e in cluster.events if e.pod_key == "default/p0"}
    sched.close()


# -- the nomination written before a Permit wait (kube-scheduler v1.37) --------------------------


def _record_nominations(cluster: InMemoryCluster) -> list[tuple[str, str]]:
    written: list[tuple[str, str]] = []
    real = cluster.set_nominated_node

    def record(pod: object, node_name: str) -> None:
        written.append((pod.name, node_name))  # type: ignore[attr-defined]
        real(pod, node_name)  # type: ignore[arg-type]

    cluster.set_nominated_node = record  # type: ignore[method-assign]
    return written


def test_members_waiting_at_permit_are_nominated_to_their_node() -> None:
    """Every member that waits at Permit is written nominated to the node it waits for (the
    cluster autoscaler reads it); the member that completes the gang does not wait and is
    not. Nothing is nominated in memory: the members are assumed there already."""
    cluster, sched, _clock = _setup()
    written = _record_nominations(cluster)
    for i in range(3):
        cluster.apply_pod(_member(f"p{i}", "job", 3))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.drain()
    sched.close()
    assert _bound(cluster) == ["p0", "p1", "p2"]
    assert sorted(written) == [("p0", "n0"), ("p1", "n0")]
    assert len(sched.nominator) == 0


def test_a_gang_that_timed_out_has_its_nominations_cleared() -> None:
    """A wait that ends in a rejection clears the nomination it wrote (kube-scheduler's
    binding-cycle failure does): the pod is not going to that node any more."""
    cluster, sched, _clock = _setup(cpu="4")  # room for two of three members
    written = _record_nominations(cluster)
    for i in range(3):
        cluster.apply_pod(_member(f"p{i}", "job", 3, waiting_time="0.3s"))
    sched.run_until_idle()
    sched.wait_for_writes()
    sched.drain()
    sched.close()
    assert _bound(cluster) == []
    waited = sorted({name for name, node in written if node})
    assert len(waited) == 2, written
    for name in waited:
        assert written.index((name, "n0")) < written.index((name, "")), written
    assert not [p.key for p in cluster.pods.values() if p.nominated_node_name]
    assert len(sched.nominator) == 0


def test_the_echo_of_a_waiting_members_nomination_does_not_nominate_it_again() -> None:
    """The member is assumed on n0 (its cpu counted there) while it waits; the watch brings
    back its ``nominatedNodeName``: the nominator must not hold it too, or pods of its
    priority would find n0 fuller by its requests twice."""
    cluster = InMemoryCluster()
    cluster.apply_node(make_node("n0").cpu("8").memory("64Gi").obj())
    executor = ManualExecutor()  # the binding cycle (the wait) is held
    _, template, _ = _setup()
    template.close()
    sched = Scheduler(
        template.config,
        cluster,
        in_tree_registry(),
        default_plugins(),
        clock=SimulatedClock(),
        rng=random.Random(0),
        executor=executor,
    )
    # A short wait: close() runs the held binding cycle, which waits out the gang's time.
    cluster.apply_pod(_member("p0", "job", 2, waiting_time="0.2s"))
    cluster.apply_pod(_member("p1", "job", 2, waiting_time="0.2s"))  # PreFilter wants both
    sched.drain()
    assert sched.schedule_one()  # the first member: assumed, waiting for the second
    waiting = next(p for p in cluster.pods.values() if sched.cache.is_assumed(p))
    assert sched.cache.is_assumed(waiting)
    cluster.set_nominated_node(waiting, "n0")  # the write the binding cycle sends
    sched.drain()
    assert sched.nominator.node_of(waiting.uid) == ""
    assert _cpu_requested(sched) == 2000
    sched.close()
