"""``kubectl inspect gpushare`` through Debian's kubectl 1.20 (``kubernetes-client``, via
``hack/kubectl.sh``): kubectl finds our ``kubectl-inspect-gpushare`` on PATH and runs it
against a real API server. By default it prints what gpushare's own plugin printed on the same
cluster states (the recorded goldens of tests/unit/test_gpushare_display.py); with ``--koord``
a koordinator pod and a gpushare pod sharing one node are both counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpushare_states import GOLDEN, clear_state, load_state
from prometheus import hack_values
from test_scheduler_harness import ALLOCATED, DEVICES, GPU_CORE, GPU_MEMORY, GPU_RATIO, Kube, uid

if TYPE_CHECKING:
    from apiserver import ApiServer

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kubectl() -> str:
    return hack_values(REPO / "hack" / "kubectl.sh", ("KUBECTL_BIN",), "kubectl")["KUBECTL_BIN"]


def _pod(name: str, node: str, annotations: dict[str, str], limits: dict[str, str]) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def _env(apiserver: ApiServer) -> dict[str, str]:
    return {
        **os.environ,
        "KUBECONFIG": apiserver.kubeconfig_path(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def test_kubectl_inspect_gpushare_prints_the_originals_output(
    kubectl: str, make_apiserver: Callable[..., ApiServer]
) -> None:
    """Every recorded state and argument list, on a fresh API server (the original lists every
    node of the cluster: the shared server holds other tests' nodes)."""
    apiserver = make_apiserver()
    kube = Kube(apiserver.url, apiserver.admin_token)
    env = _env(apiserver)
    for state, runs in json.loads(GOLDEN.read_text())["states"].items():
        load_state(kube, state)
        try:
            for run in runs:
                proc = subprocess.run([kubectl, "inspect", "gpushare", *run["args"]], env=env,
                                      capture_output=True, text=True, timeout=60)  # fmt: skip
                expected = [o if o.endswith("\n") else o + "\n" for o in run["outputs"]]
                assert proc.returncode == run["rc"], (state, run["args"], proc.stderr)
                assert proc.stdout in expected, (state, run["args"], proc.stdout)
        finally:
            clear_state(kube, state)


def test_kubectl_inspect_gpushare_koord_shows_both_kinds_of_pods(
    kubectl: str, apiserver: ApiServer
) -> None:
    kube = Kube(apiserver.url, apiserver.admin_token)
    kube.ensure_device_crd()
    ns = kube.ensure_namespace(uid("inspect"))
    node = uid("gs")
    kube.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.1.2.3"}]},
        },
    )
    cards = [
        {
            "type": "gpu",
            "id": f"GPU-{m}",
            "minor": m,
            "health": True,
            "resources": {GPU_CORE: "100", GPU_MEMORY: "16Gi", GPU_RATIO: "100"},
        }
        for m in range(2)
    ]
    kube.post(
        DEVICES,
        {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Device",
            "metadata": {"name": node},
            "spec": {"devices": cards},
        },
    )
    koord = {
        "gpu": [{"minor": 0, "resources": {GPU_CORE: "50", GPU_MEMORY: "8Gi", GPU_RATIO: "50"}}]
    }
    pods = [
        _pod("koord", node, {ALLOCATED: json.dumps(koord)}, {GPU_CORE: "50", GPU_RATIO: "50"}),
        _pod(
            "gpushare",
            node,
            {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "4"},
            {"aliyun.com/gpu-mem": "4"},
        ),
    ]
    for body in pods:
        kube.post(f"/api/v1/namespaces/{ns}/pods", body)
    env = _env(apiserver)
    try:
        table = subprocess.run(
            [kubectl, "inspect", "gpushare", "--koord"], env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert table.returncode == 0, table.stderr
        (row,) = [ln for ln in table.stdout.splitlines() if ln.startswith(node)]
        cells = row.split()
        # one GPU column per card of the node with the most cards in the whole cluster (other
        # tests' nodes share this API server): this node's missing cards print 0/0
        assert cells[:4] == [node, "10.1.2.3", "8/16", "4/16"] and cells[-1] == "12/32"
        assert set(cells[4:-1]) <= {"0/0"}
        details = subprocess.run(
            [kubectl, "inspect", "gpushare", "--koord", "-d"], env=env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert details.returncode == 0, details.stderr
        text = details.stdout
        section = text[text.index(f"NAME:       {node}") :]
        assert "IPADDRESS:  10.1.2.3" in section
        lines = {ln.split()[0]: ln.split() for ln in section.splitlines() if ln.strip()}
        assert lines["koord"] == ["koord", ns, "8", "0"]
        assert lines["gpushare"] == ["gpushare", ns, "0", "4"]
    finally:
        for body in pods:
            kube.delete(f"/api/v1/namespaces/{ns}/pods/{body['metadata']['name']}")
        kube.delete(f"{DEVICES}/{node}")
        kube.delete(f"/api/v1/nodes/{node}")
