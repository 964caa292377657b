"""NodeResourcesFit: does the node have room for the pod, and how full would it be?

Role: kube-scheduler's NodeResourcesFit plugin (``pkg/scheduler/framework/plugins/noderesources``).
- PreFilter computes the pod's request vector once into cycle state.
- Filter rejects a node (Unschedulable) listing every failing reason in kube's order:
  ``Too many pods`` when ``pods on node + 1 > allocatable pods``; then ``Insufficient <r>``
  whenever ``pod request > allocatable - requested`` for cpu, memory, ephemeral-storage, then
  each requested scalar resource (extended ``vendor/name``, ``hugepages-*``,
  ``*kubernetes.io/*``, ``attachable-volumes-*``) in name order. Extended resources named in
  ``ignoredResources`` or whose prefix is in ``ignoredResourceGroups`` are not checked.
- Score (``scoringStrategy``: LeastAllocated, the default, or MostAllocated) per weighted
  resource: cpu and memory use the non-zero requested amounts (pods without a request count
  as 100m / 200Mi), other resources the plain requested amounts, plus the pod's request; a
  scalar resource the pod does not request, and a resource the node has none of, is skipped.
  LeastAllocated ``(alloc - req) * 100 // alloc`` (0 when over), MostAllocated
  ``min(req, alloc) * 100 // alloc``; the node's score is ``Σ score·weight // Σ weight``.

Invariants: integer arithmetic exactly as kube's; the per-node ``filter``/``score`` are the
reference and ``filter_nodes``/``score_nodes`` (numpy over the snapshot's resource columns)
agree with them on every live slot. The only state kept between cycles is derived from the
args and a pod's requests alone: those columns, per request (``framework.slotcache.
SlotColumns``: recomputed only at the slots that changed), and PreFilter's checks per request
list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apis.core import CPU, EPHEMERAL_STORAGE, MEMORY, PODS, Pod
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import (
    ASSIGNED_POD_DELETE,
    ASSIGNED_POD_UPDATE,
    NODE_ADD,
    NODE_UPDATE,
    ClusterEvent,
)
from scheduler.framework.interfaces import MAX_NODE_SCORE, PluginArgsError, PreFilterExtensions
from scheduler.framework.plugin_args import LEAST_ALLOCATED, MOST_ALLOCATED, ArgsReader
from scheduler.framework.slotcache import SlotColumns
from scheduler.framework.status import Status, error, unschedulable
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot

__all__ = [
    "LEAST_ALLOCATED",
    "MOST_ALLOCATED",
    "PRE_FILTER_STATE_KEY",
    "PRE_SCORE_STATE_KEY",
    "REASON_TOO_MANY_PODS",
    "NodeResourcesFit",
    "NodeResourcesFitArgs",
    "is_extended_resource_name",
    "is_scalar_resource_name",
    "parse_args",
]

PRE_FILTER_STATE_KEY = "PreFilterNodeResourcesFit"
PRE_SCORE_STATE_KEY = "PreScoreNodeResourcesFit"
REASON_TOO_MANY_PODS = "Too many pods"
REQUESTED_TO_CAPACITY_RATIO = "RequestedToCapacityRatio"

_INT64_MAX = 2**63 - 1
_FIT, _SCORE = "fit", "score"
_FEW_SLOTS = 4
"""Up to this many slots, the score column is refreshed in Python ints (cheaper than numpy)."""
_FITS_KEPT = 1024
_NATIVE_FIRST = (CPU, MEMORY, EPHEMERAL_STORAGE)

# ---------------------------------------------------------------------------------------------
# Resource-name classes (k8s.io/kubernetes/pkg/apis/core/v1/helper)

_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_DEFAULT_NAMESPACE_PREFIX = "kubernetes.io/"
_REQUESTS_PREFIX = "requests."


def _is_qualified_name(value: str) -> bool:
    parts = value.split("/")
    if len(parts) == 2:
        prefix, name = parts
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
            return False
    elif len(parts) == 1:
        name = parts[0]
    else:
        return False
    return 0 < len(name) <= 63 and _NAME_RE.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """A ``vendor/name`` resource outside ``kubernetes.io``, valid as a quota name."""
    if "/" not in name or _DEFAULT_NAMESPACE_PREFIX in name:
        return False  # a native resource
    if name.startswith(_REQUESTS_PREFIX):
        return False
    return _is_qualified_name(_REQUESTS_PREFIX + name)


def is_scalar_resource_name(name: str) -> bool:
    """Resources kube accounts as ``ScalarResources`` (everything but cpu/memory/storage/pods)."""
    return (
        is_extended_resource_name(name)
        or name.startswith("hugepages-")
        or _DEFAULT_NAMESPACE_PREFIX in name
        or name.startswith("attachable-volumes-")
    )


# ---------------------------------------------------------------------------------------------
# Args


@dataclass(frozen=True, slots=True)
class NodeResourcesFitArgs:
    ignored_resources: frozenset[str] = frozenset()
    ignored_resource_groups: frozenset[str] = frozenset()
    strategy: str = LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = ((CPU, 1), (MEMORY, 1))


_ARG_KEYS = frozenset({"ignoredResources", "ignoredResourceGroups", "scoringStrategy"})
_STRATEGY_KEYS = frozenset({"type", "resources", "requestedToCapacityRatio"})


_ARGS = ArgsReader("NodeResourcesFit")
_fail = _ARGS.fail


def _string_list(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise _fail(path, f"expected a list of strings, got {value!r}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _fail(f"{path}[{i}]", f"expected a string, got {item!r}")
    return list(value)


def parse_args(args: Mapping[str, Any]) -> NodeResourcesFitArgs:
    """kube's v1 NodeResourcesFitArgs: defaults (LeastAllocated, cpu 1, memory 1) and validation."""
    unknown = sorted(str(k) for k in args if k not in _ARG_KEYS)
    if unknown:
        raise PluginArgsError(f"NodeResourcesFit args: unknown field(s) {', '.join(unknown)}")
    ignored = _string_list(args.get("ignoredResources"), "ignoredResources")
    for i, name in enumerate(ignored):
        if not _is_qualified_name(name):
            raise _fail(f"ignoredResources[{i}]", f"{name!r} is not a valid resource name")
    groups = _string_list(args.get("ignoredResourceGroups"), "ignoredResourceGroups")
    for i, group in enumerate(groups):
        if "/" in group:
            raise _fail(f"ignoredResourceGroups[{i}]", "resource group name can't contain '/'")
        if not _is_qualified_name(group):
            raise _fail(f"ignoredResourceGroups[{i}]", f"{group!r} is not a valid group name")
    strategy = LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = ((CPU, 1), (MEMORY, 1))
    raw = args.get("scoringStrategy")
    if raw is not None:
        raw = _ARGS.mapping(raw, "scoringStrategy", _STRATEGY_KEYS)
        if raw.get("type") == REQUESTED_TO_CAPACITY_RATIO:
            raise _fail(
                "scoringStrategy.type",
                "RequestedToCapacityRatio is not supported (use LeastAllocated or MostAllocated)",
            )
        strategy = _ARGS.strategy_type(raw.get("type"), default=None)
        if raw.get("requestedToCapacityRatio") is not None:
            raise _fail(
                "scoringStrategy.requestedToCapacityRatio",
                "RequestedToCapacityRatio is not supported",
            )
        resources = _ARGS.resource_weights(raw.get("resources")) or resources
    return NodeResourcesFitArgs(
        ignored_resources=frozenset(ignored),
        ignored_resource_groups=frozenset(groups),
        strategy=strategy,
        resources=resources,
    )


# ---------------------------------------------------------------------------------------------
# The plugin


@dataclass(frozen=True, slots=True)
class _PodFit:
    """The pod's requests that Filter checks, in reason order (only non-zero ones)."""

    checks: tuple[tuple[str, int], ...]


def _least_requested(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def _most_requested(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def _least_requested_signed(requested: int, capacity: int) -> int:
    """``score_nodes``' LeastAllocated for a non-zero ``capacity`` (as numpy computes it)."""
    return 0 if requested > capacity else (capacity - requested) * MAX_NODE_SCORE // capacity


def _most_requested_signed(requested: int, capacity: int) -> int:
    """``score_nodes``' MostAllocated for a non-zero ``capacity`` (as numpy computes it)."""
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


class NodeResourcesFit:
    """PreFilter, Filter, PreScore and Score, with whole-cluster Filter and Score."""

    name = "NodeResourcesFit"

    def __init__(self, args: NodeResourcesFitArgs | None = None) -> None:
        self.args = args if args is not None else NodeResourcesFitArgs()
        self._least = self.args.strategy == LEAST_ALLOCATED
        # The whole-cluster mask per request and score per score request, kept per slot.
        self._columns = SlotColumns()
        self._fits: dict[tuple[tuple[str, int], ...], _PodFit] = {}

    def events_to_register(self) -> Sequence[ClusterEvent]:
        # kube: Pod Delete (| UpdatePodScaleDown), Node Add | UpdateNodeAllocatable (| ...).
        return (ASSIGNED_POD_DELETE, ASSIGNED_POD_UPDATE, NODE_ADD, NODE_UPDATE)

    # -- PreFilter / Filter --------------------------------------------------------------------

    def compute_pod_fit(self, pod: Pod) -> _PodFit:
        # Pods of one workload share their requests: the checks are kept per request list.
        key = tuple(pod.requests.items())
        fit = self._fits.get(key)
        if fit is None:
            if len(self._fits) >= _FITS_KEPT:
                self._fits.clear()
            fit = self._fits[key] = self._pod_fit_of(pod)
        return fit

    def _pod_fit_of(self, pod: Pod) -> _PodFit:
        reqs = pod.requests
        checks = [(r, reqs[r]) for r in _NATIVE_FIRST if reqs.get(r, 0) > 0]
        for r in sorted(reqs):
            amount = reqs[r]
            if amount <= 0 or r in _NATIVE_FIRST or not is_scalar_resource_name(r):
                continue
            if is_extended_resource_name(r) and self._ignored(r):
                continue
            checks.append((r, amount))
        return _PodFit(tuple(checks))

    def _ignored(self, resource: str) -> bool:
        if resource in self.args.ignored_resources:
            return True
        groups = self.args.ignored_resource_groups
        return bool(groups) and resource.split("/", 1)[0] in groups

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        state.write(PRE_FILTER_STATE_KEY, self.compute_pod_fit(pod))
        return None

    def pre_filter_extensions(self) -> PreFilterExtensions | None:
        return None

    @staticmethod
    def _pod_fit(state: CycleState) -> _PodFit:
        fit: _PodFit | None = state.get(PRE_FILTER_STATE_KEY)
        if fit is None:
            raise KeyError(f"{PRE_FILTER_STATE_KEY!r} not found in cycle state")
        return fit

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        try:
            fit = self._pod_fit(state)
        except KeyError as exc:
            return error(exc)
        n = node.node
        if n is None:
            return None
        allocatable = n.allocatable
        requested = node.requested
        reasons: list[str] = []
        if len(node.pods) + 1 > allocatable.get(PODS, 0):
            reasons.append(REASON_TOO_MANY_PODS)
        for r, amount in fit.checks:
            if amount > allocatable.get(r, 0) - requested.get(r, 0):
                reasons.append(f"Insufficient {r}")
        return unschedulable(*reasons) if reasons else None

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        checks = self._pod_fit(state).checks

        def fits(at: IntArray | slice) -> BoolArray:
            if not isinstance(at, slice) and len(at) <= _FEW_SLOTS:
                return self._few_fits(snapshot, checks, at.tolist())
            mask: BoolArray = snapshot.pod_count[at] < snapshot.allocatable(PODS)[at]
            for r, amount in checks:
                free = snapshot.allocatable(r)[at] - snapshot.requested(r)[at]
                mask &= free >= min(amount, _INT64_MAX)
            return mask

        column: BoolArray = self._columns.get(snapshot, (_FIT, checks), fits)
        return column.copy()

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """``filter``'s reasons for every slot in one pass: one status per distinct set."""
        fit = self._pod_fit(state)
        names = [REASON_TOO_MANY_PODS]
        cols = [snapshot.pod_count[slots] >= snapshot.allocatable(PODS)[slots]]
        for r, amount in fit.checks:
            free = snapshot.allocatable(r)[slots] - snapshot.requested(r)[slots]
            names.append(f"Insufficient {r}")
            cols.append(free < min(amount, _INT64_MAX))
        if len(cols) <= 62:  # one int per node: a 1-D unique instead of a row-wise one
            bits = np.zeros(len(slots), np.int64)
            for i, col in enumerate(cols):
                bits |= col.astype(np.int64) << i
            sets_bits, inverse = np.unique(bits, return_inverse=True)
            rows = [[bool(b >> i & 1) for i in range(len(cols))] for b in sets_bits.tolist()]
        else:
            sets, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
            rows = sets.tolist()
        remap = np.full(len(rows), -1, np.int64)  # -1: no reason, let ``filter`` say why
        statuses: list[Status] = []
        for i, row in enumerate(rows):
            reasons = [name for name, hit in zip(names, row, strict=True) if hit]
            if reasons:
                remap[i] = len(statuses)
                statuses.append(unschedulable(*reasons))
        codes: IntArray = remap[inverse.reshape(-1)]
        return codes, statuses

    @staticmethod
    def _few_fits(
        snapshot: Snapshot, checks: tuple[tuple[str, int], ...], slots: list[int]
    ) -> BoolArray:
        """``filter_nodes``' mask at a few slots in Python ints (the same tests)."""
        pods, allowed = snapshot.pod_count, snapshot.allocatable(PODS)
        columns = [
            (snapshot.allocatable(r), snapshot.requested(r), min(amount, _INT64_MAX))
            for r, amount in checks
        ]
        return np.array(
            [
                int(pods[slot]) < int(allowed[slot])
                and all(int(a[slot]) - int(q[slot]) >= amount for a, q, amount in columns)
                for slot in slots
            ],
            bool,
        )

    def _few_scores(
        self, snapshot: Snapshot, pod_requests: tuple[int, ...], slots: list[int]
    ) -> IntArray:
        """``_scores`` in Python ints, slot by slot: the same formula for a few slots, without
        numpy's per-call cost (a refresh after one placement touches one or two slots)."""
        terms: list[tuple[int, int, IntArray, IntArray]] = []
        for (r, weight), pod_request in zip(self.args.resources, pod_requests, strict=True):
            if pod_request == 0 and is_scalar_resource_name(r):
                continue
            if r == CPU:
                used = snapshot.non_zero_cpu
            elif r == MEMORY:
                used = snapshot.non_zero_memory
            elif r == EPHEMERAL_STORAGE or is_scalar_resource_name(r):
                used = snapshot.requested(r)
            else:
                continue
            terms.append((weight, pod_request, used, snapshot.allocatable(r)))
        scorer = _least_requested_signed if self._least else _most_requested_signed
        out: list[int] = []
        for slot in slots:
            node_score = weight_sum = 0
            for weight, pod_request, used, allocatable in terms:
                capacity = int(allocatable[slot])
                if capacity == 0:
                    continue
                node_score += scorer(int(used[slot]) + pod_request, capacity) * weight
                weight_sum += weight
            out.append(node_score // max(weight_sum, 1))
        return np.array(out, np.int64)

    # -- PreScore / Score ----------------------------------------------------------------------

    def _score_requests(self, pod: Pod) -> tuple[int, ...]:
        return tuple(
            pod.non_zero_request(r) if r in (CPU, MEMORY) else pod.requests.get(r, 0)
            for r, _ in self.args.resources
        )

    def pre_score(self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]) -> Status | None:
        state.write(PRE_SCORE_STATE_KEY, self._score_requests(pod))
        return None

    def _pod_score_requests(self, state: CycleState, pod: Pod) -> tuple[int, ...]:
        stored: tuple[int, ...] | None = state.get(PRE_SCORE_STATE_KEY)
        # PreScore disabled: compute here, as kube does.
        return stored if stored is not None else self._score_requests(pod)

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        n = node.node
        if n is None:
            return 0
        pod_requests = self._pod_score_requests(state, pod)
        scorer = _least_requested if self._least else _most_requested
        node_score = weight_sum = 0
        for (r, weight), pod_request in zip(self.args.resources, pod_requests, strict=True):
            if pod_request == 0 and is_scalar_resource_name(r):
                continue  # a scalar resource the pod does not request is not scored
            allocatable = n.allocatable.get(r, 0)
            if r in (CPU, MEMORY):
                requested = sum(p.non_zero_request(r) for p in node.pods.values())
            elif r == EPHEMERAL_STORAGE or is_scalar_resource_name(r):
                requested = node.requested.get(r, 0)
            else:
                continue  # kube does not score other resources
            if allocatable == 0:
                continue
            node_score += scorer(requested + pod_request, allocatable) * weight
            weight_sum += weight
        return node_score // weight_sum if weight_sum else 0

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        pod_requests = self._pod_score_requests(state, pod)
        column: IntArray = self._columns.get(
            snapshot, (_SCORE, pod_requests), lambda at: self._scores(snapshot, pod_requests, at)
        )
        result: IntArray = column[slots]
        return result

    def _scores(
        self, snapshot: Snapshot, pod_requests: tuple[int, ...], slots: IntArray | slice
    ) -> IntArray:
        """``score`` of every slot in ``slots`` (an index array or a slice of the slots)."""
        if not isinstance(slots, slice) and len(slots) <= _FEW_SLOTS:
            return self._few_scores(snapshot, pod_requests, slots.tolist())
        size = snapshot.size
        count = len(range(size)[slots]) if isinstance(slots, slice) else len(slots)
        node_score = np.zeros(count, dtype=np.int64)
        weight_sum = np.zeros(count, dtype=np.int64)
        for (r, weight), pod_request in zip(self.args.resources, pod_requests, strict=True):
            if pod_request == 0 and is_scalar_resource_name(r):
                continue
            if r == CPU:
                used = snapshot.non_zero_cpu[:size]
            elif r == MEMORY:
                used = snapshot.non_zero_memory[:size]
            elif r == EPHEMERAL_STORAGE or is_scalar_resource_name(r):
                used = snapshot.requested(r)
            else:
                continue
            allocatable = snapshot.allocatable(r)[slots]
            requested = used[slots] + pod_request
            present = allocatable != 0
            capacity = np.where(present, allocatable, 1)
            if self._least:
                scores = np.where(
                    requested > allocatable, 0, (capacity - requested) * MAX_NODE_SCORE // capacity
                )
            else:
                scores = np.minimum(requested, capacity) * MAX_NODE_SCORE // capacity
            node_score += np.where(present, scores * weight, 0)
            weight_sum += present * weight
        result: IntArray = node_score // np.maximum(weight_sum, 1)
        return result
