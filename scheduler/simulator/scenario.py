"""Scenario files for ``koord-scheduler simulate``: multi-document YAML of Kubernetes objects.

A scenario holds v1 Nodes, ``scheduling.koordinator.sh/v1alpha1`` Devices and v1 Pods (and
PodDisruptionBudgets, PriorityClasses and ``scheduling.sigs.k8s.io/v1alpha1`` PodGroups), as
separate documents or inside ``kind: List`` documents. Pods with ``spec.nodeName`` are already
running; the rest are to be scheduled, in file order.

Objects are checked as the API server would check them (``scheduler.simulator.validation``:
strict field names, whole-number extended resources with request == limit, at least one named
container, no duplicate card minors), and a key repeated in one YAML mapping is an error.

Invariants: loading either returns a fully decoded scenario or raises ``ScenarioError`` whose
one-line message names the file, the document (1-based) and the field — never a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from apis.core import DecodeError, decode_node, decode_pod
from apis.device import Device
from apis.disruption import decode_pdb
from apis.gang import POD_GROUP_API_VERSION, GangSpecError, decode_pod_group
from apis.jsonshow import show
from apis.yamlload import HAVE_LIBYAML, Progress, load_all
from scheduler.simulator.validation import check_object

DEVICE_API_VERSION = "scheduling.koordinator.sh/v1alpha1"
_KINDS = {
    ("v1", "Node"),
    ("v1", "Pod"),
    (DEVICE_API_VERSION, "Device"),
    ("policy/v1", "PodDisruptionBudget"),
    ("policy/v1beta1", "PodDisruptionBudget"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    (POD_GROUP_API_VERSION, "PodGroup"),
}


class _DuplicateKey(ConstructorError):
    pass


class _RefuseDuplicateKeys:
    """A safe loader's mapping constructor, refusing a key repeated in one mapping (the API
    server's strict JSON decoding does; PyYAML would keep the last value silently)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if duplicate:
                raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc,no-any-return]


class _NoDuplicateKeys(_RefuseDuplicateKeys, yaml.SafeLoader):
    """The pure-Python safe loader refusing duplicate keys (its errors are the ones shown)."""


_C_NO_DUPLICATE_KEYS: type[Any] | None = (
    type("_CNoDuplicateKeys", (_RefuseDuplicateKeys, yaml.CSafeLoader), {})
    if HAVE_LIBYAML
    else None
)
"""The same on libyaml's parser, tried first (``apis.yamlload``)."""


class ScenarioError(ValueError):
    """Bad scenario input; ``str()`` is one line naming file, document and field."""


@dataclass(slots=True)
class Scenario:
    """Raw objects, validated, in file order (each is decoded again by the cluster on write)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    pdbs: list[dict[str, Any]] = field(default_factory=list)
    pod_groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def running_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if (p.get("spec") or {}).get("nodeName")]

    @property
    def pending_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if not (p.get("spec") or {}).get("nodeName")]


STDIN = "-"
"""The path that means standard input (``koord-scheduler simulate -``)."""


def load_scenario(path: str | os.PathLike[str], progress: Progress | None = None) -> Scenario:
    """The scenario of the file ``path``, or of standard input for ``-`` (named ``<stdin>``
    in messages); ``progress(documents parsed, documents in all)`` follows a long parse."""
    name = os.fspath(path)
    if name == STDIN:
        name = "<stdin>"
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ScenarioError(f"{name}: not UTF-8 text") from None
        return parse_scenario(text, name, progress)
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ScenarioError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{name}: not UTF-8 text") from None
    return parse_scenario(text, name, progress)


def parse_scenario(
    text: str, source: str = "<scenario>", progress: Progress | None = None
) -> Scenario:
    scenario = Scenario()
    seen: dict[tuple[str, str], int] = {}
    classes: dict[str, tuple[int, str]] = {}
    for doc_no, index, obj in _objects(text, source, progress):
        where = f"{source}: document {doc_no}" + (f", item {index}" if index is not None else "")
        if not isinstance(obj, Mapping):
            raise ScenarioError(f"{where}: expected a Kubernetes object, got {_kind_of(obj)}")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if (
            not isinstance(api_version, str)
            or not isinstance(kind, str)
            or (api_version, kind) not in _KINDS
        ):
            raise ScenarioError(
                f"{where}: unsupported object apiVersion={_named(api_version)} kind={_named(kind)} "
                f"(expected v1 Node, v1 Pod, {DEVICE_API_VERSION} Device, policy "
                "PodDisruptionBudget, scheduling.k8s.io/v1 PriorityClass or "
                f"{POD_GROUP_API_VERSION} PodGroup)"
            )
        raw_meta = obj.get("metadata")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
        label = f"{where} ({kind} {meta.get('name', '?')!s})"
        try:
            if kind == "Node":
                key = decode_node(obj).name
            elif kind == "Pod":
                key = decode_pod(obj).key
            elif kind == "PodDisruptionBudget":
                key = decode_pdb(obj).key
            elif kind == "PriorityClass":
                key = _priority_class(obj)[0]
            elif kind == "PodGroup":
                key = decode_pod_group(obj).key
            else:
                key = Device.from_dict(obj).name
            check_object(kind, obj)
        except (DecodeError, GangSpecError, ValueError) as exc:
            raise ScenarioError(f"{label}: {exc}") from None
        first = seen.get((kind, key))
        if first is not None:
            raise ScenarioError(
                f"{label}: duplicate {kind} {key!r} (first defined in document {first})"
            )
        seen[(kind, key)] = doc_no
        if kind == "PriorityClass":
            name, value, policy = _priority_class(obj)
            classes[name] = (value, policy)
            continue
        target = {
            "Node": scenario.nodes,
            "Pod": scenario.pods,
            "Device": scenario.devices,
            "PodDisruptionBudget": scenario.pdbs,
            "PodGroup": scenario.pod_groups,
        }
        target[kind].append(dict(obj))
    scenario.pods = [_with_priority(p, classes, source) for p in scenario.pods]
    for dev in scenario.devices:
        name = dev["metadata"]["name"]
        if ("Node", name) not in seen:
            raise ScenarioError(
                f"{source}: document {seen[('Device', name)]} (Device {name}): "
                f"no Node named {name!r} (a Device is named after its node)"
            )
    return scenario


def _objects(
    text: str, source: str, progress: Progress | None = None
) -> Iterator[tuple[int, int | None, Any]]:
    try:
        docs = load_all(text, _NoDuplicateKeys, _C_NO_DUPLICATE_KEYS, progress)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        doc_no = text.count("\n---", 0, _offset(text, mark.line) if mark else 0) + 1
        raise ScenarioError(
            f"{source}: document {doc_no}: "
            + (
                f"{exc.problem} at {where}"
                if isinstance(exc, _DuplicateKey)
                else f"malformed YAML at {where}: {exc.problem}"
            )
        ) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: malformed YAML: {exc}") from None
    for doc_no, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if isinstance(doc, Mapping) and doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ScenarioError(f"{source}: document {doc_no}: List items must be a list")
            for i, item in enumerate(items):
                yield doc_no, i, item
        else:
            yield doc_no, None, doc


def _offset(text: str, line: int) -> int:
    pos = 0
    for _ in range(line):
        nxt = text.find("\n", pos)
        if nxt < 0:
            return len(text)
        pos = nxt + 1
    return pos


def _named(value: Any) -> str:
    """A field's value in an error: as Python writes a string or None, anything else (a YAML
    value may be huge or share subtrees) through ``apis.jsonshow.show``."""
    return repr(value) if value is None or isinstance(value, str) else show(value)


def _kind_of(obj: Any) -> str:
    return "a list" if isinstance(obj, list) else type(obj).__name__


def _priority_class(obj: Mapping[str, Any]) -> tuple[str, int, str]:
    """(name, value, preemptionPolicy) of a PriorityClass; raises ``DecodeError``."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise DecodeError("metadata.name", "must be non-empty")
    value = obj.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError("value", f"expected an integer, got {value!r}")
    policy = obj.get("preemptionPolicy") or "PreemptLowerPriority"
    if policy not in ("PreemptLowerPriority", "Never"):
        raise DecodeError("preemptionPolicy", f"unknown policy {policy!r}")
    return name, value, str(policy)


def _with_priority(
    pod: dict[str, Any], classes: Mapping[str, tuple[int, str]], source: str
) -> dict[str, Any]:
    """What the API server's Priority admission does: a pod naming a PriorityClass gets its
    value (and preemption policy) unless it states its own."""
    spec = pod.get("spec") or {}
    name = spec.get("priorityClassName")
    if not name or spec.get("priority") is not None:
        return pod
    if name not in classes:
        key = f"{(pod.get('metadata') or {}).get('namespace') or 'default'}/"
        key += str((pod.get("metadata") or {}).get("name"))
        raise ScenarioError(f"{source}: Pod {key}: no PriorityClass named {name!r}")
    value, policy = classes[name]
    out = dict(pod)
    out["spec"] = {**spec, "priority": value}
    out["spec"].setdefault("preemptionPolicy", policy)
    return out
