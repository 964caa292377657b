"""Gangs on a real API server: ``koord-scheduler run`` with Coscheduling enabled binds a gang of
``nvidia.com/gpu: 2`` pods all at once, and a gang that cannot fit binds nothing and leaves
every card free."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import Kube, SchedulerProcess, gpu_pod, uid, wait_for

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e
G = "gang.scheduling.koordinator.sh"


class Env:
    def __init__(self, kube: Kube, ns: str, scheduler: str, selector: dict[str, str]) -> None:
        self.kube, self.ns, self.scheduler, self.selector = kube, ns, scheduler, selector

    def member(self, name: str, gang: str, size: int, gpus: int, wait: str = "30s") -> None:
        body = gpu_pod(name, self.scheduler, {"nvidia.com/gpu": str(gpus)}, self.selector)
        body["metadata"]["annotations"] = {
            f"{G}/name": gang,
            f"{G}/min-available": str(size),
            f"{G}/waiting-time": wait,
        }
        self.kube.post(f"/api/v1/namespaces/{self.ns}/pods", body)

    def bound(self, prefix: str) -> dict[str, Any]:
        return {
            p["metadata"]["name"]: p
            for p in self.kube.pods(self.ns)
            if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
        }


@pytest.fixture
def env(apiserver: ApiServer, tmp_path: Path) -> Iterator[Env]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-gang")
    ns = kube.ensure_namespace(uid("gang"))
    nodes = [uid("gpu"), uid("gpu")]
    for name in nodes:
        kube.add_gpu_node(name, gpus=4, memory="80Gi", labels={"e2e-group": scheduler})
    plugins = {
        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
        **{
            ep: {"enabled": [{"name": "Coscheduling"}]} for ep in ("preFilter", "reserve", "permit")
        },
    }
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "podInitialBackoffSeconds": 1,
                "podMaxBackoffSeconds": 2,
                "leaderElection": {"leaderElect": False},
                "profiles": [{"schedulerName": scheduler, "plugins": plugins}],
            }
        )
    )
    proc = SchedulerProcess(apiserver.kubeconfig_path(), cfg, tmp_path).start()
    try:
        proc.wait_ready()
        yield Env(kube, ns, scheduler, {"e2e-group": scheduler})
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for name in nodes:
            kube.remove_node(name)


def test_a_gang_binds_all_at_once_and_one_that_cannot_fit_leaves_every_card_free(
    env: Env,
) -> None:
    # 3 members x 4 GPUs on 2 nodes x 4 GPUs: two could be placed, the gang cannot.
    for i in range(3):
        env.member(f"big-{i}", "big", 3, 4, wait="3s")
    time.sleep(8)  # past the waiting time: the members that were reserved are rejected
    assert env.bound("big-") == {}
    for i in range(3):
        env.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/big-{i}")
    # Every card is free again: two plain pods take all 8 GPUs.
    for i in range(2):
        body = gpu_pod(f"plain-{i}", env.scheduler, {"nvidia.com/gpu": "4"}, env.selector)
        env.kube.post(f"/api/v1/namespaces/{env.ns}/pods", body)
    wait_for("both plain pods bound", lambda: len(env.bound("plain-")) == 2, timeout=60)
    for i in range(2):
        env.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/plain-{i}")
    wait_for("plain pods gone", lambda: not env.bound("plain-"), timeout=60)

    # 4 members x 2 GPUs: nothing binds before the 4th exists, then all of them.
    for i in range(3):
        env.member(f"train-{i}", "train", 4, 2)
    time.sleep(4)
    assert env.bound("train-") == {}
    env.member("train-3", "train", 4, 2)
    wait_for("the gang bound", lambda: len(env.bound("train-")) == 4, timeout=60)
    minors: dict[str, set[int]] = {}
    for pod in env.bound("train-").values():
        node = pod["spec"]["nodeName"]
        got = json.loads(
            pod["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"]
        )
        cards = {c["minor"] for c in got["gpu"]}
        assert len(cards) == 2 and not cards & minors.get(node, set())
        minors.setdefault(node, set()).update(cards)
    events = [e for e in env.kube.events(env.ns) if e["reason"] == "GangWaiting"]
    assert any("members assumed" in e["message"] for e in events)
