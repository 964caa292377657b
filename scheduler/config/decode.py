"""KubeSchedulerConfiguration (``kubescheduler.config.k8s.io/v1``) loading and validation.

Role: turn the scheduler's configuration file (or already-decoded YAML/JSON data) into
immutable dataclasses (``scheduler.config.model``), apply kube-scheduler's defaults and validate
it the way kube-scheduler's strict decoder and validation do.

Invariants:

- Layering: imports only the standard library and PyYAML. It knows no plugin; the plugin
  registry supplies default plugin sets later and merges them in with ``merge_plugins``.
- Every ``SchedulerConfiguration`` returned by ``parse_config``/``load_config`` is fully
  validated: at least one profile, unique non-empty scheduler names, percentages in 0..100,
  positive backoffs with initial <= max, ordered leader-election durations, plugin names
  non-empty with no duplicate in one ``enabled`` list, at most one ``pluginConfig`` per plugin.
  Objects built directly by code are trusted as given.
- Decoding is strict: an unknown field anywhere in the schema, a duplicate mapping key, or a
  value of the wrong type is an error. Booleans are never accepted as integers.
- Every failure is one ``ConfigError`` whose ``str`` is a single line
  ``"<source>: <field path>: <problem>"``; the first problem found wins (apiVersion and kind
  first, then unknown fields, then each field in schema order). YAML syntax errors carry
  ``line L, column C`` in place of the field path.
- An explicit ``null`` reads as "not set" (the default applies), as with kube's pointer fields.
- The result is immutable: dataclasses are frozen, sequences are tuples and plugin args are
  read-only mappings over a private deep copy of the input (nested values are plain
  dicts/lists; plugins parse and validate their own args).
- Importing this module has no side effects.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NoReturn

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from apis.duration import DurationError, parse_go_duration_seconds
from apis.yamlload import HAVE_LIBYAML, load_one
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
)

__all__ = [
    "load_config",
    "override_leader_election",
    "parse_config",
    "read_config_document",
]

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

# --------------------------------------------------------------------------------------------
# Loading


class _Strict:
    """Rejects duplicate keys in a mapping, like kube's strict decoder (a mixin of both
    loaders: the constructor is Python's SafeConstructor with the C parser too)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(  # type: ignore[attr-defined]
                key_node, deep=True
            )
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key; the base class reports it
                continue
            if duplicate:
                raise ConstructorError(
                    None, None, f"duplicate key {_show(key)}", key_node.start_mark
                )
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)  # type: ignore[misc]
        return result


class _StrictLoader(_Strict, yaml.SafeLoader):
    """The pure-Python strict loader: its errors are the ones reported."""


_CStrictLoader: type[Any] | None = (
    type("_CStrictLoader", (_Strict, yaml.CSafeLoader), {}) if HAVE_LIBYAML else None
)
"""The same over libyaml's parser (``apis.yamlload``), when PyYAML has it."""


def load_config(path: str | os.PathLike[str]) -> SchedulerConfiguration:
    """Read, parse and validate a YAML configuration file; every failure is a ConfigError."""
    return parse_config(read_config_document(path), os.fspath(path))


def read_config_document(path: str | os.PathLike[str]) -> Any:
    """The file's YAML document as plain data, not yet validated (``parse_config`` does that);
    read, encoding and YAML failures are ConfigErrors. Plain data can be pickled, so a replay
    on another machine parses the same document."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "", f"not valid UTF-8 text: {exc.reason}") from exc
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read file: {exc.strerror or exc}") from exc
    try:
        data = load_one(text, _StrictLoader, _CStrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        parts = [exc.context, exc.problem]  # "while parsing ..." contexts are noise
        problem = ", ".join(p for p in parts if p and not p.startswith("while ")) or "malformed"
        raise ConfigError(source, where, f"invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, "", f"invalid YAML: {exc}") from exc
    if data is None:
        raise ConfigError(source, "", "file is empty; expected a KubeSchedulerConfiguration")
    return data


def parse_config(data: Any, source: str = "<config>") -> SchedulerConfiguration:
    """Decode, default and validate a KubeSchedulerConfiguration given as plain data."""
    return _Decoder(source).configuration(data)


def _check_leader_election(
    result: LeaderElection,
    fail: Callable[[str, str], NoReturn],
    name: Callable[[str], str],
) -> None:
    """kube's ValidateLeaderElectionConfiguration: only when electing, ``leases``, a name and a
    namespace, ``leaseDuration > renewDeadline > retryPeriod > 0``. ``fail(key, problem)``
    reports the field ``key``; ``name(key)`` is how another field is named in a message."""
    if not result.leader_elect:  # kube validates the rest only when electing
        return
    if result.resource_lock != "leases":
        fail("resourceLock", f'only "leases" is supported, got {_show(result.resource_lock)}')
    for key, text in (
        ("resourceName", result.resource_name),
        ("resourceNamespace", result.resource_namespace),
    ):
        if not text:
            fail(key, "must not be empty when leaderElect is true")
    if not result.retry_period > 0:
        fail("retryPeriod", f"must be greater than 0, got {_seconds(result.retry_period)}")
    for key, value_s, other, other_s in (
        ("renewDeadline", result.renew_deadline, "retryPeriod", result.retry_period),
        ("leaseDuration", result.lease_duration, "renewDeadline", result.renew_deadline),
    ):
        if not value_s > other_s:
            fail(
                key,
                f"must be greater than {name(other)} ({_seconds(other_s)}), "
                f"got {_seconds(value_s)}",
            )


_LEADER_ELECTION_KEYS = {
    "leaderElect": "leader_elect",
    "leaseDuration": "lease_duration",
    "renewDeadline": "renew_deadline",
    "retryPeriod": "retry_period",
    "resourceName": "resource_name",
    "resourceNamespace": "resource_namespace",
}


def override_leader_election(
    config: SchedulerConfiguration,
    flags: Mapping[str, tuple[str, Any]],
    source: str = "<config>",
) -> SchedulerConfiguration:
    """kube-scheduler's ``ApplyLeaderElectionTo``: each flag given replaces its field of the
    configuration's ``leaderElection`` (``flags``: field name as in the file, e.g.
    ``renewDeadline`` -> (flag name, value in seconds or as text)); the result is validated as
    a whole, and a problem names the flag (or ``source``'s field) it comes from."""
    if not flags:
        return config
    changes = {_LEADER_ELECTION_KEYS[key]: value for key, (_, value) in flags.items()}
    result = dataclasses.replace(config.leader_election, **changes)

    def name(key: str) -> str:
        return flags[key][0] if key in flags else _join("leaderElection", key)

    def fail(key: str, problem: str) -> NoReturn:
        if key in flags:
            raise ConfigError(flags[key][0], "", problem)
        raise ConfigError(source, _join("leaderElection", key), problem)

    _check_leader_election(result, fail, name)
    return dataclasses.replace(config, leader_election=result)


# --------------------------------------------------------------------------------------------
# Decoding and validation


_TOP_LEVEL_FIELDS = (
    "apiVersion",
    "kind",
    "clientConnection",
    "delayCacheUntilActive",
    "enableContentionProfiling",
    "enableProfiling",
    "extenders",
    "healthzBindAddress",
    "leaderElection",
    "metricsBindAddress",
    "parallelism",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
)
_CLIENT_CONNECTION_FIELDS = ("acceptContentTypes", "burst", "contentType", "kubeconfig", "qps")
_LEADER_ELECTION_FIELDS = (
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
    "retryPeriod",
)
_PROFILE_FIELDS = ("percentageOfNodesToScore", "pluginConfig", "plugins", "schedulerName")
_POINT_KEYS = {
    "queueSort": "queue_sort",
    "preFilter": "pre_filter",
    "filter": "filter",
    "postFilter": "post_filter",
    "preScore": "pre_score",
    "score": "score",
    "reserve": "reserve",
    "permit": "permit",
    "preBind": "pre_bind",
    "bind": "bind",
    "postBind": "post_bind",
    "multiPoint": "multi_point",
}
_UNSUPPORTED_POINTS = {"preEnqueue": "koord-scheduler has no PreEnqueue extension point"}


def _show(value: Any) -> str:
    """A short, one-line rendering of a YAML value for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:56] + '..."'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _plain(value: Any) -> Any:
    """A deep copy of decoded YAML/JSON data as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _parse_go_duration(text: str) -> float | None:
    """Go's ``time.ParseDuration`` in seconds, or None when ``text`` is not a duration."""
    try:
        return parse_go_duration_seconds(text)
    except DurationError:
        return None


class _Decoder:
    """Walks decoded data with a field path; raises the first problem as a ConfigError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> NoReturn:
        raise ConfigError(self.source, path, problem)

    # -- generic value checks --------------------------------------------------------------

    def mapping(self, value: Any, path: str, allowed: Iterable[str]) -> Mapping[Any, Any]:
        """A mapping (null reads as empty) whose keys are all in ``allowed``."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping, got {_show(value)}")
        known = tuple(allowed)
        for key in value:
            if key not in known:
                self.fail(_join(path, key), f"unknown field (known: {', '.join(sorted(known))})")
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        """A list (null reads as empty)."""
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            self.fail(path, f"must be a list, got {_show(value)}")
        return list(value)

    def integer(self, value: Any, path: str, low: int, high: int, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(path, f"must be {what}, got {_show(value)}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"must be true or false, got {_show(value)}")
        return value

    def string(self, value: Any, path: str, *, non_empty: bool = False) -> str:
        if not isinstance(value, str) or (non_empty and not value):
            self.fail(
                path, f"must be a {'non-empty ' if non_empty else ''}string, got {_show(value)}"
            )
        return value

    def duration(self, value: Any, path: str) -> float:
        seconds = _parse_go_duration(value) if isinstance(value, str) else None
        if seconds is None:
            self.fail(path, f'must be a duration such as "15s" or "1m30s", got {_show(value)}')
        return seconds

    def percentage(self, value: Any, path: str) -> int:
        return self.integer(value, path, 0, 100, "an integer between 0 and 100")

    # -- the schema ------------------------------------------------------------------------

    def configuration(self, data: Any) -> SchedulerConfiguration:
        if not isinstance(data, Mapping):
            self.fail("", f"must be a {KIND} mapping, got {_show(data)}")
        for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key not in data:
                self.fail(key, f'missing; must be "{expected}"')
            if data[key] != expected:
                self.fail(key, f'must be "{expected}", got {_show(data[key])}')
        self.mapping(data, "", _TOP_LEVEL_FIELDS)

        self.mapping(data.get("clientConnection"), "clientConnection", _CLIENT_CONNECTION_FIELDS)
        for key in ("delayCacheUntilActive", "enableContentionProfiling", "enableProfiling"):
            if data.get(key) is not None:
                self.boolean(data[key], key)
        for key in ("healthzBindAddress", "metricsBindAddress"):
            if data.get(key) is not None:
                self.string(data[key], key)
        if self.sequence(data.get("extenders"), "extenders"):
            self.fail("extenders", "not supported by koord-scheduler; remove the extenders")

        defaults = SchedulerConfiguration(profiles=())
        parallelism = defaults.parallelism
        if data.get("parallelism") is not None:
            parallelism = self.integer(
                data["parallelism"], "parallelism", 1, _INT32_MAX, "a positive integer"
            )
        percentage = defaults.percentage_of_nodes_to_score
        if data.get("percentageOfNodesToScore") is not None:
            percentage = self.percentage(
                data["percentageOfNodesToScore"], "percentageOfNodesToScore"
            )
        initial, maximum = self.backoffs(data)
        leader_election = self.leader_election(data.get("leaderElection"), "leaderElection")
        return SchedulerConfiguration(
            profiles=self.profiles(data.get("profiles"), "profiles"),
            percentage_of_nodes_to_score=percentage,
            pod_initial_backoff_seconds=initial,
            pod_max_backoff_seconds=maximum,
            leader_election=leader_election,
            parallelism=parallelism,
        )

    def backoffs(self, data: Mapping[Any, Any]) -> tuple[float, float]:
        positive = "a positive integer (seconds)"
        initial, maximum = 1, 10
        if data.get("podInitialBackoffSeconds") is not None:
            key = "podInitialBackoffSeconds"
            initial = self.integer(data[key], key, 1, _INT64_MAX, positive)
        if data.get("podMaxBackoffSeconds") is not None:
            key = "podMaxBackoffSeconds"
            maximum = self.integer(data[key], key, 1, _INT64_MAX, positive)
        if maximum < initial:
            self.fail(
                "podMaxBackoffSeconds",
                f"must be greater than or equal to podInitialBackoffSeconds ({initial}), "
                f"got {maximum}",
            )
        return float(initial), float(maximum)

    def leader_election(self, value: Any, path: str) -> LeaderElection:
        raw = self.mapping(value, path, _LEADER_ELECTION_FIELDS)
        base = LeaderElection()

        def get(key: str, default: Any, check: Callable[[Any, str], Any]) -> Any:
            item = raw.get(key)
            return default if item is None else check(item, _join(path, key))

        result = LeaderElection(
            leader_elect=get("leaderElect", base.leader_elect, self.boolean),
            lease_duration=get("leaseDuration", base.lease_duration, self.duration),
            renew_deadline=get("renewDeadline", base.renew_deadline, self.duration),
            retry_period=get("retryPeriod", base.retry_period, self.duration),
            resource_lock=get("resourceLock", base.resource_lock, self.string),
            resource_name=get("resourceName", base.resource_name, self.string),
            resource_namespace=get("resourceNamespace", base.resource_namespace, self.string),
        )
        _check_leader_election(
            result, lambda key, problem: self.fail(_join(path, key), problem), lambda key: key
        )
        return result

    def profiles(self, value: Any, path: str) -> tuple[Profile, ...]:
        items = self.sequence(value, path)
        if not items:
            return (Profile(),)
        profiles: list[Profile] = []
        first_index: dict[str, int] = {}
        for index, item in enumerate(items):
            item_path = f"{path}[{index}]"
            profile = self.profile(item, item_path)
            name = profile.scheduler_name
            if name in first_index:
                self.fail(
                    _join(item_path, "schedulerName"),
                    f"duplicate schedulerName {_show(name)} (also {path}[{first_index[name]}])",
                )
            first_index[name] = index
            profiles.append(profile)
        return tuple(profiles)

    def profile(self, value: Any, path: str) -> Profile:
        if value is None:
            self.fail(path, "must be a mapping, got null")
        raw = self.mapping(value, path, _PROFILE_FIELDS)
        name = DEFAULT_SCHEDULER_NAME
        if raw.get("schedulerName") is not None:
            name = self.string(raw["schedulerName"], _join(path, "schedulerName"), non_empty=True)
        percentage = None
        if raw.get("percentageOfNodesToScore") is not None:
            key = _join(path, "percentageOfNodesToScore")
            percentage = self.percentage(raw["percentageOfNodesToScore"], key)
        return Profile(
            scheduler_name=name,
            plugins=self.plugins(raw.get("plugins"), _join(path, "plugins")),
            plugin_config=self.plugin_configs(raw.get("pluginConfig"), _join(path, "pluginConfig")),
            percentage_of_nodes_to_score=percentage,
        )

    def plugins(self, value: Any, path: str) -> Plugins:
        if isinstance(value, Mapping):
            for key, reason in _UNSUPPORTED_POINTS.items():
                if key in value:
                    self.fail(_join(path, key), f"not supported ({reason})")
        raw = self.mapping(value, path, _POINT_KEYS)
        sets = {
            _POINT_KEYS[key]: self.plugin_set(item, _join(path, key)) for key, item in raw.items()
        }
        return Plugins(**sets)

    def plugin_set(self, value: Any, path: str) -> PluginSet:
        raw = self.mapping(value, path, ("disabled", "enabled"))
        enabled = self.plugin_refs(raw.get("enabled"), _join(path, "enabled"), enabled=True)
        disabled = self.plugin_refs(raw.get("disabled"), _join(path, "disabled"), enabled=False)
        return PluginSet(enabled=enabled, disabled=disabled)

    def plugin_refs(self, value: Any, path: str, *, enabled: bool) -> tuple[PluginRef, ...]:
        refs: list[PluginRef] = []
        first_index: dict[str, int] = {}
        for index, item in enumerate(self.sequence(value, path)):
            item_path = f"{path}[{index}]"
            if item is None:
                self.fail(item_path, "must be a mapping, got null")
            raw = self.mapping(item, item_path, ("name", "weight"))
            name_path = _join(item_path, "name")
            if "name" not in raw:
                self.fail(name_path, "missing; every plugin needs a name")
            name = self.string(raw["name"], name_path, non_empty=True)
            if enabled and name == "*":
                self.fail(name_path, '"*" is only allowed in a disabled list')
            if enabled and name in first_index:
                self.fail(
                    name_path,
                    f"duplicate plugin {_show(name)} (also {path}[{first_index[name]}])",
                )
            first_index.setdefault(name, index)
            weight = 0
            if raw.get("weight") is not None:
                weight = self.integer(
                    raw["weight"],
                    _join(item_path, "weight"),
                    0,
                    _INT32_MAX,
                    "a non-negative integer",
                )
            refs.append(PluginRef(name=name, weight=weight))
        return tuple(refs)

    def plugin_configs(self, value: Any, path: str) -> tuple[PluginConfig, ...]:
        configs: list[PluginConfig] = []
        first_index: dict[str, int] = {}
        for index, item in enumerate(self.sequence(value, path)):
            item_path = f"{path}[{index}]"
            if item is None:
                self.fail(item_path, "must be a mapping, got null")
            raw = self.mapping(item, item_path, ("args", "name"))
            name_path = _join(item_path, "name")
            if "name" not in raw:
                self.fail(name_path, "missing; every pluginConfig entry needs a plugin name")
            name = self.string(raw["name"], name_path, non_empty=True)
            if name in first_index:
                self.fail(
                    name_path,
                    f"duplicate pluginConfig for plugin {_show(name)} "
                    f"(also {path}[{first_index[name]}])",
                )
            first_index[name] = index
            args_path = _join(item_path, "args")
            args = raw.get("args")
            if args is None:
                args = {}
            if not isinstance(args, Mapping):
                self.fail(args_path, f"must be a mapping, got {_show(args)}")
            for key in args:
                if not isinstance(key, str):
                    self.fail(args_path, f"keys must be strings, got {_show(key)}")
            plain = {k: _plain(v) for k, v in args.items() if k not in ("apiVersion", "kind")}
            configs.append(PluginConfig(name=name, args=MappingProxyType(plain)))
        return tuple(configs)
