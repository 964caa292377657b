"""Device-aware preemption on a real API server, with PriorityClasses and a PodDisruptionBudget.

Low-priority pods holding half a card each fill two GPU nodes; the pods on node A and on one
card of node B are protected by a PDB (``policy/v1`` on v1.37, ``v1beta1`` on v1.20; no
disruption controller runs here, so it allows no disruption). A high-priority pod asking for
one whole card arrives: exactly the two unprotected pods sharing one card of node B are
deleted (UID precondition, ``Preempted`` events), the pod is nominated to node B and binds on
the freed card, and every protected pod survives.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apiserver import V120
from test_scheduler_harness import Kube, SchedulerProcess, shared_gpu, uid, wait_for

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e
ALLOCATED = "scheduling.koordinator.sh/device-allocated"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


class Env:
    def __init__(self, kube: Kube, ns: str, scheduler: str, nodes: list[str]) -> None:
        self.kube, self.ns, self.scheduler, self.nodes = kube, ns, scheduler, nodes
        self.selector = {"e2e-group": scheduler}
        self.proc: SchedulerProcess | None = None

    def pod(self, name: str, percent: int, priority_class: str) -> None:
        body = shared_gpu(name, self.scheduler, percent, node_selector=self.selector)
        body["spec"]["priorityClassName"] = priority_class
        self.kube.post(f"/api/v1/namespaces/{self.ns}/pods", body)

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.kube.pods(self.ns)}


def _card(pod: dict[str, Any]) -> tuple[str, int]:
    alloc = json.loads(pod["metadata"]["annotations"][ALLOCATED])
    (gpu,) = alloc["gpu"]
    return pod["spec"]["nodeName"], int(gpu["minor"])


@pytest.fixture
def env(apiserver: ApiServer, tmp_path: Path) -> Iterator[Env]:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-preempt")
    ns = kube.ensure_namespace(uid("preempt"))
    low, high = uid("low"), uid("high")
    kube.post(PRIORITY_CLASSES, {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": low}, "value": 10,
    })
    kube.post(PRIORITY_CLASSES, {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": high}, "value": 100000,
    })
    nodes = [uid("gpu-a"), uid("gpu-b")]
    for name in nodes:
        kube.add_gpu_node(name, gpus=2, memory="16Gi", labels={"e2e-group": scheduler})
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "podInitialBackoffSeconds": 1,
                "podMaxBackoffSeconds": 2,
                "leaderElection": {"leaderElect": False},
                "profiles": [{"schedulerName": scheduler}],
            }
        )
    )
    environment = Env(kube, ns, scheduler, nodes)
    environment.low, environment.high = low, high  # type: ignore[attr-defined]
    proc = SchedulerProcess(apiserver.kubeconfig_path(), cfg, tmp_path).start()
    environment.proc = proc
    try:
        proc.wait_ready()
        yield environment
    finally:
        proc.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for name in nodes:
            kube.remove_node(name)
        for pc in (low, high):
            kube.delete(f"{PRIORITY_CLASSES}/{pc}")


def test_a_high_priority_pod_evicts_exactly_the_minimal_unprotected_victims(
    env: Env, kube_version: str
) -> None:
    low, high = env.low, env.high  # type: ignore[attr-defined]
    for i in range(8):
        env.pod(f"low-{i}", 50, low)
    wait_for(
        "8 low-priority pods bound",
        lambda: sum(1 for p in env.pods().values() if p["spec"].get("nodeName")) == 8,
        timeout=60,
    )
    pods = env.pods()
    assert all(p["spec"]["priority"] == 10 for p in pods.values())
    by_card: dict[tuple[str, int], list[str]] = {}
    for name, p in pods.items():
        by_card.setdefault(_card(p), []).append(name)
    assert sorted(len(v) for v in by_card.values()) == [2, 2, 2, 2]  # every card full
    node_b = env.nodes[1]  # node A's cards (and node B's card 0) are all protected
    victims = sorted(by_card[(node_b, 1)])
    protected = sorted(n for card, names in by_card.items() if card != (node_b, 1) for n in names)
    for name in protected:
        env.kube.patch(
            f"/api/v1/namespaces/{env.ns}/pods/{name}", {"metadata": {"labels": {"app": "db"}}}
        )
    # policy/v1 since 1.21 (the only version since 1.25); 1.20 serves v1beta1 alone.
    policy = "policy/v1beta1" if kube_version == V120 else "policy/v1"
    env.kube.post(f"/apis/{policy}/namespaces/{env.ns}/poddisruptionbudgets", {
        "apiVersion": policy, "kind": "PodDisruptionBudget",
        "metadata": {"name": "db"},
        "spec": {"minAvailable": 6, "selector": {"matchLabels": {"app": "db"}}},
    })
    # Let the scheduler's PDB informer see it before the preemptor arrives.
    wait_for("the PDB is listed", lambda: env.kube.get(
        f"/apis/{policy}/namespaces/{env.ns}/poddisruptionbudgets")["items"], timeout=10)

    env.pod("urgent", 100, high)
    wait_for(
        "the preemptor bound",
        lambda: env.pods().get("urgent", {}).get("spec", {}).get("nodeName"),
        timeout=60,
    )
    pods = env.pods()
    urgent = pods["urgent"]
    assert _card(urgent) == (node_b, 1), "it binds on the very card its victims freed"
    # Nominated to node B by the preemption; a 1.37 server clears the nomination when the pod
    # is bound (ClearingNominatedNodeNameAfterBinding, on since 1.35), 1.20 keeps it.
    nominated = urgent["status"].get("nominatedNodeName")
    assert nominated == (node_b if kube_version == V120 else None), nominated
    assert sorted(n for n in pods if n.startswith("low-")) == protected
    assert not set(victims) & set(pods)
    events = env.kube.events(env.ns)
    preempted = sorted(
        e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted"
    )
    assert preempted == victims
    assert all(
        f"Preempted by {env.ns}/urgent on node {node_b}" in e["message"]
        for e in events
        if e.get("reason") == "Preempted"
    )
    # No card over capacity at any point we can see, and now exactly full again.
    loads: dict[tuple[str, int], int] = {}
    for p in pods.values():
        alloc = json.loads(p["metadata"]["annotations"][ALLOCATED])["gpu"][0]
        share = int(alloc["resources"]["koordinator.sh/gpu-core"])
        loads[_card(p)] = loads.get(_card(p), 0) + share
    assert set(loads.values()) == {100}
    assert env.proc is not None
    metrics = env.proc.metrics()
    assert metrics["scheduler_preemption_attempts"].samples[0].value >= 1
    victims_hist = {s.name: s.value for s in metrics["scheduler_preemption_victims"].samples}
    assert victims_hist["scheduler_preemption_victims_count"] == 1
    assert victims_hist["scheduler_preemption_victims_sum"] == 2
