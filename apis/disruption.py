"""PodDisruptionBudgets as preemption reads them (``policy/v1`` and ``policy/v1beta1``).

Role: decode a PodDisruptionBudget into the few fields kube-scheduler's preemption uses
(``filterPodsWithPDBViolation``): its namespace, its selector, ``status.disruptionsAllowed``
and ``status.disruptedPods``. Both API versions share these fields; the API server that the
scheduler talks to decides which one is served (v1.20 serves only ``policy/v1beta1``).

Invariants: pure, stdlib only; a PDB whose selector is absent or empty matches no pod (as
kube-scheduler's preemption treats it, unlike a Deployment's selector); a status the
disruption controller has not written yet allows no disruption (``disruptionsAllowed`` 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis.core import DecodeError, Pod, _mapping, _str
from apis.hints import LabelSelector, LabelSelectorRequirement

# The same field readers as every v1 decoder of apis.core.
from apis.jsonshow import show

__all__ = ["PodDisruptionBudget", "decode_pdb"]

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    selector: LabelSelector | None = None
    """None (or empty): matches nothing."""
    disruptions_allowed: int = 0
    disrupted_pods: frozenset[str] = field(default_factory=frozenset)
    """Names of pods the disruption controller already counts as disrupted."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def matches(self, pod: Pod) -> bool:
        """The budget covers ``pod``: same namespace and a non-empty selector that matches."""
        selector = self.selector
        if pod.namespace != self.namespace or selector is None:
            return False
        if not selector.match_labels and not selector.match_expressions:
            return False
        return selector.matches(pod.labels)


def _selector(value: Any, path: str) -> LabelSelector | None:
    if value is None:
        return None
    obj = _mapping(value, path)
    labels = {
        _str(k, f"{path}.matchLabels"): _str(v, f"{path}.matchLabels[{k}]")
        for k, v in _mapping(obj.get("matchLabels"), f"{path}.matchLabels").items()
    }
    exprs = obj.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise DecodeError(f"{path}.matchExpressions", "expected a list")
    requirements = []
    for i, raw in enumerate(exprs):
        where = f"{path}.matchExpressions[{i}]"
        e = _mapping(raw, where)
        operator = _str(e.get("operator"), f"{where}.operator")
        if operator not in _OPERATORS:
            raise DecodeError(f"{where}.operator", f"unknown operator {operator!r}")
        values = e.get("values") or []
        if not isinstance(values, list):
            raise DecodeError(f"{where}.values", "expected a list")
        requirements.append(
            LabelSelectorRequirement(
                _str(e.get("key"), f"{where}.key"),
                operator,
                tuple(_str(v, f"{where}.values") for v in values),
            )
        )
    return LabelSelector(labels, tuple(requirements))


def decode_pdb(obj: Mapping[str, Any]) -> PodDisruptionBudget:
    """A ``policy/v1`` or ``policy/v1beta1`` PodDisruptionBudget; raises ``DecodeError``."""
    obj = _mapping(obj, "")
    meta = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    name = _str(meta.get("name"), "metadata.name")
    if not name:
        raise DecodeError("metadata.name", "must be non-empty")
    namespace = _str(meta.get("namespace"), "metadata.namespace") or "default"
    allowed = status.get("disruptionsAllowed", 0)
    if allowed is None:
        allowed = 0
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise DecodeError("status.disruptionsAllowed", f"expected an integer, got {show(allowed)}")
    disrupted = _mapping(status.get("disruptedPods"), "status.disruptedPods")
    return PodDisruptionBudget(
        namespace=namespace,
        name=name,
        uid=_str(meta.get("uid"), "metadata.uid") or f"{namespace}/{name}",
        resource_version=_str(meta.get("resourceVersion"), "metadata.resourceVersion"),
        selector=_selector(spec.get("selector"), "spec.selector"),
        disruptions_allowed=allowed,
        disrupted_pods=frozenset(str(k) for k in disrupted),
    )
