"""The move from gpushare, played as an operator (issue 27): swap the extender alone.

A real kube-apiserver v1.20.2 and the real Go kube-scheduler v1.20.2 whose extender entry is
gpushare's own (``config/scheduler-policy-config.yaml`` of gpushare-scheduler-extender: filter
and bind under ``/gpushare-scheduler``, ``managedResources`` ``aliyun.com/gpu-mem`` with
``ignoredByScheduler: false``, ``nodeCacheCapable: true``, ``ignorable: false``), now pointing
at ``koord-scheduler extender``. No Device CRD: the GPU nodes advertise only what gpushare's
device plugin does (``aliyun.com/gpu-mem`` and ``aliyun.com/gpu-count``); pods gpushare placed
before the switch carry only its annotations; ``kube-system/unhealthy-gpu-<node>`` takes a card
away (with a bad entry, logged). A stream of gpushare pods, each created once the previous one
is bound, lands exactly on the card gpushare's binpack picks (least free memory that fits,
healthy cards only), never beyond a card's memory. Then the operator deletes the ConfigMap
(the card is usable again) and koordlet arrives on one node (the Device CRD and that node's
Device, with the cards' real sizes): the next pods there are placed on the real sizes, next to
everything placed before.
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
    DEVICES,
    GPU_CORE,
    GPU_MEMORY,
    GPU_RATIO,
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
HOSTNAME = "kubernetes.io/hostname"
# gpushare's extender entry, as its README ships it (config/scheduler-policy-config.yaml).
GPUSHARE_ENTRY = {
    "urlPrefix": "http://127.0.0.1:32766/gpushare-scheduler",
    "filterVerb": "filter",
    "bindVerb": "bind",
    "enableHTTPS": False,
    "nodeCacheCapable": True,
    "managedResources": [{"name": GPU_MEM, "ignoredByScheduler": False}],
    "ignorable": False,
}
# Node -> (aliyun.com/gpu-mem, aliyun.com/gpu-count) as gpushare's device plugin advertises
# them: "mig-a" has two cards of 15 GiB to gpushare (its plugin floors 16 GiB cards' MiB),
# "mig-b" three of 25 // 3 = 8 (integer division, as gpushare's NodeInfo).
CAPACITY = {"mig-a": (30, 2), "mig-b": (25, 3)}
REAL_A = 16  # GiB per card of mig-a, as koordlet's Device reports them
PLACED_BEFORE = [("old-a0", "mig-a", 0, 10), ("old-b1", "mig-b", 1, 5), ("old-b2", "mig-b", 2, 2)]
UNHEALTHY = ("mig-b", "1,x")  # card 1 of mig-b is broken; "x" is a typo


class Cards:
    """gpushare's picture of the cards: per (node, card) its size and what is placed on it."""

    def __init__(self) -> None:
        self.size = {(n, c): u // k for n, (u, k) in CAPACITY.items() for c in range(k)}
        self.used = {key: 0 for key in self.size}
        self.unhealthy: set[tuple[str, int]] = set()

    def binpack(self, node: str, units: int) -> int | None:
        """gpushare's ``allocateGPUID``: the healthy card with the least free memory that
        still fits (the first such card on ties)."""
        fits = [
            (self.size[key] - self.used[key], key[1])
            for key in sorted(self.size)
            if key[0] == node and key not in self.unhealthy
            and self.size[key] - self.used[key] >= units
        ]
        return min(fits)[1] if fits else None


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
                    "profiles": [{"schedulerName": "koord-extender"}],
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
        """Go kube-scheduler with gpushare's entry; only the extender's host changes."""
        entry = dict(GPUSHARE_ENTRY)
        entry["urlPrefix"] = f"http://127.0.0.1:{self.ext_port}/gpushare-scheduler"
        cfg = {
            "clientConnection": {"kubeconfig": self.srv.kubeconfig_path()},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}],
            "extenders": [entry],
        }
        self.go = go_kube_scheduler(self.go_bin, cfg, self.work, self.legacy)

    def inspect(self, node: str) -> dict[str, Any]:
        """The extender's ``GET /gpushare-scheduler/inspect/NODE``."""
        import urllib.request

        url = f"http://127.0.0.1:{self.ext_port}/gpushare-scheduler/inspect/{node}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc


    def fits(self, node: str, units: int) -> bool:
        """Whether the extender's filter (its ledger, as kube-scheduler asks it) passes a pod
        of ``units`` on ``node``: a side-effect-free probe of what it has applied."""
        import urllib.request

        pod = gpushare_pod(uid("probe"), units, node)
        pod["metadata"].update(namespace="default", uid=uid("probe-uid"))
        body = json.dumps({"pod": pod, "nodenames": [node]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ext_port}/gpushare-scheduler/filter",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            doc = json.loads(resp.read())
        return bool(doc.get("nodenames") == [node])


def gpushare_node(kube: Kube, name: str, units: int, count: int) -> None:
    """A node served by gpushare's device plugin alone: no koordinator resources."""
    status = {
        "cpu": "32", "memory": "256Gi", "pods": "110",
        GPU_MEM: str(units), "aliyun.com/gpu-count": str(count),
    }  # fmt: skip
    kube.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"gpushare": "true", HOSTNAME: name}},
            "status": {"capacity": status, "allocatable": status},
        },
    )
    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


def gpushare_pod(name: str, units: int, node: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {HOSTNAME: node},
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {GPU_MEM: str(units)}}}
            ],
        },
    }


@pytest.fixture
def env(kube_binaries: KubeBinaries, kube_scheduler_bin: str, tmp_path: Path) -> Iterator[Env]:
    from apiserver import ApiServer

    # A fresh API server without the Device CRD: the Go scheduler schedules every pod it sees.
    srv = ApiServer(*kube_binaries).start()
    kube = Kube(srv.url, srv.admin_token)
    e = Env(srv, kube, tmp_path, kube_scheduler_bin, kube_binaries.version)
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


def test_swap_the_extender_alone_then_koordlet_takes_over_one_node(env: Env) -> None:
    kube, cards = env.kube, Cards()
    ns = kube.ensure_namespace(uid("mig"))
    # -- the gpushare cluster as it runs today ------------------------------------------------
    for name, (units, count) in CAPACITY.items():
        gpushare_node(kube, name, units, count)
    for name, node, card, units in PLACED_BEFORE:
        body = gpushare_pod(name, units, node, annotations={
            "ALIYUN_COM_GPU_MEM_IDX": str(card),
            "ALIYUN_COM_GPU_MEM_POD": str(units),
            "ALIYUN_COM_GPU_MEM_DEV": str(cards.size[(node, card)]),
            "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
        })  # fmt: skip
        body["spec"]["nodeName"] = node
        kube.post(f"/api/v1/namespaces/{ns}/pods", body)
        cards.used[(node, card)] += units
    bad_node, gpus = UNHEALTHY
    configmap = f"/api/v1/namespaces/kube-system/configmaps/unhealthy-gpu-{bad_node}"
    kube.post("/api/v1/namespaces/kube-system/configmaps", {
        "metadata": {"name": f"unhealthy-gpu-{bad_node}"}, "data": {"gpus": gpus},
    })  # fmt: skip
    cards.unhealthy.add((bad_node, 1))
    with pytest.raises(Exception, match="404"):
        kube.get(DEVICES)  # no Device CRD: nothing of koordinator is installed yet

    # -- step 1: swap the extender --------------------------------------------------------------
    started = time.monotonic()
    ext = env.start_extender()
    env.start_go()
    # The extender's own inspect shows the capacity's cards, what gpushare placed on them.
    devs = {d["id"]: d for d in env.inspect("mig-b")["nodes"][0]["devs"]}
    assert [(d["totalGPU"], d["usedGPU"]) for d in devs.values()] == [(8, 0), (8, 5), (8, 2)]

    def place(name: str, node: str, units: int, size: int | None = None) -> None:
        """Create the pod, wait for its bind, and check the card against gpushare's binpack."""
        expected = cards.binpack(node, units)
        assert expected is not None, (name, node, units)
        kube.post(f"/api/v1/namespaces/{ns}/pods", gpushare_pod(name, units, node))

        def bound() -> dict[str, Any] | None:
            pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            return pod if pod["spec"].get("nodeName") else None

        pod = wait_for(f"{name} bound", bound, timeout=30)
        ann: Mapping[str, str] = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == node
        assert int(ann["ALIYUN_COM_GPU_MEM_IDX"]) == expected, (name, ann)
        assert ann["ALIYUN_COM_GPU_MEM_POD"] == str(units)
        assert ann["ALIYUN_COM_GPU_MEM_DEV"] == str(size or cards.size[(node, expected)])
        cards.used[(node, expected)] += units
        assert cards.used[(node, expected)] <= cards.size[(node, expected)]

    place("p1", "mig-b", 3)  # card 2 (6 free): card 1 has 3 free but is unhealthy
    place("p2", "mig-b", 3)  # card 2 again, now full
    place("p3", "mig-a", 5)  # card 0: 5 left next to gpushare's 10 GiB pod
    place("p4", "mig-a", 6)  # card 1: card 0 is full
    place("p5", "mig-b", 8)  # card 0
    # Nothing left on mig-b's healthy cards: the 1 GiB pod waits, though card 1 has room.
    kube.post(f"/api/v1/namespaces/{ns}/pods", gpushare_pod("waits", 1, "mig-b"))
    time.sleep(3)
    assert not kube.get(f"/api/v1/namespaces/{ns}/pods/waits")["spec"].get("nodeName")
    skipped = [ln for ln in ext.log_lines() if "unhealthy-gpu" in str(ln.get("event"))]
    assert len(skipped) == 1 and skipped[0]["problems"] == ["gpus: 'x' is not a card index"]

    assert not env.fits("mig-b", 1)
    kube.delete(f"/api/v1/namespaces/{ns}/pods/waits")  # kube-scheduler retries it only later

    # -- the operator repairs card 1: deleting the ConfigMap gives it back ---------------------
    kube.delete(configmap)
    cards.unhealthy.clear()
    wait_for("the card given back", lambda: env.fits("mig-b", 3), timeout=10)
    place("p6", "mig-b", 2)  # card 1 (3 free, the fullest that fits)

    # -- step 3: koordlet arrives on mig-a (the CRD, then the node's Device as it writes it) ---
    kube.ensure_device_crd()
    kube.post(DEVICES, {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "mig-a"},
        "spec": {"devices": [
            {"type": "gpu", "id": f"GPU-mig-a-{m}", "minor": m, "health": True,
             "resources": {GPU_CORE: "100", GPU_RATIO: "100", GPU_MEMORY: f"{REAL_A}Gi"}}
            for m in (0, 1)
        ]},
    })  # fmt: skip
    for card in (0, 1):
        cards.size[("mig-a", card)] = REAL_A
    # The extender's inspect reads the informers' caches; a change is queued to its scheduling
    # thread (the ledger) before the cache shows it, so every later verb sees it.
    wait_for(
        "the extender to read mig-a's Device",
        lambda: [d["totalGPU"] for d in env.inspect("mig-a")["nodes"][0]["devs"]] == [16, 16],
        timeout=30,
    )
    # The real sizes count from now on, with everything placed before kept: card 0 (10 + 5 of
    # 16) has 1 GiB left and is binpack's pick; on gpushare's 15 GiB picture it was full.
    place("p7", "mig-a", 1, size=REAL_A)
    place("p8", "mig-a", 4, size=REAL_A)  # card 1 (6 + 4 of 16)
    assert time.monotonic() - started < 60, "the migration took longer than its bound"
    assert card_load(kube.pods(ns)) == {k: v for k, v in cards.used.items() if v}
    for key, used in cards.used.items():
        assert used <= cards.size[key], key


def card_load(pods: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """GiB per (node, card) of the bound pods, read back from gpushare's annotations."""
    load: dict[tuple[str, int], int] = {}
    for pod in pods:
        ann = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("nodeName") and "ALIYUN_COM_GPU_MEM_IDX" in ann:
            key = (pod["spec"]["nodeName"], int(ann["ALIYUN_COM_GPU_MEM_IDX"]))
            load[key] = load.get(key, 0) + int(ann["ALIYUN_COM_GPU_MEM_POD"])
    return load
