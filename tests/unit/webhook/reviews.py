"""Builders of the AdmissionReviews the API server sends, for the webhook's tests."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.webhook.review import Review, decode_review


def pod(
    name: str = "p",
    *,
    limits: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler: str | None = "default-scheduler",
    node: str = "",
    init: Sequence[Mapping[str, Any]] = (),
    containers: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod as the API server hands it to admission (defaults applied: schedulerName)."""
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    spec: dict[str, Any] = {
        "containers": list(containers)
        if containers is not None
        else [{"name": "main", "image": "busybox", "resources": resources}]
    }
    if init:
        spec["initContainers"] = list(init)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def review_doc(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    user: str = "alice",
    groups: Sequence[str] = (),
    resource: tuple[str, str, str] = ("", "v1", "pods"),
    sub_resource: str = "",
    api_version: str = "admission.k8s.io/v1",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": dict(zip(("group", "version", "resource"), resource, strict=True)),
        "operation": operation,
        "namespace": "team-a",
        "name": (obj or old or {}).get("metadata", {}).get("name", ""),
        "userInfo": {"username": user, "groups": list(groups)},
        "object": obj,
        "oldObject": old,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def review(obj: Mapping[str, Any] | None, **kw: Any) -> Review:
    return decode_review(json.dumps(review_doc(obj, **kw)).encode())


def body(obj: Mapping[str, Any] | None, **kw: Any) -> bytes:
    return json.dumps(review_doc(obj, **kw)).encode()


def response(answer: bytes) -> dict[str, Any]:
    doc = json.loads(answer)
    assert doc["kind"] == "AdmissionReview"
    return dict(doc["response"])


def patch_of(resp: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in resp:
        return []
    assert resp["patchType"] == "JSONPatch"
    return list(json.loads(base64.b64decode(resp["patch"])))


def _parts(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def apply_patch(doc: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace/remove over object members (all the webhook emits)."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for op in patch:
        *parents, last = _parts(op["path"])
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "remove":
            del target[last]
        elif op["op"] == "replace":
            assert last in target, op
            target[last] = op["value"]
        else:
            assert op["op"] == "add", op
            target[last] = op["value"]
    return out
