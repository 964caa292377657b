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

Matching (component-helpers' ``nodeaffinity``, both forms) is ``selector``; the args
(``addedAffinity``) are ``args``.

Invariants: the per-node ``filter``/``score`` are the reference and the whole-cluster forms
agree with them on every live slot. Masks and score columns depend only on the pod's shape
(node selector, affinity) and on node labels/names, so they are cached per shape (bounded)
and dropped whenever the snapshot, its ``node_generation`` or its size changes; callers always
receive fresh arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from apis.core import Pod
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE, ClusterEvent
from scheduler.framework.interfaces import PreFilterExtensions
from scheduler.framework.scoring import default_normalize_score
from scheduler.framework.status import SKIP, Status, error, unresolvable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot
from scheduler.plugins.nodeaffinity.args import NodeAffinityArgs
from scheduler.plugins.nodeaffinity.selector import (
    OBJECT_NAME_FIELD,
    NodeColumns,
    NodeSelector,
    Preferred,
    RequiredAffinity,
    preferred_for,
    required_for,
)

__all__ = [
    "ERR_REASON_CONFLICT",
    "ERR_REASON_ENFORCED",
    "ERR_REASON_POD",
    "PRE_FILTER_STATE_KEY",
    "PRE_SCORE_STATE_KEY",
    "NodeAffinity",
]

ERR_REASON_POD = "node(s) didn't match Pod's node affinity/selector"
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"
ERR_REASON_CONFLICT = "pod affinity terms conflict"
PRE_FILTER_STATE_KEY = "PreFilterNodeAffinity"
PRE_SCORE_STATE_KEY = "PreScoreNodeAffinity"

_CACHE_LIMIT = 128

_V = TypeVar("_V")
_MISSING = object()


class NodeAffinity:
    """PreFilter, Filter, PreScore, Score and NormalizeScore, with whole-cluster forms."""

    name = "NodeAffinity"

    def __init__(self, args: NodeAffinityArgs | None = None) -> None:
        added = args.added_affinity if args is not None else None
        self._added_required: NodeSelector | None = None
        self._added_preferred: Preferred | None = None
        if added is not None:
            if added.required is not None:
                self._added_required = NodeSelector.compile(added.required)
            if added.preferred:
                self._added_preferred = Preferred.compile(added.preferred)
        self._snapshot: Snapshot | None = None
        self._key: tuple[int, int] = (-1, -1)
        self._cols: NodeColumns | None = None
        self._added_mask: BoolArray | None = None
        self._masks: dict[object, BoolArray] = {}
        self._scores: dict[object, IntArray] = {}
        self._compiled: dict[object, RequiredAffinity] = {}

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
                if r.key == OBJECT_NAME_FIELD and r.operator == "In":
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
        required: RequiredAffinity | None = state.get(PRE_FILTER_STATE_KEY)
        if required is None:  # PreFilter disabled: compute here, as kube does
            required = self._required(pod)
        if not required.matches(n.labels, n.name):
            return unresolvable(ERR_REASON_POD)
        return None

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        cols = self._refresh(snapshot)
        required: RequiredAffinity | None = state.get(PRE_FILTER_STATE_KEY)
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
        preferred = preferred_for(pod)
        if preferred is None and self._added_preferred is None:
            return SKIP
        if preferred is not None and preferred.errors:
            return error(ValueError("; ".join(preferred.errors)))
        state.write(PRE_SCORE_STATE_KEY, preferred)
        return None

    def _score_terms(self, state: CycleState, pod: Pod) -> Preferred | None:
        stored = state.get(PRE_SCORE_STATE_KEY, _MISSING)
        if stored is _MISSING:  # PreScore disabled: compute here, as kube does
            return preferred_for(pod)
        preferred: Preferred | None = stored
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

    def _required(self, pod: Pod) -> RequiredAffinity:
        required = pod.node_affinity.required if pod.node_affinity is not None else None
        key = (tuple(sorted(pod.node_selector.items())), required)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = required_for(pod)
            _remember(self._compiled, key, compiled)
        return compiled

    def _refresh(self, snapshot: Snapshot) -> NodeColumns:
        key = (snapshot.node_generation, snapshot.size)
        if snapshot is not self._snapshot or key != self._key or self._cols is None:
            self._cols = NodeColumns(snapshot)
            self._added_mask = None
            self._masks.clear()
            self._scores.clear()
            self._snapshot, self._key = snapshot, key
        return self._cols


def _remember(cache: dict[object, _V], key: object, value: _V) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
