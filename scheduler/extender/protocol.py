"""The extender wire format: ``k8s.io/kube-scheduler/extender/v1`` JSON (SPEC §10).

Role: decode what kube-scheduler POSTs to an extender and encode what it expects back, for
the verbs filter, prioritize, bind and preempt. Pure: bytes/JSON in, records out, no I/O.

Facts kept: ``ExtenderArgs`` is ``{"pod", "nodes"?, "nodenames"?}`` (``nodenames`` when the
extender is ``nodeCacheCapable``, a ``NodeList`` otherwise); ``ExtenderFilterResult`` is
``{"nodes"?, "nodenames"?, "failedNodes", "failedAndUnresolvableNodes"?, "error"}``;
``ExtenderBindingArgs`` has no json tags (keys ``PodName``, ``PodNamespace``, ``PodUID``,
``Node``) and its result is ``{"Error"}``; ``HostPriorityList`` is ``[{"host", "score"}]`` with
scores in ``[0, MAX_EXTENDER_PRIORITY]``; preemption maps node names to victims. Go's JSON
decoder matches keys case-insensitively, so incoming keys are matched the same way here.

Invariants: a malformed request raises ``ExtenderRequestError`` with one message naming the
field; nothing here guesses a value that was not sent. Bodies decode with
``apis.jsonload.loads`` (anything kube-scheduler sends: a tenant's pod with managedFields
nested 1,500 levels; deeper than ``MAX_DEPTH`` is a 400), and ``metadata.managedFields`` is
dropped from the pod and the nodes as they are decoded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apis.core import DecodeError, Pod, decode_pod, drop_managed_fields
from apis.jsonload import MAX_DEPTH, JSONDecodeDepthError, loads

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "BindingArgs",
    "ExtenderArgs",
    "ExtenderRequestError",
    "FilterResult",
    "PreemptionArgs",
    "decode_binding_args",
    "decode_extender_args",
    "decode_preemption_args",
    "encode_binding_result",
    "encode_filter_result",
    "encode_preemption_result",
    "encode_priorities",
]

MAX_EXTENDER_PRIORITY: Final = 10
"""kube-scheduler's ``extenderv1.MaxExtenderPriority``: it scales our scores by 100/10."""


class ExtenderRequestError(ValueError):
    """A request body kube-scheduler would never send (answered 400)."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Pod
    node_names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None = None
    """The raw Node objects when the caller sent a NodeList (not node-cache-capable)."""


@dataclass(frozen=True, slots=True)
class BindingArgs:
    namespace: str
    name: str
    uid: str
    node: str


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: Pod
    victims: Mapping[str, tuple[tuple[str, ...], int]]
    """Node name -> (victim UIDs, number of PDB violations)."""
    meta: bool
    """True when the caller sent ``nodeNameToMetaVictims`` (answer in kind)."""


@dataclass(slots=True)
class FilterResult:
    node_names: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""


def _load(body: bytes) -> Mapping[str, Any]:
    try:
        obj = loads(body)
    except JSONDecodeDepthError:  # a hostile body: [[[[...]]]] 100,000 deep
        raise ExtenderRequestError(
            f"request body is JSON nested too deeply (over {MAX_DEPTH} levels)"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise ExtenderRequestError(f"request body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ExtenderRequestError("request body must be a JSON object")
    return obj


def _get(obj: Mapping[str, Any], key: str) -> Any:
    """``obj[key]`` matched case-insensitively, like Go's encoding/json; None when absent."""
    if key in obj:
        return obj[key]
    low = key.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def _pod(obj: Mapping[str, Any]) -> Pod:
    raw = drop_managed_fields(_get(obj, "pod"))
    if not isinstance(raw, dict):
        raise ExtenderRequestError('"pod" is missing or not an object')
    try:
        return decode_pod(raw)
    except DecodeError as exc:
        raise ExtenderRequestError(f"pod: {exc}") from None


def decode_extender_args(body: bytes) -> ExtenderArgs:
    """The body of filter and prioritize."""
    obj = _load(body)
    pod = _pod(obj)
    names = _get(obj, "nodenames")
    nodes = _get(obj, "nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ExtenderRequestError('"nodenames" must be a list of strings')
        return ExtenderArgs(pod, tuple(names))
    if isinstance(nodes, dict):
        drop_managed_fields(nodes)  # a NodeList: from each of its items
        items = _get(nodes, "items") or []
        if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
            raise ExtenderRequestError('"nodes.items" must be a list of Node objects')
        node_names = []
        for n in items:
            meta = n.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise ExtenderRequestError('a node in "nodes.items" has no metadata.name')
            node_names.append(name)
        return ExtenderArgs(pod, tuple(node_names), tuple(items))
    raise ExtenderRequestError('neither "nodenames" nor "nodes" was sent')


def decode_binding_args(body: bytes) -> BindingArgs:
    obj = _load(body)
    values = []
    for key in ("PodNamespace", "PodName", "PodUID", "Node"):
        value = _get(obj, key)
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise ExtenderRequestError(f'"{key}" is missing or not a string')
        values.append(value)
    return BindingArgs(*values)


def _victims(raw: Any, meta: bool) -> tuple[tuple[str, ...], int]:
    if not isinstance(raw, dict):
        raise ExtenderRequestError("a node's victims must be an object")
    pods = _get(raw, "pods") or []
    if not isinstance(pods, list):
        raise ExtenderRequestError('victims "pods" must be a list')
    uids: list[str] = []
    for p in pods:
        if not isinstance(p, dict):
            raise ExtenderRequestError("a victim must be an object")
        if meta:
            uid = _get(p, "uid")
        else:
            m = p.get("metadata")
            uid = m.get("uid") if isinstance(m, dict) else None
        if not isinstance(uid, str) or not uid:
            raise ExtenderRequestError("a victim has no uid")
        uids.append(uid)
    violations = _get(raw, "numPDBViolations") or 0
    if not isinstance(violations, int):
        raise ExtenderRequestError('"numPDBViolations" must be an integer')
    return tuple(uids), violations


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    obj = _load(body)
    pod = _pod(obj)
    meta_map = _get(obj, "nodeNameToMetaVictims")
    full_map = _get(obj, "nodeNameToVictims")
    meta = isinstance(meta_map, dict) and bool(meta_map)
    source = meta_map if meta else full_map
    if source is None:
        source = {}
    if not isinstance(source, dict):
        raise ExtenderRequestError("victims must be a map of node name to victims")
    victims = {str(node): _victims(v, meta) for node, v in source.items()}
    return PreemptionArgs(pod, victims, meta)


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def encode_filter_result(result: FilterResult, nodes: Sequence[Mapping[str, Any]] | None) -> bytes:
    out: dict[str, Any] = {"failedNodes": result.failed}
    if nodes is None:
        out["nodenames"] = result.node_names
    else:
        keep = set(result.node_names)
        out["nodes"] = {
            "apiVersion": "v1",
            "kind": "NodeList",
            "items": [n for n in nodes if n["metadata"]["name"] in keep],
        }
    if result.unresolvable:
        out["failedAndUnresolvableNodes"] = result.unresolvable
    if result.error:
        out["error"] = result.error
    return _dump(out)


def encode_priorities(scores: Sequence[tuple[str, int]]) -> bytes:
    return _dump([{"host": host, "score": score} for host, score in scores])


def encode_binding_result(error: str) -> bytes:
    return _dump({"Error": error})


def encode_preemption_result(victims: Mapping[str, tuple[tuple[str, ...], int]]) -> bytes:
    return _dump(
        {
            "nodeNameToMetaVictims": {
                node: {"pods": [{"uid": uid} for uid in uids], "numPDBViolations": n}
                for node, (uids, n) in victims.items()
            }
        }
    )
