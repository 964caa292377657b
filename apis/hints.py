"""Device hint annotations a pod may carry (SPEC section 5), and label-selector matching.

Role: parse ``scheduling.koordinator.sh/device-allocate-hint`` (device type -> hint) and
``scheduling.koordinator.sh/device-joint-allocate`` into frozen records, and match a
``metav1.LabelSelector`` against device labels exactly as ``labels.Selector`` does.

Invariants:

- JSON is decoded the way Go does (case-insensitive field names, unknown fields ignored,
  ``null`` = absent); a ``null`` hint of a device type is dropped.
- Enum fields must be empty or one of the known values; selectors are validated like
  ``metav1.LabelSelectorAsSelector`` (operators In/NotIn/Exists/DoesNotExist, values present
  exactly for In/NotIn, label keys and values syntactically valid).  Any violation is a
  ``HintDecodeError`` whose message names the annotation and the field path.
- An empty selector (``{}``) matches everything.  NotIn and DoesNotExist match a device that
  lacks the label.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apis.allocation import GoJSONError, go_json_loads, read_list, read_object, read_string

__all__ = [
    "ALLOCATE_STRATEGIES",
    "ANNOTATION_DEVICE_ALLOCATE_HINT",
    "ANNOTATION_DEVICE_JOINT_ALLOCATE",
    "APPLY_FOR_ALL",
    "EXCLUSIVE_DEVICE_LEVEL",
    "EXCLUSIVE_PCIE_LEVEL",
    "EXCLUSIVE_POLICIES",
    "JOINT_SCOPES",
    "JOINT_SCOPE_SAME_PCIE",
    "OPERATORS",
    "OP_DOES_NOT_EXIST",
    "OP_EXISTS",
    "OP_IN",
    "OP_NOT_IN",
    "REQUESTS_AS_COUNT",
    "SCOPE_DEVICE",
    "SCOPE_NODE",
    "SCOPE_NUMA_NODE",
    "SCOPE_PCIE",
    "TOPOLOGY_SCOPES",
    "TOPOLOGY_SCOPE_LEVEL",
    "DeviceHint",
    "DeviceJointAllocate",
    "HintDecodeError",
    "LabelSelector",
    "LabelSelectorRequirement",
    "parse_allocate_hints",
    "parse_joint_allocate",
]

ANNOTATION_DEVICE_ALLOCATE_HINT: Final = "scheduling.koordinator.sh/device-allocate-hint"
ANNOTATION_DEVICE_JOINT_ALLOCATE: Final = "scheduling.koordinator.sh/device-joint-allocate"

APPLY_FOR_ALL: Final = "ApplyForAll"
REQUESTS_AS_COUNT: Final = "RequestsAsCount"
ALLOCATE_STRATEGIES: Final = (APPLY_FOR_ALL, REQUESTS_AS_COUNT)

SCOPE_DEVICE: Final = "Device"
SCOPE_PCIE: Final = "PCIe"
SCOPE_NUMA_NODE: Final = "NUMANode"
SCOPE_NODE: Final = "Node"
TOPOLOGY_SCOPES: Final = (SCOPE_DEVICE, SCOPE_PCIE, SCOPE_NUMA_NODE, SCOPE_NODE)
TOPOLOGY_SCOPE_LEVEL: Final[Mapping[str, int]] = {
    SCOPE_DEVICE: 4,
    SCOPE_PCIE: 3,
    SCOPE_NUMA_NODE: 2,
    SCOPE_NODE: 1,
}
"""Koordinator's ``DeviceTopologyScopeLevel``: narrower scopes have higher levels."""

EXCLUSIVE_DEVICE_LEVEL: Final = "DeviceLevel"
EXCLUSIVE_PCIE_LEVEL: Final = "PCIeLevel"
EXCLUSIVE_POLICIES: Final = (EXCLUSIVE_DEVICE_LEVEL, EXCLUSIVE_PCIE_LEVEL)

JOINT_SCOPE_SAME_PCIE: Final = "SamePCIe"
JOINT_SCOPES: Final = (JOINT_SCOPE_SAME_PCIE,)

OP_IN: Final = "In"
OP_NOT_IN: Final = "NotIn"
OP_EXISTS: Final = "Exists"
OP_DOES_NOT_EXIST: Final = "DoesNotExist"
OPERATORS: Final = (OP_IN, OP_NOT_IN, OP_EXISTS, OP_DOES_NOT_EXIST)

_NAME_RE: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN_RE: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


class HintDecodeError(ValueError):
    """A malformed hint annotation; the message names the annotation and the field."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def _label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (``validation.IsQualifiedName``), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix)):
        return f"invalid label key {json.dumps(key)}: prefix must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _NAME_RE.fullmatch(name):
        return (
            f"invalid label key {json.dumps(key)}: name part must be 1-63 alphanumeric "
            "characters, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    return None


def _label_value_problem(value: str) -> str | None:
    if value and (len(value) > 63 or not _NAME_RE.fullmatch(value)):
        return (
            f"invalid label value {json.dumps(value)}: must be at most 63 alphanumeric "
            "characters, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    return None


@dataclass(frozen=True, slots=True)
class LabelSelectorRequirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """``labels.Requirement.Matches``."""
        if self.operator == OP_IN:
            return self.key in labels and labels[self.key] in self.values
        if self.operator == OP_NOT_IN:
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == OP_EXISTS:
            return self.key in labels
        return self.key not in labels


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: every matchLabels pair and every expression must hold."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(r.matches(labels) for r in self.match_expressions)

    @classmethod
    def from_json(cls, v: object, path: str) -> LabelSelector | None:
        """Decode and validate a selector from ``go_json_loads`` output (None for null)."""
        obj = read_object(v, path)
        if obj is None:
            return None
        f = obj.fields(("matchLabels", "matchExpressions"))
        labels_obj = read_object(f.get("matchLabels"), f"{path}.matchLabels")
        match_labels: dict[str, str] = {}
        for key, value in labels_obj.as_map().items() if labels_obj is not None else ():
            where = f"{path}.matchLabels[{json.dumps(key)}]"
            text = read_string(value, where)
            problem = _label_key_problem(key) or _label_value_problem(text)
            if problem:
                raise GoJSONError(where, problem)
            match_labels[key] = text
        exprs = read_list(f.get("matchExpressions"), f"{path}.matchExpressions")
        requirements = tuple(
            _requirement(e, f"{path}.matchExpressions[{i}]") for i, e in enumerate(exprs)
        )
        return cls(match_labels, requirements)


def _requirement(v: object, path: str) -> LabelSelectorRequirement:
    obj = read_object(v, path)
    f = obj.fields(("key", "operator", "values")) if obj is not None else {}
    key = read_string(f.get("key"), f"{path}.key")
    operator = read_string(f.get("operator"), f"{path}.operator")
    values = tuple(
        read_string(x, f"{path}.values[{i}]")
        for i, x in enumerate(read_list(f.get("values"), f"{path}.values"))
    )
    if operator not in OPERATORS:
        raise GoJSONError(
            f"{path}.operator", f"{json.dumps(operator)} is not a valid label selector operator"
        )
    problem = _label_key_problem(key)
    if problem:
        raise GoJSONError(f"{path}.key", problem)
    if operator in (OP_IN, OP_NOT_IN) and not values:
        raise GoJSONError(
            f"{path}.values", "for 'In', 'NotIn' operators, values set can't be empty"
        )
    if operator in (OP_EXISTS, OP_DOES_NOT_EXIST) and values:
        raise GoJSONError(
            f"{path}.values", "values set must be empty for exists and does not exist"
        )
    for i, value in enumerate(values):
        problem = _label_value_problem(value)
        if problem:
            raise GoJSONError(f"{path}.values[{i}]", problem)
    return LabelSelectorRequirement(key, operator, values)


def _enum(v: object, path: str, allowed: tuple[str, ...]) -> str:
    text = read_string(v, path)
    if text and text not in allowed:
        want = " or ".join(allowed)
        raise GoJSONError(path, f"unknown value {json.dumps(text)} (want {want})")
    return text


@dataclass(frozen=True, slots=True)
class DeviceHint:
    """Koordinator's ``DeviceHint``; empty strings mean "not set"."""

    selector: LabelSelector | None = None
    vf_selector: LabelSelector | None = None
    allocate_strategy: str = ""
    required_topology_scope: str = ""
    exclusive_policy: str = ""

    def matches(self, device_labels: Mapping[str, str]) -> bool:
        """Whether a device passes ``selector`` (no selector: every device does)."""
        return self.selector is None or self.selector.matches(device_labels)


def _hint(v: object, path: str) -> DeviceHint | None:
    obj = read_object(v, path)
    if obj is None:
        return None
    names = (
        "selector",
        "vfSelector",
        "allocateStrategy",
        "requiredTopologyScope",
        "exclusivePolicy",
    )
    f = obj.fields(names)
    return DeviceHint(
        selector=LabelSelector.from_json(f.get("selector"), f"{path}.selector"),
        vf_selector=LabelSelector.from_json(f.get("vfSelector"), f"{path}.vfSelector"),
        allocate_strategy=_enum(
            f.get("allocateStrategy"), f"{path}.allocateStrategy", ALLOCATE_STRATEGIES
        ),
        required_topology_scope=_enum(
            f.get("requiredTopologyScope"), f"{path}.requiredTopologyScope", TOPOLOGY_SCOPES
        ),
        exclusive_policy=_enum(
            f.get("exclusivePolicy"), f"{path}.exclusivePolicy", EXCLUSIVE_POLICIES
        ),
    )


def parse_allocate_hints(s: str) -> dict[str, DeviceHint]:
    """Parse ``device-allocate-hint``: device type -> hint; raises ``HintDecodeError``."""
    try:
        top = read_object(go_json_loads(s), "")
        out: dict[str, DeviceHint] = {}
        for device_type, value in top.as_map().items() if top is not None else ():
            hint = _hint(value, device_type)
            if hint is not None:
                out[device_type] = hint
    except GoJSONError as err:
        raise HintDecodeError(
            f"invalid {ANNOTATION_DEVICE_ALLOCATE_HINT} annotation: {err}"
        ) from None
    return out


@dataclass(frozen=True, slots=True)
class DeviceJointAllocate:
    """Koordinator's ``DeviceJointAllocate``: device types allocated together in a scope."""

    device_types: tuple[str, ...] = ()
    required_scope: str = ""


def parse_joint_allocate(s: str) -> DeviceJointAllocate:
    """Parse ``device-joint-allocate``; raises ``HintDecodeError``."""
    try:
        obj = read_object(go_json_loads(s), "")
        f: dict[str, Any] = obj.fields(("deviceTypes", "requiredScope")) if obj is not None else {}
        types = read_list(f.get("deviceTypes"), "deviceTypes")
        return DeviceJointAllocate(
            device_types=tuple(read_string(t, f"deviceTypes[{i}]") for i, t in enumerate(types)),
            required_scope=_enum(f.get("requiredScope"), "requiredScope", JOINT_SCOPES),
        )
    except GoJSONError as err:
        raise HintDecodeError(
            f"invalid {ANNOTATION_DEVICE_JOINT_ALLOCATE} annotation: {err}"
        ) from None
