"""The scheduler killed (SIGKILL) during a burst of 300 pods and started again: every pod ends up
bound exactly once and no card is over-committed, as read back from the API objects."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import (
    ALLOCATED,
    GPU_CORE,
    GPU_RATIO,
    Kube,
    SchedulerProcess,
    card_load,
    scheduler_config,
    shared_gpu,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

PODS = 300
NODES = 10
GPUS = 8  # 80 cards; 300 pods x 25% = 75 cards: tight enough to catch a double allocation


def test_killed_mid_burst_then_restarted(apiserver: ApiServer, tmp_path: Path) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace(uid("burst"))
    selector = {"e2e-group": scheduler}
    nodes = [uid("gpu") for _ in range(NODES)]
    for name in nodes:
        kube.add_gpu_node(name, gpus=GPUS, memory="40Gi", labels=selector)
    cfg = scheduler_config(tmp_path / "config.yaml", scheduler)
    first = SchedulerProcess(apiserver.kubeconfig_path(), cfg, tmp_path).start()
    second = SchedulerProcess(apiserver.kubeconfig_path(), cfg, tmp_path)
    try:
        first.wait_ready()
        pods = [
            shared_gpu(f"p-{i:03d}", scheduler, 25, node_selector=selector) for i in range(PODS)
        ]
        creator = threading.Thread(target=kube.create_pods, args=(ns, pods))
        creator.start()

        def bound() -> int:
            return sum(1 for p in kube.pods(ns) if p["spec"].get("nodeName"))

        wait_for(
            "a first part of the burst bound", lambda: bound() >= 40, timeout=60, interval=0.05
        )
        first.kill()
        at_kill = bound()
        creator.join(60)
        assert at_kill < PODS, "the scheduler finished before it could be killed"

        second.start().wait_ready()
        wait_for(f"all {PODS} pods bound", lambda: bound() == PODS, timeout=120, interval=0.5)

        items = kube.pods(ns)
        assert len(items) == PODS
        for pod in items:
            assert pod["spec"]["nodeName"] in nodes
            assert ALLOCATED in pod["metadata"]["annotations"], pod["metadata"]["name"]
        for (node, minor), load in card_load(items).items():
            assert load[GPU_CORE] <= 100, (node, minor, load)
            assert load[GPU_RATIO] <= 100, (node, minor, load)
            assert 0 <= minor < GPUS

        # Exactly once: no pod was bound twice by the two processes (a second bind is a 409,
        # logged as a failed bind, never as "bound").
        binds = [line["pod"] for p in (first, second) for line in p.events_named("bound")]
        ours = [b for b in binds if b.startswith(f"{ns}/")]
        assert len(ours) == len(set(ours))
        # SIGKILL loses the log lines of binds in flight (at most --bind-workers, 64).
        assert len(ours) >= PODS - 64
        second_binds = {b for b in ours if b in {x["pod"] for x in second.events_named("bound")}}
        assert second_binds, "the restarted scheduler bound nothing"
        assert second.events_named("synced")
    finally:
        first.kill()
        second.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for name in nodes:
            kube.remove_node(name)
