"""Coscheduling on the in-memory cluster: gangs bind together, or not at all."""

from __future__ import annotations

import random

import pytest

from scheduler.config import parse_config
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.scheduler import Scheduler
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.run import SimulatedClock
from tests.builders import make_node, make_pod

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


def _member(name: str, gang: str, min_available: int, **extra: str) -> dict[str, object]:
    b = (
        make_pod(name)
        .req(cpu="2")
        .uid(f"uid-{name}")
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
