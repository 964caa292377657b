"""The scheduler's configuration: ``kubescheduler.config.k8s.io/v1`` KubeSchedulerConfiguration.

``model`` holds the frozen dataclasses, defaults and kube's config arithmetic (plugin-set
merge, adaptive node sampling); ``decode`` loads and validates files and data into them. Both
are re-exported here, so callers import from ``scheduler.config``. Layering: standard library
and PyYAML only; no plugin is known here.
"""

from scheduler.config.decode import (
    load_config,
    override_leader_election,
    parse_config,
    read_config_document,
)
from scheduler.config.model import (
    API_VERSION,
    DEFAULT_SCHEDULER_NAME,
    KIND,
    ConfigError,
    LeaderElection,
    PluginConfig,
    PluginRef,
    Plugins,
    PluginSet,
    Profile,
    SchedulerConfiguration,
    default_config,
    merge_plugin_set,
    merge_plugins,
    num_feasible_nodes_to_find,
)

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
    "load_config",
    "merge_plugin_set",
    "merge_plugins",
    "num_feasible_nodes_to_find",
    "override_leader_election",
    "parse_config",
    "read_config_document",
]
