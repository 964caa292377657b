"""The effective configuration as a ``KubeSchedulerConfiguration`` v1 document (kube-scheduler's
``--write-config-to``).

Role: what the scheduler will run with, after the defaults, the default plugins and the
command-line flags: every field written out, each profile's plugins as the merged per-point
lists (with ``disabled: [{name: "*"}]``, so that loading the document back gives exactly these
lists), durations as Go writes them. ``parse_config`` of the result equals the input in every
field the scheduler uses (tested as a round trip).
"""

from __future__ import annotations

from typing import Any

from apis.duration import format_go_duration
from scheduler.config.decode import _POINT_KEYS
from scheduler.config.model import (
    API_VERSION,
    KIND,
    Plugins,
    PluginSet,
    Profile,
    SchedulerConfiguration,
    merge_plugins,
)

__all__ = ["effective_config_document"]

_POINT_NAMES = {attr: key for key, attr in _POINT_KEYS.items() if attr != "multi_point"}


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _plugin_set(point: str, merged: PluginSet) -> dict[str, Any]:
    enabled = []
    for ref in merged.enabled:
        entry: dict[str, Any] = {"name": ref.name}
        if point == "score":
            entry["weight"] = ref.weight or 1
        enabled.append(entry)
    return {"enabled": enabled, "disabled": [{"name": "*"}]}


def _profile(profile: Profile, default_plugins: Plugins | None) -> dict[str, Any]:
    merged = merge_plugins(default_plugins or Plugins(), profile.plugins)
    doc: dict[str, Any] = {"schedulerName": profile.scheduler_name}
    if profile.percentage_of_nodes_to_score is not None:
        doc["percentageOfNodesToScore"] = profile.percentage_of_nodes_to_score
    doc["plugins"] = {
        key: _plugin_set(attr, getattr(merged, attr)) for attr, key in _POINT_NAMES.items()
    }
    doc["pluginConfig"] = [
        {"name": entry.name, "args": _plain(entry.args)} for entry in profile.plugin_config
    ]
    return doc


def _plain(value: Any) -> Any:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def effective_config_document(
    config: SchedulerConfiguration, default_plugins: Plugins | None = None
) -> dict[str, Any]:
    """``config`` with ``default_plugins`` merged into every profile, as v1 data."""
    le = config.leader_election
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "parallelism": config.parallelism,
        "percentageOfNodesToScore": config.percentage_of_nodes_to_score,
        "podInitialBackoffSeconds": _number(config.pod_initial_backoff_seconds),
        "podMaxBackoffSeconds": _number(config.pod_max_backoff_seconds),
        "leaderElection": {
            "leaderElect": le.leader_elect,
            "leaseDuration": format_go_duration(le.lease_duration),
            "renewDeadline": format_go_duration(le.renew_deadline),
            "retryPeriod": format_go_duration(le.retry_period),
            "resourceLock": le.resource_lock,
            "resourceName": le.resource_name,
            "resourceNamespace": le.resource_namespace,
        },
        "profiles": [_profile(p, default_plugins) for p in config.profiles],
    }
