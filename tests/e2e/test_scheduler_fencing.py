"""Fencing and hand-over on the real API server: a replica that loses the Lease exits; a
SIGTERM releases the Lease only after binding stopped; a stale failure report never lands on
a pod that was bound meanwhile (the resourceVersion precondition, checked by the server)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    Kube,
    KubeError,
    SchedulerProcess,
    condition,
    scheduler_config,
    uid,
    wait_for,
)

from scheduler.kube.cluster import KubeCluster
from scheduler.kube.credentials import load_credentials
from scheduler.kube.rest import RestClient
from scheduler.kube.transport import Urllib3Transport

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

LEASE, RENEW, RETRY = 4.0, 3.0, 1.0
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


def _holder(kube: Kube, path: str) -> str | None:
    """The Lease's holder; None until the first replica has created it (ready comes first)."""
    try:
        return str(kube.get(path)["spec"].get("holderIdentity", ""))
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


def test_a_replica_that_loses_the_lease_exits_and_sigterm_releases_it(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler, lease = uid("koord-fence"), uid("lease")
    cfg = scheduler_config(
        tmp_path / "config.yaml",
        scheduler,
        lease=lease,
        durations=(f"{LEASE:g}s", f"{RENEW:g}s", f"{RETRY:g}s"),
    )
    kubeconfig = apiserver.kubeconfig_path()
    path = f"{LEASES}/{lease}"

    # 1. Someone else takes the Lease (as a partitioned replica would see it): we exit.
    deposed = SchedulerProcess(kubeconfig, cfg, tmp_path, identity="deposed").start()
    try:
        deposed.wait_ready()
        wait_for(
            "deposed to lead", lambda: _holder(kube, path) == "deposed", 20
        )
        doc = kube.get(path)
        doc["spec"]["holderIdentity"] = "thief"
        doc["spec"]["leaseDurationSeconds"] = 3600
        kube.request("PUT", path, doc)
        assert deposed.proc is not None
        code = deposed.proc.wait(RENEW + 20)
        assert code == 1, deposed.log_tail()
        assert any("leader lease lost" in line.get("event", "") for line in deposed.log_lines())
    finally:
        deposed.kill()

    # 2. A graceful stop hands the Lease over at once (released, empty holder), exit 0.
    kube.delete(path)
    leader = SchedulerProcess(kubeconfig, cfg, tmp_path, identity="leader").start()
    try:
        leader.wait_ready()
        wait_for("leader to lead", lambda: _holder(kube, path) == "leader", 20)
        assert leader.stop() == 0, leader.log_tail()
        assert kube.get(path)["spec"].get("holderIdentity", "") == ""
    finally:
        leader.kill()


def test_a_stale_failure_report_never_lands_on_a_bound_pod(apiserver: ApiServer) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    ns = kube.ensure_namespace(uid("stale"))
    node = uid("node")
    kube.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns},
        "spec": {"schedulerName": uid("nobody"), "containers": [{"name": "c", "image": "x"}]},
    }
    kube.post(f"/api/v1/namespaces/{ns}/pods", pod)
    creds = load_credentials(apiserver.kubeconfig_path(), None, None)
    transport = Urllib3Transport(creds, pool_size=4)
    cluster = KubeCluster(RestClient(transport, token=creds.token))
    cluster.start()
    try:
        assert cluster.wait_for_sync(30)
        key = f"{ns}/p"
        seen = wait_for("the informer to see the pod", lambda: cluster.pods.get(key), 20)
        cluster.stop()  # the informer's picture is frozen: unbound, as of now
        kube.post(
            f"/api/v1/namespaces/{ns}/pods/p/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "p", "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )
        cluster.set_pod_scheduled_condition(seen, "False", "Unschedulable", "0/1 nodes")
        live = kube.get(f"/api/v1/namespaces/{ns}/pods/p")
        assert live["spec"]["nodeName"] == node
        cond = condition(live)
        assert cond is None or cond.get("status") != "False", cond
    finally:
        cluster.stop()
        transport.close()
