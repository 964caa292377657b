"""A real Prometheus (Debian's package) scrapes ``koord-scheduler run`` and ``koordlet run
--fake-gpus``; PromQL over its HTTP API must agree with the truth read from the API objects,
``promtool check metrics`` must be clean on both expositions, and every query of the Grafana
dashboard must parse and return data where this scenario made some.

Scenario: node A is a koordlet with four fake A100s, one marked unhealthy through the fake
health file; node B is a synthetic GPU node (Node + Device CR written by the test) with one
unhealthy card. Shared-GPU pods are bound on both; two pods can never fit and stay pending.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prometheus import Prometheus, free_port, tools, vector
from test_node_to_container import Agent
from test_scheduler_harness import (
    DEVICES,
    GPU_CORE,
    GPU_RATIO,
    REPO_ROOT,
    Kube,
    SchedulerProcess,
    card_load,
    gpu_pod,
    scheduler_config,
    shared_gpu,
    uid,
    wait_for,
)

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e

FAKE_GPUS = REPO_ROOT / "config" / "examples" / "fake-gpus.yaml"
RULES = REPO_ROOT / "config" / "prometheus" / "rules.yaml"
DASHBOARD = REPO_ROOT / "config" / "grafana" / "koord-py-dashboard.json"
CORE = 'resource="koordinator.sh/gpu-core"'


@pytest.fixture(scope="module")
def prom_tools() -> tuple[str, str]:
    return tools()


@pytest.fixture(scope="module")
def stack(
    prom_tools: tuple[str, str], apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("prom")
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    group = uid("prom")
    selector = {"e2e-group": group}
    node_a, node_b = uid("agent-node"), uid("synthetic-node")
    base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    kube.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node_a, "labels": {"kubernetes.io/hostname": node_a, **selector}},
            "status": {"capacity": base, "allocatable": base},
        },
    )
    kube.patch(f"/api/v1/nodes/{node_a}", {"spec": {"taints": None}})
    kube.add_gpu_node(node_b, gpus=2, memory="16Gi", labels=selector, unhealthy=[1])

    # Fake GPUs with minor 3 unhealthy, via the fake library's health file.
    spec = yaml.safe_load(FAKE_GPUS.read_text())
    spec["healthFile"] = "health.yaml"
    (tmp / "gpus.yaml").write_text(yaml.safe_dump(spec))
    (tmp / "health.yaml").write_text(yaml.safe_dump({"3": {"healthy": False, "reason": "Xid79"}}))
    agent_port = free_port()
    agent = Agent(
        [
            "--node-name", node_a,
            "--kubeconfig", apiserver.kubeconfig_path(),
            "--fake-gpus", str(tmp / "gpus.yaml"),
            "--kubelet-root", str(tmp / "kubelet"),
            "--sync-interval", "1s",
            "--socket", str(tmp / "koordlet.sock"),
            "--hook-dir", str(tmp / "hooks"),
            "--metrics-bind-address", f"127.0.0.1:{agent_port}",
        ],
        tmp / "koordlet.log",
    )  # fmt: skip
    scheduler = uid("koord-e2e")
    sched = SchedulerProcess(
        apiserver.kubeconfig_path(), scheduler_config(tmp / "sched.yaml", scheduler), tmp
    ).start()
    prom = None
    ns = kube.ensure_namespace(uid("prom"))
    try:
        prom = Prometheus(
            prom_tools[0],
            {
                "koord-scheduler": [f"127.0.0.1:{sched.port}"],
                "koordlet": [f"127.0.0.1:{agent_port}"],
            },
            tmp,
            rule_files=[RULES],
        ).start()
        wait_for(
            "koordlet's GPU totals on its node",
            lambda: kube.get(f"/api/v1/nodes/{node_a}")["status"]["allocatable"].get(GPU_CORE),
            timeout=90,
        )
        sched.wait_ready(timeout=60)
        on_a, on_b = {"kubernetes.io/hostname": node_a}, {"kubernetes.io/hostname": node_b}
        pods = [
            shared_gpu(f"a{i}", scheduler, p, node_selector=on_a)
            for i, p in enumerate((20, 30, 40, 50))  # fits under any card-spreading order
        ]
        pods += [shared_gpu(f"b{i}", scheduler, 40, node_selector=on_b) for i in range(2)]
        # Never fits: more cards than any node has, and a whole card more than B's healthy one.
        pods.append(gpu_pod("huge", scheduler, {GPU_CORE: "800", GPU_RATIO: "800"}, selector))
        pods.append(gpu_pod("b-full", scheduler, {GPU_CORE: "200"}, on_b))
        kube.create_pods(ns, pods)
        bound_names = {p["metadata"]["name"] for p in pods} - {"huge", "b-full"}

        def all_bound() -> list[dict[str, Any]] | None:
            got = kube.pods(ns)
            done = {p["metadata"]["name"] for p in got if p["spec"].get("nodeName")}
            return got if done >= bound_names else None

        try:
            wait_for("the placeable pods to be bound", all_bound, timeout=180, interval=0.5)
        except AssertionError as exc:
            state = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in kube.pods(ns)}
            raise AssertionError(f"{exc}\npods: {state}\n{sched.log_tail(15)}") from None
        yield {
            "kube": kube,
            "prom": prom,
            "sched": sched,
            "agent_port": agent_port,
            "ns": ns,
            "nodes": (node_a, node_b),
            "scheduler": scheduler,
            "promtool": prom_tools[1],
            "config": tmp / "sched.yaml",
        }
    finally:
        if prom is not None:
            prom.stop()
        sched.stop()
        agent.stop()
        for pod in kube.pods(ns):
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        for node in (node_a, node_b):
            kube.delete(f"/api/v1/nodes/{node}")
            kube.delete(f"{DEVICES}/{node}")


def _ours(stack: dict[str, Any]) -> str:
    a, b = stack["nodes"]
    return f'node=~"{a}|{b}"'


def test_both_targets_are_up(stack: dict[str, Any]) -> None:
    prom = stack["prom"]
    wait_for(
        "both targets up",
        lambda: prom.targets_up() == {"koord-scheduler": "up", "koordlet": "up"},
        timeout=60,
        interval=0.5,
    )
    up = vector(prom.query("up"), "job")
    assert up == {("koord-scheduler",): 1.0, ("koordlet",): 1.0}


def test_allocated_gpu_core_per_node_matches_the_pods_annotations(stack: dict[str, Any]) -> None:
    truth: dict[tuple[str], float] = {}
    for (node, _minor), load in card_load(stack["kube"].pods(stack["ns"])).items():
        truth[(node,)] = truth.get((node,), 0.0) + load[GPU_CORE]
    assert set(truth) == {(n,) for n in stack["nodes"]}
    query = f"sum by (node) (koord_scheduler_device_allocated{{{CORE},{_ours(stack)}}})"
    got = stack["prom"].wait_query("allocation", query, lambda r: vector(r, "node") == truth)
    assert vector(got, "node") == truth == {(stack["nodes"][0],): 140.0, (stack["nodes"][1],): 80.0}


def test_pending_gpu_pods_match_the_unbound_pods(stack: dict[str, Any]) -> None:
    unbound = [p for p in stack["kube"].pods(stack["ns"]) if not p["spec"].get("nodeName")]
    assert sorted(p["metadata"]["name"] for p in unbound) == ["b-full", "huge"]
    prom = stack["prom"]
    got = prom.wait_query(
        "pending pods",
        'sum(scheduler_pending_pods{job="koord-scheduler"})',
        lambda r: bool(r) and float(r[0]["value"][1]) == len(unbound),
    )
    assert float(got[0]["value"][1]) == 2.0
    profile = f'profile="{stack["scheduler"]}"'
    rejected = prom.wait_query(
        "unschedulable pods by plugin",
        f"sum(scheduler_unschedulable_pods{{{profile}}}) >= 2",
        bool,
    )
    assert float(rejected[0]["value"][1]) >= 2.0  # each pod counts once per rejecting plugin


def test_unhealthy_cards_match_the_device_crs(stack: dict[str, Any]) -> None:
    kube, prom = stack["kube"], stack["prom"]
    truth: dict[tuple[str, str], float] = {}
    for node in stack["nodes"]:
        for dev in kube.get(f"{DEVICES}/{node}")["spec"]["devices"]:
            truth[(node, str(dev["minor"]))] = 1.0 if dev.get("health") else 0.0
    assert sorted(k for k, v in truth.items() if v == 0) == sorted(
        [(stack["nodes"][0], "3"), (stack["nodes"][1], "1")]
    )
    sched_q = f'koord_scheduler_device_healthy{{device_type="gpu",{_ours(stack)}}}'
    got = prom.wait_query("card health", sched_q, lambda r: vector(r, "node", "minor") == truth)
    assert vector(got, "node", "minor") == truth
    agent_truth = {k: v for k, v in truth.items() if k[0] == stack["nodes"][0]}
    agent = prom.wait_query(
        "koordlet card health",
        "koordlet_gpu_healthy",
        lambda r: vector(r, "node", "minor") == agent_truth,
    )
    assert vector(agent, "node", "minor") == agent_truth


def test_recording_rules_and_alerts_on_live_data(stack: dict[str, Any]) -> None:
    """rules.yaml loaded by the real server: the per-node recording rule equals the pods' truth
    and the unhealthy-card alert is pending for exactly the two unhealthy cards."""
    prom, (a, b) = stack["prom"], stack["nodes"]
    truth = {(a,): 140.0, (b,): 80.0}
    got = prom.wait_query(
        "recording rule",
        f'koord:node_gpu_core_allocated:sum{{node=~"{a}|{b}"}}',
        lambda r: vector(r, "node") == truth,
    )
    assert vector(got, "node") == truth
    alerts = prom.wait_query(
        "KoordGPUUnhealthy pending",
        f'ALERTS{{alertname="KoordGPUUnhealthy",node=~"{a}|{b}"}}',
        lambda r: len(r) == 2,
    )
    assert sorted((r["metric"]["node"], r["metric"]["minor"]) for r in alerts) == sorted(
        [(a, "3"), (b, "1")]
    )
    leader = prom.wait_query("leader gauge", "leader_election_master_status", bool)
    assert [float(r["value"][1]) for r in leader] == [1.0]  # no leader election: it leads
    info = prom.wait_query("build info", "koord_scheduler_build_info or koordlet_build_info", bool)
    assert sorted(r["metric"]["__name__"] for r in info) == [
        "koord_scheduler_build_info",
        "koordlet_build_info",
    ]


@pytest.mark.parametrize("target", ["scheduler", "koordlet"])
def test_promtool_check_metrics_is_clean(stack: dict[str, Any], target: str) -> None:
    port = stack["sched"].port if target == "scheduler" else stack["agent_port"]
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read()
    assert b"# TYPE" in text
    proc = subprocess.run(
        [stack["promtool"], "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout.decode() + proc.stderr.decode()
    )


def _dashboard_queries() -> list[tuple[str, str, bool]]:
    """(panel title, expr, expects data here) of every target of the dashboard."""
    model = json.loads(DASHBOARD.read_text())
    out = []
    for panel in model["panels"]:
        for target in panel.get("targets", []):
            # "(no data ...)": a panel this scenario does not feed (the fair-share row: no
            # node here runs koordlet's fair-share service)
            expect = not panel.get("description", "").startswith("(no data")
            out.append((panel["title"], target["expr"], expect))
    return out


GRAFANA_MACROS = {"$__rate_interval": "1m", "$node": ".*", "$job": "koord-scheduler"}


def _substitute(expr: str) -> str:
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


@pytest.mark.parametrize(
    ("title", "expr", "expect_data"), _dashboard_queries(), ids=lambda v: str(v)[:40]
)
def test_dashboard_query(stack: dict[str, Any], title: str, expr: str, expect_data: bool) -> None:
    """Every panel query parses on the real Prometheus; those this scenario feeds return data.
    The per-pod usage-vs-share row reads the fair-share metrics: it must parse, and is empty
    here (no fair-share service runs in this scenario)."""
    prom = stack["prom"]
    promql = _substitute(expr)
    doc = prom.api("query", query=promql)
    assert doc.get("status") == "success", f"{title}: {doc.get('error')}"
    if expect_data:
        prom.wait_query(title, promql, bool, timeout=60)


def test_dashboard_node_variable_lists_our_nodes(stack: dict[str, Any]) -> None:
    model = json.loads(DASHBOARD.read_text())
    (node_var,) = [v for v in model["templating"]["list"] if v["name"] == "node"]
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", node_var["definition"])
    assert match is not None
    doc = stack["prom"].api(f"label/{match[2]}/values", **{"match[]": match[1]})
    assert set(stack["nodes"]) <= set(doc["data"])


def test_explain_against_the_live_cluster(stack: dict[str, Any], apiserver: ApiServer) -> None:
    """``koord-scheduler explain`` on the live API server agrees with the objects: node B's
    cards as the Device CR and the bound pods' annotations say, the pod rejected there."""
    _, b = stack["nodes"]
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "explain", f"{stack['ns']}/b-full",
         "--kubeconfig", apiserver.kubeconfig_path(), "--config", str(stack["config"]),
         "-o", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["cards_needed"], doc["need_core"]) == (2, 100)
    (node_b,) = [n for n in doc["nodes"] if n["node"] == b]
    assert not node_b["fits"] and node_b["plugin"]
    cards = [(c["minor"], c["healthy"], c["free_core"]) for c in node_b["cards"]]
    assert cards == [(0, True, 20), (1, False, 100)]
    assert not any(c["fits"] for c in node_b["cards"])
