"""A profile's plugins, built and validated from the configuration, and the two helpers every
extension point runs them through.

Role: the construction half of the framework runtime (kube-scheduler's ``NewFramework``).
``ProfileBase`` merges the default plugins with the profile's, expands multiPoint, instantiates
each plugin once, checks that every plugin implements the extension points it is enabled at,
and keeps the per-extension-point lists the runner iterates. ``_call`` runs one plugin call
(exceptions become Error statuses, the plugin name is stamped); ``_observe`` times an
extension point through the ``Observer``.

Invariants: building validates everything (unknown plugins, a plugin enabled at an extension
point it does not implement, duplicates, bad weights, invalid args) and fails with one
``FrameworkError`` line naming the profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from scheduler.config import PluginRef, Plugins, PluginSet, Profile, merge_plugins
from scheduler.framework import interfaces as api
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import ClusterEvent
from scheduler.framework.status import Code, Status

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


def code_label(status: Status | None) -> str:
    return "Success" if status is None else status.code.label


class ProfileBase:
    """One profile's plugins per extension point (built and validated on construction)."""

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
            self.name, EXTENSION_POINT_LABELS[ep], code_label(status), self._now() - start
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
                plugin.name, EXTENSION_POINT_LABELS[ep], code_label(status), self._now() - start
            )
        return status
