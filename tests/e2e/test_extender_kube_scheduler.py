"""``koord-scheduler extender`` behind the real Go kube-scheduler v1.20.2, on a real API server.

The default kube-scheduler (built by hack/kube-scheduler.sh from the same Debian source as the
API server) is configured with our extender under gpushare's URL prefix, exactly as a gpushare
cluster is. Pods with ``schedulerName: default-scheduler`` asking for ``aliyun.com/gpu-mem``
or koordinator GPU resources are bound through the extender with their cards and annotations;
a 500-pod burst with the extender killed and restarted in the middle never over-commits a card;
a pod gpushare placed before the switch (ALIYUN annotations only) keeps its memory.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apiserver import V120, KubeBinaries
from test_scheduler_harness import (
    ALLOCATED,
    DEVICES,
    GIB,
    GPU_CORE,
    GPU_MEMORY,
    GPU_RATIO,
    REPO_ROOT,
    Kube,
    SchedulerProcess,
    free_port,
    go_kube_scheduler,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

GPU_MEM = "aliyun.com/gpu-mem"
# The snippets we ship for kube-scheduler: kubescheduler.config.k8s.io/v1 (v1.25 and later),
# and v1beta1 for v1.20-v1.22.
SNIPPET = REPO_ROOT / "config" / "overlays" / "extender" / "kube-scheduler-config.yaml"
SNIPPET_V1BETA1 = SNIPPET.with_name("kube-scheduler-config-v1beta1.yaml")
CARDS = {"gs-a": [16, 16], "gs-b": [24, 8]}  # GiB per card: heterogeneous on purpose
BURST_NODES = {"gs-c": [40, 40]}  # more room for the burst, so the restart lands mid-way
PLACED_BEFORE = ("gs-a", 0, 10)  # gpushare put a 10 GiB pod on gs-a card 0 before the switch


class Env:
    def __init__(
        self, srv: ApiServer, kube: Kube, work: Path, go_bin: str, kube_version: str
    ) -> None:
        self.srv, self.kube, self.work, self.go_bin = srv, kube, work, go_bin
        self.legacy = kube_version == V120  # kube-scheduler v1.20: v1beta1, --port
        self.ext_port = free_port()
        self.extender: SchedulerProcess | None = None
        self.go: subprocess.Popen[bytes] | None = None

    def start_extender(self) -> SchedulerProcess:
        cfg = self.work / "koord.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "leaderElection": {"leaderElect": False},
                    "profiles": [
                        {
                            "schedulerName": "koord-extender",
                            "pluginConfig": [
                                {  # gpushare's binpack: the fullest card that fits
                                    "name": "DeviceShare",
                                    "args": {"scoringStrategy": {"type": "MostAllocated"}},
                                }
                            ],
                        }
                    ],
                }
            )
        )
        self.extender = SchedulerProcess(
            self.srv.kubeconfig_path(),
            cfg,
            self.work,
            command="extender",
            extra_args=[
                "--extender-address=127.0.0.1",
                f"--extender-port={self.ext_port}",
                "--log-level=warning",
            ],
        ).start()
        self.extender.wait_ready(60)
        return self.extender

    def start_go(self) -> None:
        # The snippet we ship for this kube-scheduler, with this test's addresses.
        cfg = yaml.safe_load((SNIPPET_V1BETA1 if self.legacy else SNIPPET).read_text())
        cfg["clientConnection"] = {
            "kubeconfig": self.srv.kubeconfig_path(),
            "qps": 500,
            "burst": 1000,
        }
        cfg["leaderElection"] = {"leaderElect": False}
        (extender,) = cfg["extenders"]
        extender["urlPrefix"] = f"http://127.0.0.1:{self.ext_port}/gpushare-scheduler"
        self.go = go_kube_scheduler(self.go_bin, cfg, self.work, self.legacy)

    def pods(self, ns: str) -> list[dict[str, Any]]:
        return self.kube.pods(ns)


def add_gpushare_node(kube: Kube, name: str, cards: list[int]) -> None:
    """A gpushare node: ``aliyun.com/gpu-mem`` (GiB) as gpushare's device plugin advertises,
    koordinator's totals, and the Device CR with each card's own memory."""
    alloc = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "1000",
        GPU_MEM: str(sum(cards)),
        "aliyun.com/gpu-count": str(len(cards)),
        GPU_CORE: str(100 * len(cards)),
        GPU_RATIO: str(100 * len(cards)),
        GPU_MEMORY: str(sum(cards) * GIB),
    }
    kube.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"gpushare": "true"}},
            "status": {"capacity": alloc, "allocatable": alloc},
        },
    )
    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
    kube.post(
        DEVICES,
        {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Device",
            "metadata": {"name": name},
            "spec": {
                "devices": [
                    {
                        "type": "gpu",
                        "id": f"GPU-{name}-{m}",
                        "minor": m,
                        "health": True,
                        "resources": {GPU_CORE: "100", GPU_MEMORY: f"{gib}Gi", GPU_RATIO: "100"},
                    }
                    for m, gib in enumerate(cards)
                ]
            },
        },
    )


def gpushare_pod(name: str, units: int, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {GPU_MEM: str(units)}}}
            ],
        },
    }


def card_load(pods: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """GiB held per (node, card) by bound pods: ``device-allocated`` when present, else the
    ALIYUN annotations gpushare wrote (pods placed before the switch)."""
    load: dict[tuple[str, int], int] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        ann: Mapping[str, str] = pod["metadata"].get("annotations") or {}
        if not node:
            continue
        if ALLOCATED in ann:
            for card in json.loads(ann[ALLOCATED]).get("gpu", []):
                mem = card["resources"][GPU_MEMORY]
                gib = int(mem.removesuffix("Gi")) if mem.endswith("Gi") else int(mem) // GIB
                key = (node, card["minor"])
                load[key] = load.get(key, 0) + gib
        elif "ALIYUN_COM_GPU_MEM_IDX" in ann:
            key = (node, int(ann["ALIYUN_COM_GPU_MEM_IDX"]))
            load[key] = load.get(key, 0) + int(ann["ALIYUN_COM_GPU_MEM_POD"])
    return load


def assert_no_card_over_committed(pods: list[dict[str, Any]]) -> None:
    cards = {**CARDS, **BURST_NODES}
    for (node, minor), gib in card_load(pods).items():
        assert gib <= cards[node][minor], f"{node} card {minor}: {gib} GiB > {cards[node][minor]}"


@pytest.fixture
def env(kube_binaries: KubeBinaries, kube_scheduler_bin: str, tmp_path: Path) -> Iterator[Env]:
    from apiserver import ApiServer

    # A fresh API server: the Go scheduler schedules every default-scheduler pod it sees.
    srv = ApiServer(*kube_binaries).start()
    kube = Kube(srv.url, srv.admin_token)
    kube.ensure_device_crd()
    e = Env(srv, kube, tmp_path, kube_scheduler_bin, kube_binaries.version)
    for name, cards in CARDS.items():
        add_gpushare_node(kube, name, cards)
    try:
        yield e
    finally:
        if e.go is not None and e.go.poll() is None:
            e.go.send_signal(signal.SIGTERM)
            try:
                e.go.wait(10)
            except subprocess.TimeoutExpired:
                e.go.kill()
        if e.extender is not None:
            e.extender.stop()
        srv.stop()


def placed_by_gpushare(env: Env, ns: str) -> None:
    node, card, units = PLACED_BEFORE
    body = gpushare_pod(
        "old",
        units,
        annotations={
            "ALIYUN_COM_GPU_MEM_IDX": str(card),
            "ALIYUN_COM_GPU_MEM_POD": str(units),
            "ALIYUN_COM_GPU_MEM_DEV": str(CARDS[node][card]),
            "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
        },
    )
    body["spec"]["nodeName"] = node
    env.kube.post(f"/api/v1/namespaces/{ns}/pods", body)


def test_pods_of_the_default_scheduler_are_bound_through_the_extender(env: Env) -> None:
    ns = env.kube.ensure_namespace(uid("ext"))
    placed_by_gpushare(env, ns)
    env.start_extender()
    env.start_go()
    koord = gpushare_pod("koord", 0)
    koord["spec"]["containers"][0]["resources"]["limits"] = {GPU_CORE: "50", GPU_RATIO: "50"}
    env.kube.post(f"/api/v1/namespaces/{ns}/pods", koord)
    env.kube.post(f"/api/v1/namespaces/{ns}/pods", gpushare_pod("fits-six", 6))

    def bound(name: str) -> dict[str, Any] | None:
        pod = env.kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return pod if pod["spec"].get("nodeName") else None

    gs = wait_for("gpushare pod bound", lambda: bound("fits-six"), timeout=90)
    ann = gs["metadata"]["annotations"]
    assert ann["ALIYUN_COM_GPU_MEM_POD"] == "6"
    assert ann["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    node, idx = gs["spec"]["nodeName"], int(ann["ALIYUN_COM_GPU_MEM_IDX"])
    assert ann["ALIYUN_COM_GPU_MEM_DEV"] == str(CARDS[node][idx])
    (card,) = json.loads(ann[ALLOCATED])["gpu"]
    assert card["minor"] == idx and card["resources"][GPU_MEMORY] == "6Gi"
    # Binpack per card: 6 GiB fits best on gs-a card 0 (6 GiB left next to the old pod's 10).
    assert (node, idx) == ("gs-a", 0)
    kp = wait_for("koordinator pod bound", lambda: bound("koord"), timeout=90)
    (kcard,) = json.loads(kp["metadata"]["annotations"][ALLOCATED])["gpu"]
    assert kcard["resources"][GPU_CORE] == "50"
    assert_no_card_over_committed(env.pods(ns))


def test_a_500_pod_burst_with_the_extender_restarted_never_over_commits(env: Env) -> None:
    ns = env.kube.ensure_namespace(uid("burst"))
    placed_by_gpushare(env, ns)
    for name, cards in BURST_NODES.items():
        add_gpushare_node(env.kube, name, cards)
    all_cards = {**CARDS, **BURST_NODES}
    capacity = sum(sum(c) for c in all_cards.values()) - PLACED_BEFORE[2]  # 1 GiB pods
    ext = env.start_extender()
    env.start_go()
    env.kube.create_pods(ns, [gpushare_pod(f"b{i:03d}", 1) for i in range(500)], threads=8)

    def bound() -> int:
        return sum(1 for p in env.pods(ns) if p["spec"].get("nodeName")) - 1  # minus "old"

    wait_for("the burst under way", lambda: bound() >= 10, timeout=180)
    at_kill = bound()
    ext.kill()  # mid-burst, binds possibly in flight
    time.sleep(2)
    env.start_extender()
    wait_for("every GiB handed out", lambda: bound() >= capacity, timeout=300)
    time.sleep(3)  # pods still pending keep being retried: nothing more may bind
    pods = env.pods(ns)
    assert at_kill < capacity, "the burst was over before the extender was killed"
    assert bound() == capacity
    assert_no_card_over_committed(pods)
    for pod in pods:
        ann = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("nodeName") and ALLOCATED in ann:
            (card,) = json.loads(ann[ALLOCATED])["gpu"]
            assert card["minor"] == int(ann["ALIYUN_COM_GPU_MEM_IDX"])
