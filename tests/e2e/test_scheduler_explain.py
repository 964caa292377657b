"""``/debug/explain/NS/POD`` of a running ``koord-scheduler run``: the pending pod's per-node
and per-card reasons from the scheduler's own state, over HTTP."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_explain_a_pending_pod_from_the_running_scheduler(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    scheduler = uid("koord-e2e")
    ns = kube.ensure_namespace(uid("explain"))
    node = uid("gpu")
    kube.add_gpu_node(node, gpus=2, memory="16Gi", labels={"e2e-group": scheduler})
    selector = {"e2e-group": scheduler}
    proc = SchedulerProcess(
        apiserver.kubeconfig_path(), scheduler_config(tmp_path / "c.yaml", scheduler), tmp_path
    ).start()
    try:
        proc.wait_ready()
        big = [shared_gpu(f"big{i}", scheduler, 80, node_selector=selector) for i in range(2)]
        kube.create_pods(ns, big)
        wait_for(
            "the two big pods to bind",
            lambda: all(kube.get(f"/api/v1/namespaces/{ns}/pods/big{i}")["spec"].get("nodeName")
                        for i in range(2)),
            timeout=60,
        )  # fmt: skip
        kube.create_pods(ns, [shared_gpu("waiting", scheduler, 50, node_selector=selector)])

        def answered() -> dict[str, Any] | None:
            code, body = _get(proc.port, f"/debug/explain/{ns}/waiting")
            return json.loads(body) if code == 200 else None

        doc = wait_for("an explanation", answered, timeout=30, interval=0.5)
        assert doc["pod"] == f"{ns}/waiting"
        [entry] = [n for name, n in _nodes(doc).items() if name == node]
        # The node-level gpu-core total (200) is exhausted first, so NodeResourcesFit rejects.
        assert not entry["fits"] and entry["plugin"] == "NodeResourcesFit"
        assert any("koordinator.sh/gpu-core" in r for r in entry["reasons"])
        assert sorted(c["free_core"] for c in entry["cards"]) == [20, 20]

        code, table = _get(proc.port, f"/debug/explain/{ns}/waiting?o=table")
        assert code == 200 and node in table
        assert _get(proc.port, f"/debug/explain/{ns}/nobody")[0] == 404
        assert _get(proc.port, f"/debug/explain/{ns}/big0")[0] == 409  # already bound
    finally:
        proc.stop()


def _nodes(doc: dict[str, Any]) -> dict[str, Any]:
    nodes = doc["nodes"]
    return nodes if isinstance(nodes, dict) else {n["node"]: n for n in nodes}
