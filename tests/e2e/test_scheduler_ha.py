"""Two replicas with leader election: only the leader binds; after the leader is killed, the
standby takes over within the lease duration, with warm caches."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scheduler.kube.catchup import in_flight_settle
from scheduler.kube.cluster import FENCED_WRITE_TIMEOUT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    Kube,
    SchedulerProcess,
    scheduler_config,
    shared_gpu,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

LEASE, RENEW, RETRY = 4.0, 3.0, 1.0


def _attempts(proc: SchedulerProcess) -> float:
    family = proc.metrics().get("scheduler_schedule_attempts")
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples if s.name.endswith("_total"))


def test_only_the_leader_binds_and_the_standby_takes_over(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    lease = uid("lease")
    ns = kube.ensure_namespace(uid("ha"))
    selector = {"e2e-group": scheduler}
    nodes = [uid("gpu") for _ in range(2)]
    for name in nodes:
        kube.add_gpu_node(name, gpus=8, labels=selector)
    cfg = scheduler_config(
        tmp_path / "config.yaml",
        scheduler,
        lease=lease,
        durations=(f"{LEASE:g}s", f"{RENEW:g}s", f"{RETRY:g}s"),
    )
    kubeconfig = apiserver.kubeconfig_path()
    leader = SchedulerProcess(kubeconfig, cfg, tmp_path, identity="replica-a").start()
    standby = SchedulerProcess(kubeconfig, cfg, tmp_path, identity="replica-b")
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{lease}"
    try:
        leader.wait_ready()
        wait_for(
            "replica-a to hold the lease",
            lambda: kube.get(lease_path)["spec"]["holderIdentity"] == "replica-a",
            20,
        )
        standby.start().wait_ready()  # a healthy standby is ready

        def bound(prefix: str, count: int) -> bool:
            pods = [p for p in kube.pods(ns) if p["metadata"]["name"].startswith(prefix)]
            return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)

        kube.create_pods(
            ns, [shared_gpu(f"a-{i}", scheduler, 25, node_selector=selector) for i in range(20)]
        )
        wait_for("20 pods bound by the leader", lambda: bound("a-", 20), 30)
        want = {f"{ns}/a-{i}" for i in range(20)}
        # The leader logs "bound" after the API server's answer: under load that line can
        # trail the pod's nodeName by a moment, so wait for it rather than race it.
        wait_for(
            "the leader's bound log lines",
            lambda: {line["pod"] for line in leader.events_named("bound")} >= want,
            30,
        )
        assert {line["pod"] for line in leader.events_named("bound")} == want
        assert not standby.events_named("bound")
        assert _attempts(standby) == 0
        assert _attempts(leader) >= 20
        # The standby's caches are warm: its device metrics see the leader's allocations.
        allocated = standby.metrics()["koord_scheduler_device_allocated"]
        assert (
            sum(
                s.value
                for s in allocated.samples
                if s.labels["resource"] == "koordinator.sh/gpu-core" and s.labels["node"] in nodes
            )
            == 20 * 25
        )

        leader.kill()
        killed_at = time.monotonic()
        kube.create_pods(
            ns, [shared_gpu(f"b-{i}", scheduler, 25, node_selector=selector) for i in range(20)]
        )
        wait_for("the standby to bind the new pods", lambda: bound("b-", 20), 30)
        took = time.monotonic() - killed_at
        # The lease expires LEASE seconds after the standby last saw it renewed; then one retry
        # period at most; then, as the lease expired unreleased, the wait for writes of the
        # killed leader still on the wire and the catch-up (a LIST, a relist after 1 s), plus
        # the scheduling loop's wake-up.
        settle = in_flight_settle(FENCED_WRITE_TIMEOUT, LEASE, RENEW)
        assert took < LEASE + 2 * RETRY + settle + 4, f"takeover took {took:.1f}s"
        assert kube.get(lease_path)["spec"]["holderIdentity"] == "replica-b"
        want_b = {f"{ns}/b-{i}" for i in range(20)}
        # as for the leader above: the "bound" line follows the API server's answer, which
        # under load can trail the nodeName this test reads
        wait_for(
            "the standby's bound log lines",
            lambda: {line["pod"] for line in standby.events_named("bound")} >= want_b,
            30,
        )
        assert {line["pod"] for line in standby.events_named("bound")} == want_b
        assert standby.events_named("became leader")
        assert standby.events_named("leader: caught up with the cluster, scheduling")
    finally:
        leader.kill()
        standby.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for name in nodes:
            kube.remove_node(name)
