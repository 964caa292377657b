"""The scheduler configuration's model: frozen dataclasses, defaults, kube's config arithmetic.

Role: the types ``scheduler.config.decode`` produces (``SchedulerConfiguration`` and its parts)
and the two pieces of kube-scheduler's configuration arithmetic the runtime needs: the v1
plugin-set merge (``mergePluginSet``) and the adaptive ``numFeasibleNodesToFind`` rule.

Invariants: standard library only; it knows no plugin (the plugin registry supplies default
plugin sets, merged in with ``merge_plugins``); every object is immutable; importing it has no
side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

__all__ = [
    "API_VERSION",
    "DEFAULT_SCHEDULER_NAME",
    "KIND",
    "ConfigError",
    "LeaderElection",
    "PluginConfig",
    "PluginRef",
    "PluginSet",
    "Plugins",
    "Profile",
    "SchedulerConfiguration",
    "default_config",
    "merge_plugin_set",
    "merge_plugins",
    "num_feasible_nodes_to_find",
]

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER_NAME = "koord-scheduler"

_MIN_FEASIBLE_NODES_TO_FIND = 100
_MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5


class ConfigError(ValueError):
    """An invalid configuration; ``str(e)`` is one line: ``<source>: <path>: <problem>``."""

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = " ".join(problem.split())
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {self.problem}")


# --------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True, slots=True)
class PluginRef:
    """A plugin named in an ``enabled``/``disabled`` list; weight 0 means unset (runtime: 1)."""

    name: str
    weight: int = 0


@dataclass(frozen=True, slots=True)
class PluginSet:
    """The plugins enabled and disabled at one extension point, in configuration order."""

    enabled: tuple[PluginRef, ...] = ()
    disabled: tuple[PluginRef, ...] = ()


_EMPTY_SET = PluginSet()


@dataclass(frozen=True, slots=True)
class Plugins:
    """One ``PluginSet`` per extension point (YAML keys are kube's camelCase names)."""

    queue_sort: PluginSet = _EMPTY_SET
    pre_filter: PluginSet = _EMPTY_SET
    filter: PluginSet = _EMPTY_SET
    post_filter: PluginSet = _EMPTY_SET
    pre_score: PluginSet = _EMPTY_SET
    score: PluginSet = _EMPTY_SET
    reserve: PluginSet = _EMPTY_SET
    permit: PluginSet = _EMPTY_SET
    pre_bind: PluginSet = _EMPTY_SET
    bind: PluginSet = _EMPTY_SET
    post_bind: PluginSet = _EMPTY_SET
    multi_point: PluginSet = _EMPTY_SET

    EXTENSION_POINTS: ClassVar[tuple[str, ...]] = (
        "queue_sort",
        "pre_filter",
        "filter",
        "post_filter",
        "pre_score",
        "score",
        "reserve",
        "permit",
        "pre_bind",
        "bind",
        "post_bind",
    )


_EMPTY_ARGS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Arguments for one plugin in one profile, kept as plain data (read-only at top level)."""

    name: str
    args: Mapping[str, Any] = field(default_factory=lambda: _EMPTY_ARGS, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.args, MappingProxyType):
            object.__setattr__(self, "args", MappingProxyType(dict(self.args)))


@dataclass(frozen=True, slots=True)
class Profile:
    """One scheduling profile: the pods whose ``spec.schedulerName`` matches use it.

    ``percentage_of_nodes_to_score`` None means "use the configuration's global value".
    """

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    plugins: Plugins = Plugins()
    plugin_config: tuple[PluginConfig, ...] = ()
    percentage_of_nodes_to_score: int | None = None

    def args_for(self, plugin_name: str) -> Mapping[str, Any]:
        """The ``pluginConfig`` args for ``plugin_name``; an empty mapping when none."""
        for entry in self.plugin_config:
            if entry.name == plugin_name:
                return entry.args
        return _EMPTY_ARGS


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """Leader election through a Lease; durations in seconds."""

    leader_elect: bool = True
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    resource_lock: str = "leases"
    resource_name: str = DEFAULT_SCHEDULER_NAME
    resource_namespace: str = "kube-system"


@dataclass(frozen=True, slots=True)
class SchedulerConfiguration:
    """The whole configuration. ``percentage_of_nodes_to_score`` 0 = kube's adaptive rule.

    ``parallelism`` is accepted and validated for compatibility but unused (the scheduling
    cycle is serial).
    """

    profiles: tuple[Profile, ...]
    percentage_of_nodes_to_score: int = 0
    pod_initial_backoff_seconds: float = 1.0
    pod_max_backoff_seconds: float = 10.0
    leader_election: LeaderElection = LeaderElection()
    parallelism: int = 16

    def profile(self, scheduler_name: str) -> Profile:
        """The profile named ``scheduler_name``; ``KeyError`` when there is none."""
        for prof in self.profiles:
            if prof.scheduler_name == scheduler_name:
                return prof
        known = ", ".join(p.scheduler_name for p in self.profiles)
        raise KeyError(f"no profile with schedulerName {scheduler_name!r} (profiles: {known})")


def default_config() -> SchedulerConfiguration:
    """One profile ``koord-scheduler`` with empty plugin sets and every default."""
    return SchedulerConfiguration(profiles=(Profile(),))


# --------------------------------------------------------------------------------------------
# kube-scheduler arithmetic


def merge_plugin_set(default: PluginSet, custom: PluginSet) -> PluginSet:
    """kube-scheduler v1 ``mergePluginSet``, step for step.

    Disabled names from ``custom`` then ``default`` (weights dropped) form the disabled list;
    ``"*"`` among them drops every default. Each remaining default plugin is kept in default
    order, replaced in place by a custom entry of the same name (the last one, so its weight
    wins); every custom entry that replaced nothing is appended in custom order.
    """
    disabled: list[PluginRef] = []
    disabled_names: set[str] = set()
    for ref in (*custom.disabled, *default.disabled):
        disabled.append(PluginRef(ref.name))
        disabled_names.add(ref.name)
    custom_by_name = {ref.name: (index, ref) for index, ref in enumerate(custom.enabled)}
    replaced: set[int] = set()
    enabled: list[PluginRef] = []
    if "*" not in disabled_names:
        for ref in default.enabled:
            if ref.name in disabled_names:
                continue
            hit = custom_by_name.get(ref.name)
            if hit is not None:
                replaced.add(hit[0])
                ref = hit[1]
            enabled.append(ref)
    enabled.extend(ref for index, ref in enumerate(custom.enabled) if index not in replaced)
    return PluginSet(enabled=tuple(enabled), disabled=tuple(disabled))


def merge_plugins(default: Plugins, custom: Plugins) -> Plugins:
    """kube-scheduler v1 ``mergePlugins``: ``merge_plugin_set`` at every point, multiPoint too.

    kube-scheduler v1 states its defaults as multiPoint plugins, so ``multiPoint: {disabled:
    [X]}`` (or ``"*"``) turns a default plugin off at every point; ours are stated per point,
    so that disable is applied to every point's defaults here (a plugin the profile enables
    at a point itself stays there, as kube's specific points override multiPoint)."""
    off = {ref.name for ref in custom.multi_point.disabled}
    names = (*Plugins.EXTENSION_POINTS, "multi_point")
    merged = {}
    for n in names:
        base: PluginSet = getattr(default, n)
        if off:
            kept = () if "*" in off else tuple(r for r in base.enabled if r.name not in off)
            base = PluginSet(enabled=kept, disabled=base.disabled)
        merged[n] = merge_plugin_set(base, getattr(custom, n))
    return Plugins(**merged)


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind``: how many feasible nodes end the search.

    Fewer than 100 nodes or a percentage of 100 or more: all nodes. Percentage 0 is adaptive,
    ``50 - nodes/125`` but at least 5. The result is ``nodes * percentage / 100`` (integer)
    but at least 100.
    """
    if num_all_nodes < _MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return num_all_nodes
    if percentage == 0:
        percentage = max(50 - num_all_nodes // 125, _MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(num_all_nodes * percentage // 100, _MIN_FEASIBLE_NODES_TO_FIND)


