"""The framework runtime: runs every extension point of one profile in order.

It owns the cross-cutting concerns so plugins do not: it stamps the plugin name on each status,
turns a plugin exception into an Error status, honours Skip from PreFilter/PreScore, prefers a
plugin's whole-cluster Filter/Score form, validates, normalizes and weights scores, and times
every extension point (and, for sampled cycles, every plugin call) through an observer.
``Framework`` is built in layers, one module each: ``profile.ProfileBase`` (building and
validating the profile, the call helpers), ``filtering.FilterPhase`` (PreFilter's AddPod/
RemovePod, the Filter phase, nominated pods, the diagnosis) and this module (every other
extension point).

Invariants: building a Framework validates everything (unknown plugins, a plugin enabled at an
extension point it does not implement, duplicates, bad weights, invalid args) and fails with one
``FrameworkError`` line; running never raises for a plugin's fault.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from apis.core import Pod
from scheduler.config import Plugins, Profile
from scheduler.framework import interfaces as api
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.filtering import FilterOutcome, FilterPhase
from scheduler.framework.profile import FrameworkError, NullObserver, Observer
from scheduler.framework.status import Code, Status
from scheduler.framework.types import IntArray, NodeInfo, Snapshot

# FrameworkError, Observer and FilterOutcome are part of the runtime's public face (the commands
# and the core import them from here); they are defined beside the code that raises or uses them.
__all__ = ["FilterOutcome", "Framework", "FrameworkError", "NullObserver", "Observer"]

MAX_PERMIT_WAIT = 15 * 60.0  # kube-scheduler's maxTimeout for a waiting pod


class Framework(FilterPhase):
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
        handle.runner = self  # before the plugins are built, as they may keep the handle
        super().__init__(profile, registry, handle, default_plugins, observer, clock)

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
            # One pass: a negative int64 read as uint64 is above the maximum too (any other
            # dtype a plugin may return takes the two-pass check).
            if len(scores) and (
                bool((scores.view(np.uint64) > api.MAX_NODE_SCORE).any())
                if scores.dtype == np.int64
                else bool(scores.min() < 0 or scores.max() > api.MAX_NODE_SCORE)
            ):
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
            total += scores if weight == 1 else scores * weight
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
