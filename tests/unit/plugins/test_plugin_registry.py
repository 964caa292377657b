"""The in-tree registry (factories, args validation) and the default plugin set."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.config import PluginRef, Plugins
from scheduler.framework.interfaces import (
    BindPlugin,
    FilterPlugin,
    PluginArgsError,
    PreFilterPlugin,
    PreScorePlugin,
    QueueSortPlugin,
    ScorePlugin,
)
from scheduler.plugins.registry import default_plugins, in_tree_registry
from tests.builders import make_handle

PROTOCOL_OF = {
    "queue_sort": QueueSortPlugin,
    "pre_filter": PreFilterPlugin,
    "filter": FilterPlugin,
    "pre_score": PreScorePlugin,
    "score": ScorePlugin,
    "bind": BindPlugin,
}


def test_registry_names() -> None:
    assert set(in_tree_registry()) == {
        "PrioritySort",
        "NodeUnschedulable",
        "NodeName",
        "TaintToleration",
        "NodeAffinity",
        "NodeResourcesFit",
        "DefaultBinder",
        "DefaultPreemption",
        "DeviceShare",
        "GPUFragmentation",
        "Coscheduling",
    }


@pytest.mark.parametrize("name", sorted(in_tree_registry()))
def test_factory_builds_named_plugin(name: str) -> None:
    plugin = in_tree_registry()[name]({}, make_handle())
    assert plugin.name == name


@pytest.mark.parametrize("name", sorted(in_tree_registry()))
def test_unknown_args_are_errors(name: str) -> None:
    with pytest.raises(PluginArgsError, match=r"unknown field\(s\) bogus"):
        in_tree_registry()[name]({"bogus": 1}, make_handle())


@pytest.mark.parametrize(
    ("name", "args"),
    [
        pytest.param(
            "NodeResourcesFit",
            {
                "scoringStrategy": {
                    "type": "MostAllocated",
                    "resources": [{"name": "cpu", "weight": 3}],
                }
            },
            id="fit-args",
        ),
        pytest.param(
            "NodeAffinity",
            {
                "addedAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            id="affinity-args",
        ),
    ],
)
def test_factories_accept_valid_args(name: str, args: dict[str, Any]) -> None:
    assert in_tree_registry()[name](args, make_handle()).name == name


def test_default_plugins_kube_order() -> None:
    plugins = default_plugins()
    assert isinstance(plugins, Plugins)

    def names(point: str) -> list[str]:
        return [ref.name for ref in getattr(plugins, point).enabled]

    assert names("queue_sort") == ["PrioritySort"]
    assert names("pre_filter") == ["NodeAffinity", "NodeResourcesFit", "DeviceShare"]
    assert names("filter") == [
        "NodeUnschedulable",
        "NodeName",
        "TaintToleration",
        "NodeAffinity",
        "NodeResourcesFit",
        "DeviceShare",
    ]
    assert names("pre_score") == [
        "TaintToleration", "NodeAffinity", "NodeResourcesFit", "DeviceShare"
    ]
    assert plugins.score.enabled == (
        PluginRef("TaintToleration", 3),
        PluginRef("NodeAffinity", 2),
        PluginRef("NodeResourcesFit", 1),
        PluginRef("DeviceShare", 1),
    )
    assert names("reserve") == ["DeviceShare"]
    assert names("pre_bind") == ["DeviceShare"]
    assert names("bind") == ["DefaultBinder"]
    assert names("post_filter") == ["DefaultPreemption"]
    for point in ("permit", "post_bind", "multi_point"):
        assert names(point) == []
