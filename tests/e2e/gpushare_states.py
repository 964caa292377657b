"""The cluster states of the ``kubectl inspect gpushare`` goldens, put on a real API server.

Library, not a test module: ``hack/gpushare-inspect-golden/record.py`` loads each state and runs
gpushare's own plugin on it; ``test_kubectl_inspect_gpushare.py`` loads the same states and runs
ours. A state is a multi-document YAML file of Nodes and Pods (``tests/unit/fixtures/
gpushare-inspect/<state>.yaml``, the ``--file`` input of the unit tests): Nodes are created
with their status (the API server keeps a Node's status on create), Pods bound (``nodeName``),
then given their ``status.phase`` when it is not Pending (create resets a Pod's status).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import yaml

__all__ = ["GOLDEN", "STATES_DIR", "clear_state", "load_state", "state_objects"]

STATES_DIR = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "gpushare-inspect"
GOLDEN = STATES_DIR / "golden.json"


class _Kube(Protocol):
    def get(self, path: str) -> dict[str, Any]: ...
    def post(self, path: str, body: Any) -> dict[str, Any]: ...
    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]: ...
    def delete(self, path: str) -> None: ...


def state_objects(state: str) -> list[dict[str, Any]]:
    with (STATES_DIR / f"{state}.yaml").open() as f:
        return [o for o in yaml.safe_load_all(f) if o]


def _pod_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


def load_state(kube: _Kube, state: str) -> None:
    objects = state_objects(state)
    for ns in sorted({o["metadata"]["namespace"] for o in objects if o["kind"] == "Pod"}):
        try:
            kube.get(f"/api/v1/namespaces/{ns}")
        except Exception:
            try:
                kube.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns}})  # fmt: skip
            except Exception as exc:  # a fresh API server makes "default" itself, meanwhile
                if "AlreadyExists" not in str(exc):
                    raise
    for obj in objects:
        if obj["kind"] == "Node":
            kube.post("/api/v1/nodes", obj)
            continue
        body = json.loads(json.dumps(obj))
        body["metadata"].pop("uid", None)
        phase = body.pop("status", {}).get("phase", "Pending")
        created = kube.post(f"/api/v1/namespaces/{obj['metadata']['namespace']}/pods", body)
        if phase != "Pending":
            created["status"] = {"phase": phase}
            kube.request("PUT", _pod_path(obj) + "/status", created)


def clear_state(kube: _Kube, state: str) -> None:
    for obj in state_objects(state):
        if obj["kind"] == "Node":
            kube.delete(f"/api/v1/nodes/{obj['metadata']['name']}")
        else:
            kube.delete(_pod_path(obj))
