"""NodeAffinity's node selectors, compiled once: component-helpers' ``nodeaffinity`` matching.

Role: a pod's ``nodeSelector`` and required node affinity (``RequiredAffinity``), its
preferred terms (``Preferred``) and the scheduler-enforced ``addedAffinity`` are compiled
here, each into one object with two forms of the same rule: ``matches``/``score`` on one
node's labels and name (the reference), and ``mask``/``column`` over the snapshot's label and
name columns (``NodeColumns``, built lazily per label key) for the whole-cluster passes.

Matching is component-helpers' ``nodeaffinity`` + apimachinery ``labels``: an empty term
matches nothing; a term that does not parse (bad label key or value, a Gt/Lt value that is not
a base-10 int64, matchFields other than one value with In/NotIn) matches nothing; ``NotIn`` and
``DoesNotExist`` match nodes without the key; ``Gt``/``Lt`` need the node's value to parse as an
int64 (Go's ``strconv.ParseInt(v, 10, 64)``); ``matchFields`` compare ``metadata.name``.

Invariants: compiled objects are frozen and hashable (the plugin caches masks by them); the
two forms agree on every live slot; ``errors`` lists why terms never match, one line each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from apis.core import NodeSelectorRequirement, NodeSelectorTerm, Pod, PreferredSchedulingTerm
from scheduler.framework.types import BoolArray, IntArray, Snapshot

__all__ = [
    "OBJECT_NAME_FIELD",
    "NodeColumns",
    "NodeSelector",
    "Preferred",
    "RequiredAffinity",
    "parse_int64",
    "preferred_for",
    "required_for",
]

OBJECT_NAME_FIELD = "metadata.name"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

ObjArray = npt.NDArray[np.object_]

# ---------------------------------------------------------------------------------------------
# apimachinery validation and parsing, as the selector code applies it

_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_GO_INT_RE = re.compile(r"[+-]?[0-9]+")


def _qualified_name_error(key: str) -> str | None:
    """apimachinery ``IsQualifiedName``: ``[prefix/]name``."""
    parts = key.split("/")
    if len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return f"invalid label key {key!r}: prefix part must be non-empty"
        if len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
            return f"invalid label key {key!r}: prefix part must be a DNS-1123 subdomain"
    elif len(parts) == 1:
        name = parts[0]
    else:
        return f"invalid label key {key!r}: a qualified name has at most one '/'"
    if not name or len(name) > 63 or not _NAME_RE.fullmatch(name):
        return f"invalid label key {key!r}: name part must be 1-63 alphanumerics, '-', '_' or '.'"
    return None


def _label_value_error(value: str) -> str | None:
    if value and (len(value) > 63 or not _NAME_RE.fullmatch(value)):
        return f"invalid label value {value!r}"
    return None


def parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``; None where Go returns an error."""
    if not _GO_INT_RE.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


# ---------------------------------------------------------------------------------------------
# Compiled selectors


@dataclass(frozen=True, slots=True)
class _LabelReq:
    key: str
    op: str
    values: frozenset[str]
    number: int = 0

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.op
        if op == "In":
            return self.key in labels and labels[self.key] in self.values
        if op == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        if self.key not in labels:
            return False
        value = parse_int64(labels[self.key])
        if value is None:
            return False
        return value > self.number if op == "Gt" else value < self.number

    def mask(self, cols: NodeColumns) -> BoolArray:
        op = self.op
        if op in ("Gt", "Lt"):
            valid, ints = cols.ints(self.key)
            cmp = ints > self.number if op == "Gt" else ints < self.number
            out: BoolArray = valid & cmp
            return out
        has, values = cols.labels(self.key)
        if op == "Exists":
            return has.copy()
        if op == "DoesNotExist":
            return ~has
        hit = np.zeros(cols.size, dtype=bool)
        for v in self.values:
            hit |= values == v
        hit &= has
        return hit if op == "In" else ~hit


@dataclass(frozen=True, slots=True)
class _Term:
    """One parsed node-selector term; ``error`` set means it never matches."""

    labels: tuple[_LabelReq, ...] | None
    # (In?, value, is metadata.name): a node's only field is its name; any other reads as "".
    fields: tuple[tuple[bool, str, bool], ...] | None
    error: str | None = None

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        if self.error is not None:
            return False
        if self.labels is not None and not all(r.matches(labels) for r in self.labels):
            return False
        if self.fields is not None and name:
            return all(((name if is_name else "") == v) == eq for eq, v, is_name in self.fields)
        return True

    def mask(self, cols: NodeColumns) -> BoolArray:
        out = np.ones(cols.size, dtype=bool)
        if self.error is not None:
            out[:] = False
            return out
        for r in self.labels or ():
            out &= r.mask(cols)
        for eq, v, is_name in self.fields or ():
            if is_name:
                hit = cols.names == v
                out &= hit if eq else ~hit
            elif (v == "") != eq:
                out[:] = False
        return out


def _compile_requirement(r: NodeSelectorRequirement) -> tuple[_LabelReq | None, str | None]:
    err = _qualified_name_error(r.key)
    if err is not None:
        return None, err
    op, values = r.operator, r.values
    number = 0
    if op in ("In", "NotIn") and not values:
        return None, f"{r.key}: values set can't be empty for operator {op}"
    if op in ("Exists", "DoesNotExist") and values:
        return None, f"{r.key}: values set must be empty for operator {op}"
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            return None, f"{r.key}: exactly one value is required for operator {op}"
        parsed = parse_int64(values[0])
        if parsed is None:
            return None, f"{r.key}: for 'Gt', 'Lt' operators, the value must be an integer"
        number = parsed
    if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
        return None, f"{r.key}: unsupported operator {op!r}"
    for v in values:
        err = _label_value_error(v)
        if err is not None:
            return None, err
    return _LabelReq(r.key, op, frozenset(values), number), None


def _compile_term(term: NodeSelectorTerm) -> _Term | None:
    """None for an empty term (it selects nothing and is dropped, as kube does)."""
    if not term.match_expressions and not term.match_fields:
        return None
    labels: tuple[_LabelReq, ...] | None = None
    fields: tuple[tuple[bool, str, bool], ...] | None = None
    errors: list[str] = []
    if term.match_expressions:
        reqs: list[_LabelReq] = []
        for r in term.match_expressions:
            req, err = _compile_requirement(r)
            if err is not None:
                errors.append(err)
            elif req is not None:
                reqs.append(req)
        labels = tuple(reqs)
    if term.match_fields:
        fs: list[tuple[bool, str, bool]] = []
        for r in term.match_fields:
            if r.operator not in ("In", "NotIn"):
                errors.append(f"matchFields: unsupported operator {r.operator!r}")
            elif len(r.values) != 1:
                errors.append("matchFields: values must have one element")
            else:
                fs.append((r.operator == "In", r.values[0], r.key == OBJECT_NAME_FIELD))
        fields = tuple(fs)
    if errors:
        return _Term(None, None, "; ".join(errors))
    return _Term(labels, fields)


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """Required terms (ORed), empty terms dropped: kube's LazyErrorNodeSelector."""

    terms: tuple[_Term, ...]

    @staticmethod
    def compile(terms: Sequence[NodeSelectorTerm]) -> NodeSelector:
        compiled = (_compile_term(t) for t in terms)
        return NodeSelector(tuple(t for t in compiled if t is not None))

    @property
    def errors(self) -> list[str]:
        return [t.error for t in self.terms if t.error is not None]

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        return any(t.matches(labels, name) for t in self.terms)

    def mask(self, cols: NodeColumns) -> BoolArray:
        out = np.zeros(cols.size, dtype=bool)
        for t in self.terms:
            out |= t.mask(cols)
        return out


@dataclass(frozen=True, slots=True)
class RequiredAffinity:
    """nodeSelector labels AND required node affinity (None: no required affinity)."""

    selector: tuple[tuple[str, str], ...]
    affinity: NodeSelector | None

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        for k, v in self.selector:
            if k not in labels or labels[k] != v:
                return False
        return self.affinity is None or self.affinity.matches(labels, name)

    def mask(self, cols: NodeColumns) -> BoolArray:
        out = np.ones(cols.size, dtype=bool)
        for k, v in self.selector:
            has, values = cols.labels(k)
            out &= has & (values == v)
        if self.affinity is not None:
            out &= self.affinity.mask(cols)
        return out


@dataclass(frozen=True, slots=True)
class Preferred:
    """Weighted preferred terms; empty and zero-weight terms dropped."""

    terms: tuple[tuple[int, _Term], ...]

    @staticmethod
    def compile(terms: Sequence[PreferredSchedulingTerm]) -> Preferred:
        out: list[tuple[int, _Term]] = []
        for t in terms:
            if t.weight == 0:
                continue
            term = _compile_term(t.preference)
            if term is not None:
                out.append((t.weight, term))
        return Preferred(tuple(out))

    @property
    def errors(self) -> list[str]:
        return [t.error for _, t in self.terms if t.error is not None]

    def score(self, labels: Mapping[str, str], name: str) -> int:
        return sum(w for w, t in self.terms if t.matches(labels, name))

    def column(self, cols: NodeColumns) -> IntArray:
        out = np.zeros(cols.size, dtype=np.int64)
        for w, t in self.terms:
            out += t.mask(cols).astype(np.int64) * w
        return out


class NodeColumns:
    """Label and name columns over the snapshot's slots, built lazily per label key."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.size = snapshot.size
        self._labels: list[Mapping[str, str]] = [{}] * self.size
        self.names: ObjArray = np.full(self.size, "", dtype=object)
        for info in snapshot.node_infos():
            if info.node is not None:
                self._labels[info.slot] = info.node.labels
                self.names[info.slot] = info.node.name
        self._str: dict[str, tuple[BoolArray, ObjArray]] = {}
        self._int: dict[str, tuple[BoolArray, IntArray]] = {}

    def labels(self, key: str) -> tuple[BoolArray, ObjArray]:
        col = self._str.get(key)
        if col is None:
            has = np.zeros(self.size, dtype=bool)
            values: ObjArray = np.full(self.size, "", dtype=object)
            for slot, labels in enumerate(self._labels):
                v = labels.get(key)
                if v is not None:
                    has[slot] = True
                    values[slot] = v
            col = self._str[key] = (has, values)
        return col

    def ints(self, key: str) -> tuple[BoolArray, IntArray]:
        col = self._int.get(key)
        if col is None:
            valid = np.zeros(self.size, dtype=bool)
            ints = np.zeros(self.size, dtype=np.int64)
            for slot, labels in enumerate(self._labels):
                v = labels.get(key)
                n = None if v is None else parse_int64(v)
                if n is not None:
                    valid[slot] = True
                    ints[slot] = n
            col = self._int[key] = (valid, ints)
        return col


# ---------------------------------------------------------------------------------------------
# A pod's own affinity, compiled


def required_for(pod: Pod) -> RequiredAffinity:
    """The pod's ``nodeSelector`` and required node affinity, compiled."""
    required = pod.node_affinity.required if pod.node_affinity is not None else None
    return RequiredAffinity(
        selector=tuple(sorted(pod.node_selector.items())),
        affinity=None if required is None else NodeSelector.compile(required),
    )


def preferred_for(pod: Pod) -> Preferred | None:
    """The pod's preferred terms, compiled (None: it has none)."""
    affinity = pod.node_affinity
    if affinity is None or not affinity.preferred:
        return None
    return Preferred.compile(affinity.preferred)
