"""The API server stopped for 30 s and started again.

Without leader election the scheduler recovers without a restart, and /readyz tells the truth in
between (not ready while the API server is away; alive). With leader election the leader cannot
renew its Lease, so it stops and exits 1 (kube-scheduler's OnStoppedLeading; the fault issue's
rule: a restart begins with a clean cache); the process its supervisor starts again leads and
binds once the API server is back."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

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

OUTAGE = 30.0


def test_recovers_from_an_api_server_outage(
    make_apiserver: Callable[..., ApiServer], tmp_path: Path
) -> None:
    server = make_apiserver()
    kube = Kube(server.url, server.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace("outage")
    kube.add_gpu_node("gpu-0", gpus=4)
    cfg = scheduler_config(tmp_path / "config.yaml", scheduler)
    proc = SchedulerProcess(server.kubeconfig_path(), cfg, tmp_path).start()
    try:
        proc.wait_ready()

        def bound(name: str) -> bool:
            return bool(kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")["spec"].get("nodeName"))

        kube.post(f"/api/v1/namespaces/{ns}/pods", shared_gpu("before", scheduler, 50))
        wait_for("a pod bound before the outage", lambda: bound("before"), 20)

        server.stop_apiserver()
        down_at = time.monotonic()
        wait_for("/readyz to fail", lambda: proc.http("/readyz")[0] == 503, 15)
        seen_ready = False
        while time.monotonic() - down_at < OUTAGE:
            assert proc.running, proc.log_tail()
            assert proc.http("/livez")[0] == 200
            seen_ready |= proc.http("/readyz")[0] == 200
            time.sleep(1)
        assert not seen_ready, "/readyz said ready while the API server was down"
        code, body = proc.http("/readyz?verbose")
        assert code == 503
        assert "[-]informer-sync failed" in body

        server.start_apiserver()
        wait_for("/readyz to recover", lambda: proc.http("/readyz")[0] == 200, 30)
        kube.post(f"/api/v1/namespaces/{ns}/pods", shared_gpu("after", scheduler, 50))
        wait_for("a pod bound after the outage", lambda: bound("after"), 30)
        assert proc.running
    finally:
        proc.stop()


def test_a_leader_that_cannot_renew_exits_and_its_restart_leads(
    make_apiserver: Callable[..., ApiServer], tmp_path: Path
) -> None:
    server = make_apiserver()
    kube = Kube(server.url, server.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace("outage-le")
    kube.add_gpu_node("gpu-0", gpus=4)
    cfg = scheduler_config(tmp_path / "config.yaml", scheduler, lease="outage")
    proc = SchedulerProcess(server.kubeconfig_path(), cfg, tmp_path).start()
    try:
        proc.wait_ready()
        server.stop_apiserver()
        wait_for("the leader to exit", lambda: not proc.running, 30)
        assert proc.stop() == 1, proc.log_tail()
        assert proc.events_named("lost leadership: scheduling stops")
        server.start_apiserver()
        again = SchedulerProcess(server.kubeconfig_path(), cfg, tmp_path).start()  # supervisor
        try:
            again.wait_ready()
            kube.post(f"/api/v1/namespaces/{ns}/pods", shared_gpu("after", scheduler, 50))
            wait_for(
                "a pod bound by the restarted leader",
                lambda: bool(
                    kube.get(f"/api/v1/namespaces/{ns}/pods/after")["spec"].get("nodeName")
                ),
                60,
            )
            assert again.events_named("became leader")
        finally:
            again.stop()
    finally:
        proc.stop()
