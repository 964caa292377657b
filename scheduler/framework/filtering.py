"""The Filter phase of a profile: whole-cluster masks, kube-scheduler's sampling, the room kept
for nominated pods, and the diagnosis of a pod that fits nowhere.

Role: the filtering half of the framework runtime (kube-scheduler's ``findNodesThatPassFilters``,
``RunFilterPluginsWithNominatedPods`` and the PreFilter extensions AddPod/RemovePod they use).
``find_feasible`` ANDs the masks of the whole-cluster plugins, runs per-node plugins only on
the nodes that survive, and stops after the nodes asked for; ``FilterOutcome.diagnose``
explains every rejected node, on demand only.

Invariants: a node's diagnosed status is the first rejecting filter's, in plugin order, as if
the filters had run node by node; when the whole-cluster and per-node forms of a plugin
disagree, the node gets an Error status naming it rather than being hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apis.core import Pod
from scheduler.framework import interfaces as api
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.profile import ProfileBase
from scheduler.framework.status import Code, Status
from scheduler.framework.types import (
    BoolArray,
    IntArray,
    NodeInfo,
    NodeStatuses,
    Snapshot,
    StatusGroup,
)

__all__ = ["FilterOutcome", "FilterPhase"]


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """The result of the Filter phase for one pod.

    ``feasible`` holds the slots found feasible (at most the number asked for), in the order
    they were found; ``processed`` how many nodes were looked at (kube's rotation step);
    ``diagnose`` builds the statuses of the rejected nodes, on demand only.
    """

    feasible: IntArray
    processed: int
    diagnose: Callable[[], NodeStatuses]


def _constant(statuses: NodeStatuses) -> Callable[[], NodeStatuses]:
    return lambda: statuses


class FilterPhase(ProfileBase):
    """PreFilter's AddPod/RemovePod extensions and the Filter phase, over a built profile."""

    def run_pre_filter_add_pod(
        self, state: CycleState, pod: Pod, pod_to_add: Pod, node: NodeInfo
    ) -> Status | None:
        return self._run_extension(state, "add_pod", pod, pod_to_add, node)

    def run_pre_filter_remove_pod(
        self, state: CycleState, pod: Pod, pod_to_remove: Pod, node: NodeInfo
    ) -> Status | None:
        return self._run_extension(state, "remove_pod", pod, pod_to_remove, node)

    def _run_extension(
        self, state: CycleState, which: str, pod: Pod, other: Pod, node: NodeInfo
    ) -> Status | None:
        ep = f"pre_filter_extension_{which}"
        start = self._now()
        result: Status | None = None
        for plugin in self._enabled["pre_filter"]:
            if plugin.name in state.skip_filter:
                continue
            ext = plugin.pre_filter_extensions()
            if ext is None:
                continue
            fn = ext.add_pod if which == "add_pod" else ext.remove_pod
            status = self._call(state, "pre_filter", plugin, fn, state, pod, other, node)
            if status is not None and not status.is_success:
                result = status
                break
        self._observe(ep, result, start)
        return result

    def run_filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        """All filter plugins on one node, stopping at the first rejection (per-node form)."""
        for plugin in self._filters:
            if plugin.name in state.skip_filter:
                continue
            status = self._call(state, "filter", plugin, plugin.filter, state, pod, node)
            if status is not None and not status.is_success:
                return status
        return None

    def run_filter_with_nominated_pods(
        self, state: CycleState, pod: Pod, node: NodeInfo
    ) -> Status | None:
        """kube-scheduler's ``RunFilterPluginsWithNominatedPods``: when pods of equal or higher
        priority are nominated to ``node``, the filters run twice — with those pods added (on
        copies of the state and the node) and without them — and must pass both times: the
        nominated pods' room is kept for them, yet ``pod`` is not made to depend on them being
        placed there."""
        added = self.with_nominated_pods(state, pod, node)
        if isinstance(added, Status):
            return added
        if added is not None:
            status = self.run_filter(added[0], pod, added[1])
            if status is not None:
                return status
        return self.run_filter(state, pod, node)

    def with_nominated_pods(
        self, state: CycleState, pod: Pod, node: NodeInfo
    ) -> tuple[CycleState, NodeInfo] | Status | None:
        """Copies of ``state`` and ``node`` with the pods nominated to ``node`` that ``pod``
        must respect (another pod's, of equal or higher priority) added through the PreFilter
        extensions' AddPod; None when there are none. Filter runs on it, and DeviceShare's
        Reserve chooses cards in it, so both see the same kept room."""
        nominator = self.handle.nominator
        if not nominator:
            return None
        others = [
            p
            for p in nominator.nominated_pods(node.name)
            if p.uid != pod.uid and p.priority >= pod.priority
        ]
        if not others:
            return None
        state_out, node_out = state.clone(), node.copy()
        for other in others:
            node_out.add_pod(other)
            status = self.run_pre_filter_add_pod(state_out, pod, other, node_out)
            if status is not None:
                return status
        return state_out, node_out

    def find_feasible(
        self,
        state: CycleState,
        pod: Pod,
        snapshot: Snapshot,
        num_to_find: int,
        start_index: int,
    ) -> FilterOutcome:
        """The Filter phase over the whole snapshot, kube-scheduler's sampling included.

        Nodes are visited in slot order rotated by ``start_index``; the search stops once
        ``num_to_find`` feasible nodes are found. Whole-cluster plugins contribute a mask in one
        pass; per-node plugins run only on nodes every mask allowed.
        """
        t0 = self._now()
        order = snapshot.live_slots()
        n = len(order)
        if n == 0:
            return FilterOutcome(
                np.empty(0, dtype=np.int64), 0, lambda: NodeStatuses(snapshot, {})
            )
        # Every slot live and no rotation: the order is the slots themselves (no gathers).
        identity = n == snapshot.size and not start_index % n
        if start_index % n:
            order = np.roll(order, -(start_index % n))
        masks: list[tuple[Any, BoolArray]] = []
        per_node: list[Any] = []
        mask: BoolArray | None = None
        for plugin, batch in zip(self._filters, self._batch_filter, strict=True):
            if plugin.name in state.skip_filter:
                continue
            if not batch:
                per_node.append(plugin)
                continue
            m = self._batch_call(state, plugin, snapshot, pod)
            if isinstance(m, Status):
                # A whole-cluster plugin error fails every node, like per-node errors would.
                failed = {info.name: m for info in snapshot.node_infos()}
                self._observe("filter", m, t0)
                return FilterOutcome(
                    np.empty(0, dtype=np.int64), n, _constant(NodeStatuses(snapshot, failed))
                )
            masks.append((plugin, m))
            mask = m.copy() if mask is None else np.logical_and(mask, m, out=mask)
        if mask is None:
            mask = np.ones(snapshot.size, dtype=bool)
        ordered_ok = mask if identity else mask[order]  # ``mask`` is our own copy
        per_node_statuses: dict[str, Status] = {}
        nominated = self.handle.nominator.nodes_for(pod) if self.handle.nominator else set()
        if nominated and not per_node:
            # The room kept for pods nominated here (the masks cannot see them): a few nodes
            # checked one by one, so the fast path below stays a numpy pass.
            live = snapshot.live_slots()
            shift = start_index % n if start_index else 0
            for name in sorted(nominated):
                slot = snapshot.index.get(name)
                if slot is None:
                    continue
                i = int(np.searchsorted(live, slot))
                if i >= n or int(live[i]) != slot:
                    continue
                pos = (i - shift) % n
                if ordered_ok[pos]:
                    status = self._filter_nominated(state, pod, snapshot.info(slot))
                    if status is not None and not status.is_success:
                        ordered_ok[pos] = False
                        per_node_statuses[name] = status
            nominated = set()
        if not per_node:
            positions = np.flatnonzero(ordered_ok)
            if len(positions) > num_to_find:
                positions = positions[:num_to_find]
                processed = int(positions[-1]) + 1
            else:
                processed = n
            feasible = positions if identity else order[positions]
        else:
            found: list[int] = []
            processed = n
            for pos in range(n):
                if not ordered_ok[pos]:
                    continue
                slot = int(order[pos])
                info = snapshot.info(slot)
                status = None
                for plugin in per_node:
                    status = self._call(state, "filter", plugin, plugin.filter, state, pod, info)
                    if status is not None and not status.is_success:
                        break
                if (status is None or status.is_success) and info.name in nominated:
                    # The room kept for pods nominated here (the masks cannot see them).
                    status = self._filter_nominated(state, pod, info)
                if status is None or status.is_success:
                    found.append(slot)
                    if len(found) >= num_to_find:
                        processed = pos + 1
                        break
                else:
                    per_node_statuses[info.name] = status
            feasible = np.asarray(found, dtype=np.int64)
        self._observe("filter", None, t0)

        def diagnose() -> NodeStatuses:
            return self._diagnose(state, pod, snapshot, masks, per_node_statuses)

        return FilterOutcome(feasible, processed, diagnose)

    def _filter_nominated(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        added = self.with_nominated_pods(state, pod, node)
        if added is None or isinstance(added, Status):
            return added
        return self.run_filter(added[0], pod, added[1])

    def _diagnose(
        self,
        state: CycleState,
        pod: Pod,
        snapshot: Snapshot,
        masks: Sequence[tuple[Any, BoolArray]],
        per_node_statuses: dict[str, Status],
    ) -> NodeStatuses:
        """Why every live node was rejected, from the masks the Filter phase computed.

        A node's status is the first rejecting filter's, in plugin order, as if the filters
        had run node by node: the per-node ones first (they ran only where every mask
        allowed), then each mask's newly rejected nodes. A plugin with ``filter_reasons``
        explains its nodes in one pass; otherwise (or where it declines) ``filter`` runs on each.
        """
        size = snapshot.size
        pending = snapshot.live[:size].copy()
        for name in per_node_statuses:
            pending[snapshot.index[name]] = False
        groups: list[StatusGroup] = []
        for plugin, m in masks:
            rejected = np.flatnonzero(pending & ~m[:size])
            if not len(rejected):
                continue
            pending[rejected] = False
            codes, table = self._filter_reasons(state, plugin, pod, snapshot, rejected)
            for i in np.flatnonzero(codes < 0).tolist():
                info = snapshot.info(int(rejected[i]))
                status = self._call(state, "filter", plugin, plugin.filter, state, pod, info)
                if status is None or status.is_success:
                    # The two forms disagree: report it rather than hide the node.
                    status = Status(
                        Code.ERROR,
                        (f"{plugin.name}: whole-cluster and per-node filters disagree",),
                        plugin=plugin.name,
                    )
                codes[i] = len(table)
                table.append(status)
            groups.append((rejected, codes, table))
        return NodeStatuses(snapshot, dict(per_node_statuses), groups)

    def _filter_reasons(
        self, state: CycleState, plugin: Any, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, list[Status]]:
        """The plugin's one-pass reasons for ``slots`` (stamped), or all -1 ("ask filter")."""
        if isinstance(plugin, api.FilterReasonsPlugin):
            try:
                codes, statuses = plugin.filter_reasons(state, pod, snapshot, slots)
                out = np.asarray(codes, dtype=np.int64).copy()
                if out.shape == slots.shape and int(out.max(initial=-1)) < len(statuses):
                    return out, [s.with_plugin(plugin.name) for s in statuses]
            except Exception:  # fall back to the per-node form, which reports errors itself
                pass
        return np.full(len(slots), -1, dtype=np.int64), []

    def _batch_call(
        self, state: CycleState, plugin: Any, snapshot: Snapshot, pod: Pod
    ) -> BoolArray | Status:
        start = self._now() if state.record_metrics else 0.0
        try:
            m: BoolArray = plugin.filter_nodes(state, pod, snapshot)
            result: BoolArray | Status = m
            label = "Success"
        except Exception as exc:
            result = Status(Code.ERROR, (f"{type(exc).__name__}: {exc}",), exc, plugin.name)
            label = "Error"
        if state.record_metrics:
            self.observer.plugin(plugin.name, "Filter", label, self._now() - start)
        return result
