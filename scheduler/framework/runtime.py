"""The framework runtime: builds one profile's plugins and runs every extension point in order.

It owns the cross-cutting concerns so plugins do not: it stamps the plugin name on each status,
turns a plugin exception into an Error status, honours Skip from PreFilter/PreScore, prefers a
plugin's whole-cluster Filter/Score form, validates, normalizes and weights scores, and times
every extension point (and, for sampled cycles, every plugin call) through an observer.

Invariants: building a Framework validates everything (unknown plugins, a plugin enabled at an
extension point it does not implement, duplicates, bad weights, invalid args) and fails with one
``FrameworkError`` line; running never raises for a plugin's fault.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from apis.core import Pod
from scheduler.config import PluginRef, Plugins, PluginSet, Profile, merge_plugins
from scheduler.framework import interfaces as api
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import ClusterEvent
from scheduler.framework.status import Code, Status
from scheduler.framework.types import (
    BoolArray,
    IntArray,
    NodeInfo,
    NodeStatuses,
    Snapshot,
    StatusGroup,
)

# Which protocol a plugin must implement to be enabled at each extension point.
_PROTOCOLS: dict[str, type] = {
    "queue_sort": api.QueueSortPlugin,
    "pre_filter": api.PreFilterPlugin,
    "filter": api.FilterPlugin,
    "post_filter": api.PostFilterPlugin,
    "pre_score": api.PreScorePlugin,
    "score": api.ScorePlugin,
    "reserve": api.ReservePlugin,
    "permit": api.PermitPlugin,
    "pre_bind": api.PreBindPlugin,
    "bind": api.BindPlugin,
    "post_bind": api.PostBindPlugin,
}

# kube-scheduler's metric label for each extension point.
EXTENSION_POINT_LABELS = {
    "queue_sort": "QueueSort",
    "pre_filter": "PreFilter",
    "pre_filter_extension_add_pod": "PreFilterExtensionAddPod",
    "pre_filter_extension_remove_pod": "PreFilterExtensionRemovePod",
    "filter": "Filter",
    "post_filter": "PostFilter",
    "pre_score": "PreScore",
    "score": "Score",
    "score_extension_normalize": "ScoreExtensionNormalize",
    "reserve": "Reserve",
    "unreserve": "Unreserve",
    "permit": "Permit",
    "pre_bind": "PreBind",
    "bind": "Bind",
    "post_bind": "PostBind",
}

MAX_TOTAL_SCORE = 2**62
MAX_PERMIT_WAIT = 15 * 60.0  # kube-scheduler's maxTimeout for a waiting pod


class FrameworkError(ValueError):
    """A profile cannot be built; ``str()`` is one line naming the profile and the problem."""


class Observer(Protocol):
    """Receives timings; the metrics module implements it. Labels are kube-scheduler's."""

    def extension_point(
        self, profile: str, extension_point: str, status: str, seconds: float
    ) -> None: ...

    def plugin(self, plugin: str, extension_point: str, status: str, seconds: float) -> None: ...


class NullObserver:
    def extension_point(
        self, profile: str, extension_point: str, status: str, seconds: float
    ) -> None:
        pass

    def plugin(self, plugin: str, extension_point: str, status: str, seconds: float) -> None:
        pass


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


def _code_label(status: Status | None) -> str:
    return "Success" if status is None else status.code.label


class Framework:
    """One profile: its plugins per extension point and the code that runs them."""

    def __init__(
        self,
        profile: Profile,
        registry: Mapping[str, api.PluginFactory],
        handle: api.Handle,
        default_plugins: Plugins | None = None,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.profile = profile
        self.name = profile.scheduler_name
        self.handle = handle
        handle.runner = self
        self.observer: Observer = observer or NullObserver()
        self._now = clock
        plugins = merge_plugins(default_plugins or Plugins(), profile.plugins)
        self._instances: dict[str, Any] = {}
        self._build(plugins, registry)

    # -- construction -----------------------------------------------------------------------------

    def _fail(self, message: str) -> FrameworkError:
        return FrameworkError(f"profile {self.name!r}: {message}")

    def _instance(self, name: str, registry: Mapping[str, api.PluginFactory]) -> Any:
        if name in self._instances:
            return self._instances[name]
        factory = registry.get(name)
        if factory is None:
            known = ", ".join(sorted(registry))
            raise self._fail(f"unknown plugin {name!r} (known plugins: {known})")
        try:
            plugin = factory(self.profile.args_for(name), self.handle)
        except (api.PluginArgsError, ValueError, TypeError) as exc:
            raise self._fail(f"plugin {name}: invalid args: {exc}") from None
        self._instances[name] = plugin
        return plugin

    def _build(self, plugins: Plugins, registry: Mapping[str, api.PluginFactory]) -> None:
        for cfg in self.profile.plugin_config:
            if cfg.name not in registry:
                raise self._fail(f"pluginConfig for unknown plugin {cfg.name!r}")
        sets: dict[str, PluginSet] = {ep: getattr(plugins, ep) for ep in _PROTOCOLS}
        self._expand_multi_point(plugins.multi_point, sets, registry)
        self._enabled: dict[str, list[Any]] = {}
        self.score_weights: dict[str, int] = {}
        for ep, plugin_set in sets.items():
            seen: set[str] = set()
            chosen: list[Any] = []
            for ref in plugin_set.enabled:
                if ref.name in seen:
                    raise self._fail(f"plugin {ref.name} enabled twice at {ep}")
                seen.add(ref.name)
                plugin = self._instance(ref.name, registry)
                if not isinstance(plugin, _PROTOCOLS[ep]):
                    raise self._fail(
                        f"plugin {ref.name} does not implement the {EXTENSION_POINT_LABELS[ep]}"
                        " extension point"
                    )
                if ep == "score":
                    if ref.weight < 0:
                        raise self._fail(f"plugin {ref.name}: score weight must be >= 0")
                    self.score_weights[ref.name] = ref.weight or 1
                chosen.append(plugin)
            self._enabled[ep] = chosen
        if len(self._enabled["queue_sort"]) != 1:
            raise self._fail(
                "exactly one queueSort plugin must be enabled, "
                f"got {len(self._enabled['queue_sort'])}"
            )
        if not self._enabled["bind"]:
            raise self._fail("at least one bind plugin must be enabled")
        if sum(self.score_weights.values()) * 100 > MAX_TOTAL_SCORE:
            raise self._fail("the total of the score weights is too large")
        self.queue_sort: api.QueueSortPlugin = self._enabled["queue_sort"][0]
        self._filters = self._enabled["filter"]
        self._batch_filter = [isinstance(p, api.BatchFilterPlugin) for p in self._filters]
        self._scores = self._enabled["score"]
        self._batch_score = [isinstance(p, api.BatchScorePlugin) for p in self._scores]
        self._normalizers = [
            p if isinstance(p, api.ScoreNormalizer) else None for p in self._scores
        ]
        self._weights = [self.score_weights[p.name] for p in self._scores]

    def _expand_multi_point(
        self,
        multi: PluginSet,
        sets: dict[str, PluginSet],
        registry: Mapping[str, api.PluginFactory],
    ) -> None:
        """A multiPoint plugin joins every extension point it implements, unless configured
        or disabled there explicitly (kube-scheduler's rule)."""
        for ref in multi.enabled:
            plugin = self._instance(ref.name, registry)
            for ep, proto in _PROTOCOLS.items():
                current = sets[ep]
                names = {r.name for r in current.enabled}
                disabled = {r.name for r in current.disabled}
                if not isinstance(plugin, proto) or ref.name in names or ref.name in disabled:
                    continue
                if "*" in disabled:
                    continue
                sets[ep] = PluginSet(
                    enabled=(*current.enabled, PluginRef(ref.name, ref.weight)),
                    disabled=current.disabled,
                )

    # -- introspection ----------------------------------------------------------------------------

    def plugins_at(self, extension_point: str) -> list[str]:
        return [p.name for p in self._enabled[extension_point]]

    def plugin(self, name: str) -> Any:
        return self._instances[name]

    def events_to_register(self) -> dict[ClusterEvent, set[str]]:
        """Every event a filter-type plugin registered, with the plugins that asked for it."""
        out: dict[ClusterEvent, set[str]] = {}
        for name, plugin in self._instances.items():
            if isinstance(plugin, api.EnqueueExtensions):
                for event in plugin.events_to_register():
                    out.setdefault(event, set()).add(name)
        return out

    # -- helpers ----------------------------------------------------------------------------------

    def _observe(self, ep: str, status: Status | None, start: float) -> None:
        self.observer.extension_point(
            self.name, EXTENSION_POINT_LABELS[ep], _code_label(status), self._now() - start
        )

    def _call(
        self, state: CycleState, ep: str, plugin: Any, fn: Callable[..., Any], *args: Any
    ) -> Status | None:
        """Run one plugin call: exceptions become Error, the plugin name is stamped."""
        start = self._now() if state.record_metrics else 0.0
        try:
            status: Status | None = fn(*args)
        except Exception as exc:  # a plugin's bug must not take the scheduler down
            status = Status(Code.ERROR, (f"{type(exc).__name__}: {exc}",), exc)
        if status is not None:
            status = status.with_plugin(plugin.name)
        if state.record_metrics:
            self.observer.plugin(
                plugin.name, EXTENSION_POINT_LABELS[ep], _code_label(status), self._now() - start
            )
        return status

    # -- scheduling cycle -------------------------------------------------------------------------

    def run_pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        start = self._now()
        result: Status | None = None
        for plugin in self._enabled["pre_filter"]:
            status = self._call(state, "pre_filter", plugin, plugin.pre_filter, state, pod)
            if status is None or status.code == Code.SUCCESS:
                continue
            if status.code == Code.SKIP:
                state.skip_filter.add(plugin.name)
                continue
            if status.code == Code.ERROR or status.is_rejected:
                result = status
            else:
                result = Status(
                    Code.ERROR,
                    (f"unexpected status {status.code.label} from PreFilter",),
                    plugin=plugin.name,
                )
            break
        self._observe("pre_filter", result, start)
        return result

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
        if start_index:
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
        ordered_ok = mask[order] if mask is not None else np.ones(n, dtype=bool)
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
            feasible = order[positions]
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

    def run_post_filter(
        self, state: CycleState, pod: Pod, node_to_status: Mapping[str, Status]
    ) -> tuple[api.PostFilterResult | None, Status | None]:
        start = self._now()
        final: Status | None = Status(Code.UNSCHEDULABLE, ())
        result: api.PostFilterResult | None = None
        for plugin in self._enabled["post_filter"]:
            try:
                res, status = plugin.post_filter(state, pod, node_to_status)
            except Exception as exc:
                res, status = None, Status(Code.ERROR, (str(exc),), exc)
            if status is not None:
                status = status.with_plugin(plugin.name)
            if status is None or status.is_success:
                result, final = res, None
                break
            if status.code != Code.UNSCHEDULABLE:
                final = status
                break
            if res is not None and result is None:
                result = res  # e.g. "clear the nomination" from a preemption that found nothing
            final = status
        self._observe("post_filter", final, start)
        return result, final

    def run_pre_score(
        self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]
    ) -> Status | None:
        start = self._now()
        result: Status | None = None
        for plugin in self._enabled["pre_score"]:
            status = self._call(state, "pre_score", plugin, plugin.pre_score, state, pod, nodes)
            if status is None or status.is_success:
                continue
            if status.code == Code.SKIP:
                state.skip_score.add(plugin.name)
                continue
            result = status
            break
        self._observe("pre_score", result, start)
        return result

    def has_score_plugins(self, state: CycleState) -> bool:
        return any(p.name not in state.skip_score for p in self._scores)

    def run_score(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray | Status:
        """Weighted total score per slot in ``slots`` (same order), or the first error."""
        start = self._now()
        total = np.zeros(len(slots), dtype=np.int64)
        for plugin, batch, normalizer, weight in zip(
            self._scores, self._batch_score, self._normalizers, self._weights, strict=True
        ):
            if plugin.name in state.skip_score:
                continue
            scores = self._plugin_scores(state, plugin, batch, pod, snapshot, slots)
            if isinstance(scores, Status):
                self._observe("score", scores, start)
                return scores
            if normalizer is not None:
                status = self._call(
                    state,
                    "score_extension_normalize",
                    plugin,
                    normalizer.normalize_score,
                    state,
                    pod,
                    scores,
                )
                if status is not None and not status.is_success:
                    self._observe("score", status, start)
                    return status
            if len(scores) and (scores.min() < 0 or scores.max() > api.MAX_NODE_SCORE):
                bad = int(scores.max() if scores.max() > api.MAX_NODE_SCORE else scores.min())
                status = Status(
                    Code.ERROR,
                    (
                        f"plugin {plugin.name} returned an invalid score {bad}, "
                        "it should be in the range of "
                        f"[{api.MIN_NODE_SCORE}, {api.MAX_NODE_SCORE}] "
                        "after normalizing",
                    ),
                    plugin=plugin.name,
                )
                self._observe("score", status, start)
                return status
            total += scores * weight
        self._observe("score", None, start)
        return total

    def _plugin_scores(
        self,
        state: CycleState,
        plugin: Any,
        batch: bool,
        pod: Pod,
        snapshot: Snapshot,
        slots: IntArray,
    ) -> IntArray | Status:
        start = self._now() if state.record_metrics else 0.0
        try:
            if batch:
                scores = np.asarray(plugin.score_nodes(state, pod, snapshot, slots), np.int64)
            else:
                scores = np.fromiter(
                    (plugin.score(state, pod, snapshot.info(int(s))) for s in slots),
                    dtype=np.int64,
                    count=len(slots),
                )
            result: IntArray | Status = scores
            label = "Success"
        except Exception as exc:
            result = Status(Code.ERROR, (f"{type(exc).__name__}: {exc}",), exc, plugin.name)
            label = "Error"
        if state.record_metrics:
            self.observer.plugin(plugin.name, "Score", label, self._now() - start)
        return result

    def run_reserve(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        start = self._now()
        result: Status | None = None
        for plugin in self._enabled["reserve"]:
            status = self._call(state, "reserve", plugin, plugin.reserve, state, pod, node_name)
            if status is not None and not status.is_success:
                result = status
                break
        self._observe("reserve", result, start)
        return result

    def run_unreserve(self, state: CycleState, pod: Pod, node_name: str) -> None:
        """Every reserve plugin, in reverse order; errors are swallowed (nothing to undo)."""
        start = self._now()
        for plugin in reversed(self._enabled["reserve"]):
            self._call(state, "unreserve", plugin, plugin.unreserve, state, pod, node_name)
        self._observe("unreserve", None, start)

    # -- binding cycle ----------------------------------------------------------------------------

    def run_permit(
        self, state: CycleState, pod: Pod, node_name: str
    ) -> tuple[Status | None, dict[str, float]]:
        """(status, plugin -> wait seconds). A Wait status means the pod must wait for every
        plugin in the map to allow it (``framework.waiting``); a rejection ends the loop."""
        start = self._now()
        waits: dict[str, float] = {}
        result: Status | None = None
        for plugin in self._enabled["permit"]:
            try:
                status, timeout = plugin.permit(state, pod, node_name)
            except Exception as exc:
                status, timeout = Status(Code.ERROR, (str(exc),), exc), 0.0
            if status is None or status.is_success:
                continue
            status = status.with_plugin(plugin.name)
            if status.code == Code.WAIT:
                waits[plugin.name] = max(0.0, min(timeout, MAX_PERMIT_WAIT))
                result = status
                continue
            result = status
            waits = {}
            break
        self._observe("permit", result, start)
        return result, waits

    def run_pre_bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        start = self._now()
        result: Status | None = None
        for plugin in self._enabled["pre_bind"]:
            status = self._call(state, "pre_bind", plugin, plugin.pre_bind, state, pod, node_name)
            if status is not None and not status.is_success:
                result = status
                break
        self._observe("pre_bind", result, start)
        return result

    def run_bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        start = self._now()
        result: Status | None = Status(Code.SKIP)
        for plugin in self._enabled["bind"]:
            status = self._call(state, "bind", plugin, plugin.bind, state, pod, node_name)
            if status is not None and status.code == Code.SKIP:
                continue
            result = status
            break
        if result is not None and result.code == Code.SKIP:
            result = Status(Code.ERROR, ("no bind plugin bound the pod",))
        self._observe("bind", result, start)
        return result

    def run_post_bind(self, state: CycleState, pod: Pod, node_name: str) -> None:
        start = self._now()
        for plugin in self._enabled["post_bind"]:
            self._call(state, "post_bind", plugin, plugin.post_bind, state, pod, node_name)
        self._observe("post_bind", None, start)
