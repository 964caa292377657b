"""NodeAffinity: ``spec.nodeSelector`` and node affinity (kube-scheduler's plugin).

Role:
- PreFilter returns Skip when the pod has neither a node selector nor required node affinity
  (and no ``addedAffinity`` is configured), so Filter is not run for it; it rejects outright
  (``pod affinity terms conflict``) a pod whose every required term pins disjoint node names.
- Filter: the node must carry every ``nodeSelector`` label and match at least one required
  node-selector term (terms ORed, requirements ANDed). Rejection is UnschedulableAndUnresolvable
  with ``node(s) didn't match Pod's node affinity/selector``, or, for the configured
  ``addedAffinity``, ``node(s) didn't match scheduler-enforced node affinity``.
- Score: the sum of the weights of the preferred terms the node matches (the pod's and the
  configured ones); PreScore Skips when there are none. NormalizeScore scales to 0..100.

Matching is component-helpers' ``nodeaffinity`` + apimachinery ``labels``: an empty term
matches nothing; a term that does not parse (bad label key or value, a Gt/Lt value that is not
a base-10 int64, matchFields other than one value with In/NotIn) matches nothing; ``NotIn`` and
``DoesNotExist`` match nodes without the key; ``Gt``/``Lt`` need the node's value to parse as an
int64 (Go's ``strconv.ParseInt(v, 10, 64)``); ``matchFields`` compare ``metadata.name``.

Invariants: the per-node ``filter``/``score`` are the reference and the whole-cluster forms
agree with them on every live slot. Masks and score columns depend only on the pod's shape
(node selector, affinity) and on node labels/names, so they are cached per shape (bounded)
and dropped whenever the snapshot, its ``node_generation`` or its size changes; callers always
receive fresh arrays.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from apis.core import (
    DecodeError,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PreferredSchedulingTerm,
    decode_pod,
)
from apis.core import NodeAffinity as NodeAffinitySpec
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE, ClusterEvent
from scheduler.framework.interfaces import PluginArgsError, PreFilterExtensions
from scheduler.framework.scoring import default_normalize_score
from scheduler.framework.status import SKIP, Status, error, unresolvable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot

__all__ = [
    "ERR_REASON_CONFLICT",
    "ERR_REASON_ENFORCED",
    "ERR_REASON_POD",
    "PRE_FILTER_STATE_KEY",
    "PRE_SCORE_STATE_KEY",
    "NodeAffinity",
    "parse_args",
]

ERR_REASON_POD = "node(s) didn't match Pod's node affinity/selector"
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"
ERR_REASON_CONFLICT = "pod affinity terms conflict"
PRE_FILTER_STATE_KEY = "PreFilterNodeAffinity"
PRE_SCORE_STATE_KEY = "PreScoreNodeAffinity"

_OBJECT_NAME_FIELD = "metadata.name"
_CACHE_LIMIT = 128
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

ObjArray = npt.NDArray[np.object_]
_V = TypeVar("_V")
_MISSING = object()

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

    def mask(self, cols: _NodeColumns) -> BoolArray:
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

    def mask(self, cols: _NodeColumns) -> BoolArray:
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
                fs.append((r.operator == "In", r.values[0], r.key == _OBJECT_NAME_FIELD))
        fields = tuple(fs)
    if errors:
        return _Term(None, None, "; ".join(errors))
    return _Term(labels, fields)


@dataclass(frozen=True, slots=True)
class _NodeSelector:
    """Required terms (ORed), empty terms dropped: kube's LazyErrorNodeSelector."""

    terms: tuple[_Term, ...]

    @staticmethod
    def compile(terms: Sequence[NodeSelectorTerm]) -> _NodeSelector:
        compiled = (_compile_term(t) for t in terms)
        return _NodeSelector(tuple(t for t in compiled if t is not None))

    @property
    def errors(self) -> list[str]:
        return [t.error for t in self.terms if t.error is not None]

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        return any(t.matches(labels, name) for t in self.terms)

    def mask(self, cols: _NodeColumns) -> BoolArray:
        out = np.zeros(cols.size, dtype=bool)
        for t in self.terms:
            out |= t.mask(cols)
        return out


@dataclass(frozen=True, slots=True)
class _RequiredAffinity:
    """nodeSelector labels AND required node affinity (None: no required affinity)."""

    selector: tuple[tuple[str, str], ...]
    affinity: _NodeSelector | None

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        for k, v in self.selector:
            if k not in labels or labels[k] != v:
                return False
        return self.affinity is None or self.affinity.matches(labels, name)

    def mask(self, cols: _NodeColumns) -> BoolArray:
        out = np.ones(cols.size, dtype=bool)
        for k, v in self.selector:
            has, values = cols.labels(k)
            out &= has & (values == v)
        if self.affinity is not None:
            out &= self.affinity.mask(cols)
        return out


@dataclass(frozen=True, slots=True)
class _Preferred:
    """Weighted preferred terms; empty and zero-weight terms dropped."""

    terms: tuple[tuple[int, _Term], ...]

    @staticmethod
    def compile(terms: Sequence[PreferredSchedulingTerm]) -> _Preferred:
        out: list[tuple[int, _Term]] = []
        for t in terms:
            if t.weight == 0:
                continue
            term = _compile_term(t.preference)
            if term is not None:
                out.append((t.weight, term))
        return _Preferred(tuple(out))

    @property
    def errors(self) -> list[str]:
        return [t.error for _, t in self.terms if t.error is not None]

    def score(self, labels: Mapping[str, str], name: str) -> int:
        return sum(w for w, t in self.terms if t.matches(labels, name))

    def column(self, cols: _NodeColumns) -> IntArray:
        out = np.zeros(cols.size, dtype=np.int64)
        for w, t in self.terms:
            out += t.mask(cols).astype(np.int64) * w
        return out


class _NodeColumns:
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
# Args


@dataclass(frozen=True, slots=True)
class NodeAffinityArgs:
    added_affinity: NodeAffinitySpec | None = None


_ARG_KEYS = frozenset({"addedAffinity"})
_AFFINITY_KEYS = frozenset(
    {
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
    }
)


def parse_args(args: Mapping[str, Any]) -> NodeAffinityArgs:
    """kube's NodeAffinityArgs: ``addedAffinity`` (a v1 NodeAffinity), strictly validated."""
    unknown = sorted(set(args) - _ARG_KEYS)
    if unknown:
        raise PluginArgsError(f"NodeAffinity args: unknown field(s) {', '.join(unknown)}")
    added = args.get("addedAffinity")
    if added is None:
        return NodeAffinityArgs()
    if not isinstance(added, Mapping):
        raise PluginArgsError(
            f"NodeAffinity args: addedAffinity: expected a mapping, got {added!r}"
        )
    unknown = sorted(set(added) - _AFFINITY_KEYS)
    if unknown:
        raise PluginArgsError(
            f"NodeAffinity args: addedAffinity: unknown field(s) {', '.join(unknown)}"
        )
    prefix = "spec.affinity.nodeAffinity"
    try:
        pod = decode_pod(
            {"metadata": {"name": "args"}, "spec": {"affinity": {"nodeAffinity": added}}}
        )
    except DecodeError as exc:
        path = exc.path.replace(prefix, "addedAffinity", 1)
        raise PluginArgsError(f"NodeAffinity args: {path}: {exc.problem}") from None
    spec = pod.node_affinity
    if spec is None:
        return NodeAffinityArgs()
    problems: list[str] = []
    if spec.required is not None:
        problems += _NodeSelector.compile(spec.required).errors
    problems += _Preferred.compile(spec.preferred).errors
    if problems:
        raise PluginArgsError(f"NodeAffinity args: addedAffinity: {'; '.join(problems)}")
    return NodeAffinityArgs(added_affinity=spec)


# ---------------------------------------------------------------------------------------------
# The plugin


def _required_for(pod: Pod) -> _RequiredAffinity:
    required = pod.node_affinity.required if pod.node_affinity is not None else None
    return _RequiredAffinity(
        selector=tuple(sorted(pod.node_selector.items())),
        affinity=None if required is None else _NodeSelector.compile(required),
    )


def _preferred_for(pod: Pod) -> _Preferred | None:
    affinity = pod.node_affinity
    if affinity is None or not affinity.preferred:
        return None
    return _Preferred.compile(affinity.preferred)


class NodeAffinity:
    """PreFilter, Filter, PreScore, Score and NormalizeScore, with whole-cluster forms."""

    name = "NodeAffinity"

    def __init__(self, args: NodeAffinityArgs | None = None) -> None:
        added = args.added_affinity if args is not None else None
        self._added_required: _NodeSelector | None = None
        self._added_preferred: _Preferred | None = None
        if added is not None:
            if added.required is not None:
                self._added_required = _NodeSelector.compile(added.required)
            if added.preferred:
                self._added_preferred = _Preferred.compile(added.preferred)
        self._snapshot: Snapshot | None = None
        self._key: tuple[int, int] = (-1, -1)
        self._cols: _NodeColumns | None = None
        self._added_mask: BoolArray | None = None
        self._masks: dict[object, BoolArray] = {}
        self._scores: dict[object, IntArray] = {}
        self._compiled: dict[object, _RequiredAffinity] = {}

    def events_to_register(self) -> Sequence[ClusterEvent]:
        # kube: Node Add | UpdateNodeLabel (| UpdateNodeTaint without queueing hints).
        return (NODE_ADD, NODE_UPDATE)

    # -- PreFilter / Filter --------------------------------------------------------------------

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        required = pod.node_affinity.required if pod.node_affinity is not None else None
        if required is None and self._added_required is None and not pod.node_selector:
            return SKIP
        state.write(PRE_FILTER_STATE_KEY, self._required(pod))
        if not required:
            return None
        # Every term pinning metadata.name (In) to sets whose union is empty: nothing can fit.
        names: set[str] | None = None
        for term in required:
            term_names: set[str] | None = None
            for r in term.match_fields:
                if r.key == _OBJECT_NAME_FIELD and r.operator == "In":
                    values = set(r.values)
                    term_names = values if term_names is None else term_names & values
            if term_names is None:
                return None
            names = term_names if names is None else names | term_names
        if names is not None and not names:
            return unresolvable(ERR_REASON_CONFLICT)
        return None

    def pre_filter_extensions(self) -> PreFilterExtensions | None:
        return None

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        n = node.node
        if n is None:
            return None
        if self._added_required is not None and not self._added_required.matches(n.labels, n.name):
            return unresolvable(ERR_REASON_ENFORCED)
        required: _RequiredAffinity | None = state.get(PRE_FILTER_STATE_KEY)
        if required is None:  # PreFilter disabled: compute here, as kube does
            required = self._required(pod)
        if not required.matches(n.labels, n.name):
            return unresolvable(ERR_REASON_POD)
        return None

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        cols = self._refresh(snapshot)
        required: _RequiredAffinity | None = state.get(PRE_FILTER_STATE_KEY)
        if required is None:
            required = self._required(pod)
        mask = self._masks.get(required)
        if mask is None:
            mask = required.mask(cols)
            if self._added_required is not None:
                if self._added_mask is None:
                    self._added_mask = self._added_required.mask(cols)
                mask &= self._added_mask
            _remember(self._masks, required, mask)
        return mask.copy()

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """The scheduler-enforced affinity first (as ``filter``), else the pod's own."""
        statuses = [unresolvable(ERR_REASON_ENFORCED), unresolvable(ERR_REASON_POD)]
        if self._added_required is None:
            return np.ones(len(slots), np.int64), statuses
        added = self._added_mask
        if added is None or len(added) < snapshot.size:
            return np.full(len(slots), -1, np.int64), []
        return np.where(added[slots], 1, 0).astype(np.int64), statuses

    # -- PreScore / Score ----------------------------------------------------------------------

    def pre_score(self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]) -> Status | None:
        preferred = _preferred_for(pod)
        if preferred is None and self._added_preferred is None:
            return SKIP
        if preferred is not None and preferred.errors:
            return error(ValueError("; ".join(preferred.errors)))
        state.write(PRE_SCORE_STATE_KEY, preferred)
        return None

    def _score_terms(self, state: CycleState, pod: Pod) -> _Preferred | None:
        stored = state.get(PRE_SCORE_STATE_KEY, _MISSING)
        if stored is _MISSING:  # PreScore disabled: compute here, as kube does
            return _preferred_for(pod)
        preferred: _Preferred | None = stored
        return preferred

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        n = node.node
        if n is None:
            return 0
        total = 0
        if self._added_preferred is not None:
            total += self._added_preferred.score(n.labels, n.name)
        preferred = self._score_terms(state, pod)
        if preferred is not None:
            total += preferred.score(n.labels, n.name)
        return total

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        cols = self._refresh(snapshot)
        preferred = self._score_terms(state, pod)
        column = self._scores.get(preferred)
        if column is None:
            column = np.zeros(cols.size, dtype=np.int64)
            if self._added_preferred is not None:
                column += self._added_preferred.column(cols)
            if preferred is not None:
                column += preferred.column(cols)
            _remember(self._scores, preferred, column)
        result: IntArray = column[slots]
        return result

    def normalize_score(self, state: CycleState, pod: Pod, scores: IntArray) -> Status | None:
        default_normalize_score(scores, reverse=False)
        return None

    # -- internals -----------------------------------------------------------------------------

    def _required(self, pod: Pod) -> _RequiredAffinity:
        required = pod.node_affinity.required if pod.node_affinity is not None else None
        key = (tuple(sorted(pod.node_selector.items())), required)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = _required_for(pod)
            _remember(self._compiled, key, compiled)
        return compiled

    def _refresh(self, snapshot: Snapshot) -> _NodeColumns:
        key = (snapshot.node_generation, snapshot.size)
        if snapshot is not self._snapshot or key != self._key or self._cols is None:
            self._cols = _NodeColumns(snapshot)
            self._added_mask = None
            self._masks.clear()
            self._scores.clear()
            self._snapshot, self._key = snapshot, key
        return self._cols


def _remember(cache: dict[object, _V], key: object, value: _V) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
