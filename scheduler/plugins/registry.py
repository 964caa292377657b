"""The in-tree plugin registry and kube-scheduler's default plugin set.

Role: the only module that imports every plugin. ``in_tree_registry()`` maps each plugin name
to a factory ``(args, handle) -> plugin`` that validates the plugin's ``pluginConfig`` args
(unknown keys are errors; a bad value raises ``PluginArgsError`` naming the field) and builds
the plugin. ``default_plugins()`` is the enabled set per extension point, in kube-scheduler's
order, that a profile's configuration is merged into (``scheduler.config.merge_plugins``).

Invariants: building the registry has no side effects and returns a fresh dict each call;
every name in ``default_plugins()`` is a key of ``in_tree_registry()``, and every default
entry at an extension point names a plugin that implements that extension point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.config import PluginRef, Plugins, PluginSet
from scheduler.framework.interfaces import Handle, PluginArgsError, PluginFactory
from scheduler.plugins import nodeaffinity, noderesources
from scheduler.plugins.coscheduling import Coscheduling, new_coscheduling
from scheduler.plugins.defaultbinder import DefaultBinder
from scheduler.plugins.defaultpreemption import DefaultPreemption, new_default_preemption
from scheduler.plugins.deviceshare import DeviceShare, new_deviceshare
from scheduler.plugins.gpufragmentation import GPUFragmentation, new_gpufragmentation
from scheduler.plugins.nodeaffinity import NodeAffinity
from scheduler.plugins.nodename import NodeName
from scheduler.plugins.noderesources import NodeResourcesFit
from scheduler.plugins.nodeunschedulable import NodeUnschedulable
from scheduler.plugins.prioritysort import PrioritySort
from scheduler.plugins.tainttoleration import TaintToleration

__all__ = ["default_plugins", "in_tree_registry"]


def _no_args(plugin: str, args: Mapping[str, Any]) -> None:
    if args:
        unknown = ", ".join(sorted(str(k) for k in args))
        raise PluginArgsError(f"{plugin} args: unknown field(s) {unknown} ({plugin} takes no args)")


def _new_priority_sort(args: Mapping[str, Any], handle: Handle) -> PrioritySort:
    _no_args(PrioritySort.name, args)
    return PrioritySort()


def _new_node_unschedulable(args: Mapping[str, Any], handle: Handle) -> NodeUnschedulable:
    _no_args(NodeUnschedulable.name, args)
    return NodeUnschedulable()


def _new_node_name(args: Mapping[str, Any], handle: Handle) -> NodeName:
    _no_args(NodeName.name, args)
    return NodeName()


def _new_taint_toleration(args: Mapping[str, Any], handle: Handle) -> TaintToleration:
    _no_args(TaintToleration.name, args)
    return TaintToleration()


def _new_node_affinity(args: Mapping[str, Any], handle: Handle) -> NodeAffinity:
    return NodeAffinity(nodeaffinity.parse_args(args))


def _new_node_resources_fit(args: Mapping[str, Any], handle: Handle) -> NodeResourcesFit:
    return NodeResourcesFit(noderesources.parse_args(args))


def _new_default_binder(args: Mapping[str, Any], handle: Handle) -> DefaultBinder:
    _no_args(DefaultBinder.name, args)
    return DefaultBinder(handle)


def in_tree_registry() -> dict[str, PluginFactory]:
    """Plugin name -> factory, for every plugin this scheduler ships."""
    registry: dict[str, PluginFactory] = {
        PrioritySort.name: _new_priority_sort,
        NodeUnschedulable.name: _new_node_unschedulable,
        NodeName.name: _new_node_name,
        TaintToleration.name: _new_taint_toleration,
        NodeAffinity.name: _new_node_affinity,
        NodeResourcesFit.name: _new_node_resources_fit,
        DefaultBinder.name: _new_default_binder,
        DefaultPreemption.name: new_default_preemption,
        DeviceShare.name: new_deviceshare,
        GPUFragmentation.name: new_gpufragmentation,  # opt-in: not in default_plugins()
        Coscheduling.name: new_coscheduling,  # opt-in: not in default_plugins()
    }
    return registry


def _set(*names: str | tuple[str, int]) -> PluginSet:
    refs = tuple(PluginRef(n) if isinstance(n, str) else PluginRef(n[0], n[1]) for n in names)
    return PluginSet(enabled=refs)


def default_plugins() -> Plugins:
    """kube-scheduler's default enabled plugins (of those implemented here), in kube order,
    and DeviceShare after them at every extension point it implements."""
    return Plugins(
        queue_sort=_set(PrioritySort.name),
        pre_filter=_set(NodeAffinity.name, NodeResourcesFit.name, DeviceShare.name),
        filter=_set(
            NodeUnschedulable.name,
            NodeName.name,
            TaintToleration.name,
            NodeAffinity.name,
            NodeResourcesFit.name,
            DeviceShare.name,
        ),
        post_filter=_set(DefaultPreemption.name),
        pre_score=_set(
            TaintToleration.name, NodeAffinity.name, NodeResourcesFit.name, DeviceShare.name
        ),
        score=_set(
            (TaintToleration.name, 3),
            (NodeAffinity.name, 2),
            (NodeResourcesFit.name, 1),
            (DeviceShare.name, 1),
        ),
        reserve=_set(DeviceShare.name),
        pre_bind=_set(DeviceShare.name),
        bind=_set(DefaultBinder.name),
    )
