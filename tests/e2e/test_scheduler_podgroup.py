"""PodGroup gangs on a real API server (a fresh one: the PodGroup CRD starts absent).

``koord-scheduler run`` with Coscheduling is ready and healthy on a cluster without the
PodGroup CRD (one log line says so). With the CRD of config/crd/ installed, a PodGroup
(``minMember: 3``) defines the gang of pods labelled ``pod-group.scheduling.sigs.k8s.io``:
nothing binds until three exist, then all three do. A gang that cannot fit times out after
the PodGroup's ``scheduleTimeoutSeconds``: every member gets Koordinator's
``gang.scheduling.koordinator.sh/timeout: "true"`` and a ``GangTimeout`` event, nothing of it
is bound, and every card is free again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler_harness import REPO_ROOT, Kube, SchedulerProcess, gpu_pod, uid, wait_for

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e
PG_API = "/apis/scheduling.sigs.k8s.io/v1alpha1"
LABEL = "pod-group.scheduling.sigs.k8s.io"
TIMEOUT = "gang.scheduling.koordinator.sh/timeout"


class Env:
    def __init__(self, kube: Kube, ns: str, scheduler: str, selector: dict[str, str]) -> None:
        self.kube, self.ns, self.scheduler, self.selector = kube, ns, scheduler, selector

    def pod_group(self, name: str, min_member: int, timeout: int) -> None:
        body = {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": min_member, "scheduleTimeoutSeconds": timeout},
        }
        self.kube.post(f"{PG_API}/namespaces/{self.ns}/podgroups", body)

    def member(self, name: str, group: str, gpus: int) -> None:
        body = gpu_pod(name, self.scheduler, {"nvidia.com/gpu": str(gpus)}, self.selector)
        body["metadata"]["labels"] = {LABEL: group}
        self.kube.post(f"/api/v1/namespaces/{self.ns}/pods", body)

    def pods(self, prefix: str) -> dict[str, Any]:
        return {
            p["metadata"]["name"]: p
            for p in self.kube.pods(self.ns)
            if p["metadata"]["name"].startswith(prefix)
        }

    def bound(self, prefix: str) -> dict[str, Any]:
        return {k: p for k, p in self.pods(prefix).items() if p["spec"].get("nodeName")}

    def delete(self, prefix: str) -> None:
        for name in self.pods(prefix):
            self.kube.delete(f"/api/v1/namespaces/{self.ns}/pods/{name}")
        wait_for(f"{prefix}* gone", lambda: not self.pods(prefix), timeout=60)


def _config(path: Path, scheduler: str) -> Path:
    plugins = {
        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
        **{
            ep: {"enabled": [{"name": "Coscheduling"}]} for ep in ("preFilter", "reserve", "permit")
        },
    }
    path.write_text(
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
    return path


def _install_pod_group_crd(kube: Kube) -> None:
    crd = yaml.safe_load(
        (REPO_ROOT / "config/crd/podgroups.scheduling.sigs.k8s.io.yaml").read_text()
    )
    kube.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def served() -> bool:
        try:
            kube.get(f"{PG_API}/podgroups")
            return True
        except Exception:
            return False

    wait_for("the PodGroup CRD to be served", served, timeout=30)


@pytest.fixture
def env(make_apiserver: Callable[..., ApiServer], tmp_path: Path) -> Iterator[Env]:
    server = make_apiserver()
    kube = Kube(server.url, server.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-pg")
    ns = kube.ensure_namespace(uid("pg"))
    for _ in range(2):
        kube.add_gpu_node(uid("gpu"), gpus=4, memory="80Gi", labels={"e2e-group": scheduler})
    cfg = _config(tmp_path / "config.yaml", scheduler)

    # No PodGroup CRD yet: ready, healthy, and one line says PodGroups are not served.
    first = SchedulerProcess(server.kubeconfig_path(), cfg, tmp_path).start()
    try:
        first.wait_ready()
        assert first.http("/livez")[0] == 200
        time.sleep(1)
        code, body = first.http("/readyz")
        assert code == 200, body
        absent = first.events_named("resource not served, working without it")
        assert [line["resource"] for line in absent] == ["PodGroup"], first.log_tail()
        assert "PodGroup CRD not installed" in absent[0]["hint"]
    finally:
        first.stop()

    _install_pod_group_crd(kube)
    proc = SchedulerProcess(server.kubeconfig_path(), cfg, tmp_path).start()
    try:
        proc.wait_ready()
        assert not proc.events_named("resource not served, working without it")
        yield Env(kube, ns, scheduler, {"e2e-group": scheduler})
    finally:
        proc.stop()


def test_a_pod_group_gangs_its_pods_and_a_timed_out_gang_is_marked_and_freed(env: Env) -> None:
    # minMember 3 of nvidia.com/gpu: 2 pods: nothing binds before the third exists.
    env.pod_group("train", 3, timeout=60)
    for i in range(2):
        env.member(f"train-{i}", "train", 2)
    time.sleep(4)
    assert env.bound("train-") == {}
    env.member("train-2", "train", 2)
    wait_for("the PodGroup's gang bound", lambda: len(env.bound("train-")) == 3, timeout=60)
    env.delete("train-")

    # 3 members x 4 GPUs on 2 nodes x 4 GPUs: two can be reserved, the gang cannot fit; after
    # scheduleTimeoutSeconds (2 s) every member is marked and nothing of the gang is bound.
    env.pod_group("big", 3, timeout=2)
    for i in range(3):
        env.member(f"big-{i}", "big", 4)

    def marked() -> bool:
        pods = env.pods("big-")
        return len(pods) == 3 and all(
            (p["metadata"].get("annotations") or {}).get(TIMEOUT) == "true" for p in pods.values()
        )

    wait_for("the timeout mark on every member", marked, timeout=60)
    time.sleep(3)  # marked members stay unscheduled (PreFilter: unresolvable)
    assert env.bound("big-") == {}
    reasons = {
        e["involvedObject"]["name"]
        for e in env.kube.events(env.ns)
        if e["reason"] == "GangTimeout" and "timed out after waiting 2s" in e["message"]
    }
    assert reasons == {"big-0", "big-1", "big-2"}
    env.delete("big-")

    # Every card is free again: two plain pods take all 8 GPUs.
    for i in range(2):
        body = gpu_pod(f"plain-{i}", env.scheduler, {"nvidia.com/gpu": "4"}, env.selector)
        env.kube.post(f"/api/v1/namespaces/{env.ns}/pods", body)
    wait_for("both plain pods bound", lambda: len(env.bound("plain-")) == 2, timeout=60)
