"""TaintToleration: node taints against pod tolerations (kube-scheduler's plugin).

Role:
- Filter: a node with a ``NoSchedule`` or ``NoExecute`` taint that none of the pod's
  tolerations tolerates is rejected, UnschedulableAndUnresolvable, with the reason current
  kube-scheduler uses, ``node(s) had untolerated taint(s)`` (since kubernetes#134740 the taint
  key and value are no longer part of the message; they may be sensitive).
- Score: the number of ``PreferNoSchedule`` taints not tolerated by the pod's tolerations whose
  effect is empty or ``PreferNoSchedule``; NormalizeScore reverses it (fewer is better).

Matching follows component-helpers ``Toleration.ToleratesTaint``: a toleration with an effect
matches only that effect; with a key only that key (an empty key matches every key); operator
``Exists`` matches any value, ``Equal`` (or empty) compares values.

Invariants: the per-node ``filter``/``score`` are the reference; ``filter_nodes`` and
``score_nodes`` give the same results on every live slot. Whole-cluster results depend only on
the nodes' taints and on the pod's tolerations, so nodes are grouped by taint list once per
node generation and results are cached per toleration set (bounded); callers get copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

from apis.core import Pod, Taint, Toleration
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE, ClusterEvent
from scheduler.framework.scoring import default_normalize_score
from scheduler.framework.status import Status, unresolvable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot

__all__ = [
    "ERR_REASON_UNTOLERATED",
    "PRE_SCORE_STATE_KEY",
    "TaintToleration",
    "find_untolerated_taint",
    "tolerates_taint",
]

ERR_REASON_UNTOLERATED = "node(s) had untolerated taint(s)"
PRE_SCORE_STATE_KEY = "PreScoreTaintToleration"

_DO_NOT_SCHEDULE = frozenset({"NoSchedule", "NoExecute"})
_PREFER_NO_SCHEDULE = "PreferNoSchedule"
_CACHE_LIMIT = 256

_V = TypeVar("_V")


def tolerates_taint(toleration: Toleration, taint: Taint) -> bool:
    """component-helpers ``Toleration.ToleratesTaint`` (without the alpha Gt/Lt operators)."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def _tolerated(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    return any(tolerates_taint(t, taint) for t in tolerations)


def find_untolerated_taint(
    taints: Sequence[Taint], tolerations: Sequence[Toleration]
) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates, or None."""
    for taint in taints:
        if taint.effect in _DO_NOT_SCHEDULE and not _tolerated(tolerations, taint):
            return taint
    return None


def _prefer_no_schedule_tolerations(pod: Pod) -> tuple[Toleration, ...]:
    return tuple(t for t in pod.tolerations if not t.effect or t.effect == _PREFER_NO_SCHEDULE)


def _count_intolerable_prefer_no_schedule(
    taints: Sequence[Taint], tolerations: Sequence[Toleration]
) -> int:
    return sum(
        1 for t in taints if t.effect == _PREFER_NO_SCHEDULE and not _tolerated(tolerations, t)
    )


class TaintToleration:
    """Filter, PreScore, Score and NormalizeScore, each with its whole-cluster form."""

    name = "TaintToleration"

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._key: tuple[int, int] = (-1, -1)
        # taint list -> slots of the live nodes carrying exactly that list
        self._groups: list[tuple[tuple[Taint, ...], IntArray]] = []
        self._masks: dict[tuple[Toleration, ...], BoolArray] = {}
        self._scores: dict[tuple[Toleration, ...], IntArray] = {}

    def events_to_register(self) -> Sequence[ClusterEvent]:
        # kube: Node Add | UpdateNodeTaint (| UpdateNodeLabel without queueing hints).
        return (NODE_ADD, NODE_UPDATE)

    # -- Filter --------------------------------------------------------------------------------

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        if node.node is None:
            return None
        if find_untolerated_taint(node.node.taints, pod.tolerations) is None:
            return None
        return unresolvable(ERR_REASON_UNTOLERATED)

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        self._refresh(snapshot)
        key = pod.tolerations
        mask = self._masks.get(key)
        if mask is None:
            mask = np.ones(snapshot.size, dtype=bool)
            for taints, slots in self._groups:
                if find_untolerated_taint(taints, key) is not None:
                    mask[slots] = False
            self._remember(self._masks, key, mask)
        return mask.copy()

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """Every node the mask rejected has an untolerated taint: one reason for all."""
        return np.zeros(len(slots), np.int64), [unresolvable(ERR_REASON_UNTOLERATED)]

    # -- Score ---------------------------------------------------------------------------------

    def pre_score(self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]) -> Status | None:
        state.write(PRE_SCORE_STATE_KEY, _prefer_no_schedule_tolerations(pod))
        return None

    def _score_tolerations(self, state: CycleState, pod: Pod) -> tuple[Toleration, ...]:
        tolerations: tuple[Toleration, ...] | None = state.get(PRE_SCORE_STATE_KEY)
        if tolerations is None:  # PreScore disabled: compute here, as kube does for Score
            tolerations = _prefer_no_schedule_tolerations(pod)
        return tolerations

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        if node.node is None:
            return 0
        tolerations = self._score_tolerations(state, pod)
        return _count_intolerable_prefer_no_schedule(node.node.taints, tolerations)

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        self._refresh(snapshot)
        key = self._score_tolerations(state, pod)
        column = self._scores.get(key)
        if column is None:
            column = np.zeros(snapshot.size, dtype=np.int64)
            for taints, group in self._groups:
                count = _count_intolerable_prefer_no_schedule(taints, key)
                if count:
                    column[group] = count
            self._remember(self._scores, key, column)
        result: IntArray = column[slots]
        return result

    def normalize_score(self, state: CycleState, pod: Pod, scores: IntArray) -> Status | None:
        default_normalize_score(scores, reverse=True)
        return None

    # -- internals -----------------------------------------------------------------------------

    def _refresh(self, snapshot: Snapshot) -> None:
        key = (snapshot.node_generation, snapshot.size)
        if snapshot is self._snapshot and key == self._key:
            return
        groups: dict[tuple[Taint, ...], list[int]] = {}
        for info in snapshot.node_infos():
            if info.node is not None and info.node.taints:
                groups.setdefault(info.node.taints, []).append(info.slot)
        self._groups = [(t, np.asarray(s, dtype=np.int64)) for t, s in groups.items()]
        self._masks.clear()
        self._scores.clear()
        self._snapshot, self._key = snapshot, key

    @staticmethod
    def _remember(
        cache: dict[tuple[Toleration, ...], _V], key: tuple[Toleration, ...], value: _V
    ) -> None:
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[key] = value
