"""Sweep files: a replay study larger than one command line (``simulate --sweep SWEEP.yaml``).

Role: read a YAML file naming traces x profiles x seeds x scheduler-argument variants and turn
it into one ``Plan`` (``scheduler.simulator.replay_plan``), run by any executor into one
results table. The format::

    nodes: openb_node_list_gpu_node.csv          # required; paths relative to this file
    traces: [openb_pod_list_default.csv, openb_pod_list_gpushare40.csv]   # required
    profiles: [binpack, fgd, fragmentation]      # names in config/profiles/ or config files
    seeds: 52-61                                 # "42-51", "42,45", 42 or [42, 45]
    inflate: 1.3                                 # optional (1.3)
    targetWorkload: trace                        # optional: trace | learned
    expected: fgd_expected_results               # optional: the paper's results folder
    variants:                                    # optional: name -> plugin -> args
      pinned3:
        GPUFragmentation: {gradient: {pinnedWeight: 3}}

Each variant runs every profile that enables or configures each plugin it names, with those
args merged (mappings key by key, anything else replaced) into the profile's ``pluginConfig``;
its results are labelled ``<profile>+<variant>`` and follow the profile's own, which always
runs too.

Invariants: the whole file is checked before any replay: an unknown field, a wrong type, a
missing file, a variant that no profile can take or args a plugin rejects is one
``ReplayUsageError`` naming the file and the field; duplicate YAML keys are errors.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import yaml
from yaml.nodes import MappingNode

from apis.yamlload import HAVE_LIBYAML, load_one
from scheduler.config import Plugins, merge_plugins
from scheduler.framework.interfaces import PluginFactory
from scheduler.simulator.replay_job import PolicyDoc, ReplayUsageError, check_policy
from scheduler.simulator.replay_plan import (
    DEFAULT_PROFILES,
    Plan,
    Policy,
    build_plan,
    parse_seeds,
    read_policies,
)

__all__ = ["load_sweep"]

FIELDS = ("nodes", "traces", "profiles", "seeds", "inflate", "targetWorkload", "expected",
          "variants")  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class _Strict:
    """Duplicate keys are errors (a second ``seeds:`` must not silently win); a mixin of the
    pure loader and of its libyaml twin (one set of the keys seen: linear in the keys)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            if isinstance(key, str):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)  # type: ignore[misc]
        return result


class _StrictLoader(_Strict, yaml.SafeLoader):
    pass


_CStrictLoader: type[Any] | None = (
    type("_CStrictLoader", (_Strict, yaml.CSafeLoader), {}) if HAVE_LIBYAML else None
)


class _Fields:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> NoReturn:
        raise ReplayUsageError(f"{self.source}: {field}: {problem}" if field else
                               f"{self.source}: {problem}")  # fmt: skip

    def path(self, raw: Any, field: str) -> str:
        if not isinstance(raw, str) or not raw:
            self.fail(field, f"expected a file path, got {_show(raw)}")
        here = os.path.dirname(self.source)
        return raw if os.path.isabs(raw) else os.path.normpath(os.path.join(here, raw))

    def strings(self, raw: Any, field: str) -> list[str]:
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
            self.fail(field, f"expected a non-empty list of strings, got {_show(raw)}")
        return list(raw)

    def seeds(self, raw: Any) -> list[int]:
        if isinstance(raw, bool):
            self.fail("seeds", f"expected seeds like 42-51, 42 or [42, 45], got {_show(raw)}")
        if isinstance(raw, int):
            return [raw]
        if isinstance(raw, list) and raw and all(
            isinstance(v, int) and not isinstance(v, bool) for v in raw
        ):
            return list(dict.fromkeys(raw))
        if isinstance(raw, str):
            try:
                return parse_seeds(raw)
            except ReplayUsageError:
                pass
        self.fail("seeds", f"expected seeds like 42-51, 42 or [42, 45], got {_show(raw)}")


def load_sweep(
    path: str, registry: Mapping[str, PluginFactory], default_plugins: Plugins | None
) -> Plan:
    data = _read(path)
    f = _Fields(path)
    if not isinstance(data, dict):
        f.fail("", f"expected a mapping of {', '.join(FIELDS)}, got {_show(data)}")
    for key in data:
        if key not in FIELDS:
            f.fail(str(key), f"unknown field (known: {', '.join(FIELDS)})")
    for key in ("nodes", "traces"):
        if key not in data:
            f.fail(key, "missing (required)")
    nodes = f.path(data["nodes"], "nodes")
    traces = [f.path(t, f"traces[{i}]") for i, t in enumerate(f.strings(data["traces"], "traces"))]
    raw = data.get("profiles", DEFAULT_PROFILES)
    names = f.strings([n.strip() for n in raw.split(",")] if isinstance(raw, str) else raw,
                      "profiles")  # fmt: skip
    names = [f.path(n, "profiles") if n.endswith((".yaml", ".yml")) or "/" in n else n
             for n in names]  # fmt: skip
    seeds = f.seeds(data.get("seeds", 42))
    inflate = data.get("inflate", 1.3)
    if (
        isinstance(inflate, bool)
        or not isinstance(inflate, int | float)
        or not (math.isfinite(inflate) and inflate >= 0)
    ):
        f.fail("inflate", f"expected a finite number >= 0, got {_show(inflate)}")
    target = data.get("targetWorkload", "trace")
    if target not in ("trace", "learned"):
        f.fail("targetWorkload", f"expected trace or learned, got {_show(target)}")
    expected = f.path(data["expected"], "expected") if "expected" in data else None
    policies = read_policies(names, registry, default_plugins, what=f"{path}: profiles")
    variants = _variants(f, data.get("variants", {}), policies, registry, default_plugins)
    ordered = [v for p in policies for v in (p, *variants.get(p.name, ()))]
    return build_plan(
        nodes,
        traces,
        ordered,
        seeds,
        float(inflate),
        target == "learned",
        registry,
        default_plugins,
        expected,
    )


def _read(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not valid UTF-8 text"
        raise ReplayUsageError(f"--sweep {path}: cannot read the file: {reason}") from None
    try:
        return load_one(text, _StrictLoader, _CStrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ReplayUsageError(f"{path}: {where}invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ReplayUsageError(f"{path}: invalid YAML: {exc}") from None


def _variants(
    f: _Fields,
    raw: Any,
    policies: list[Policy],
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
) -> dict[str, list[Policy]]:
    """Profile name -> its variants, in the file's order."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        f.fail("variants", f"expected a mapping of name -> plugin -> args, got {_show(raw)}")
    out: dict[str, list[Policy]] = {}
    for name, plugins in raw.items():
        field = f"variants.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            f.fail(f"variants.{name}", "a variant name is letters, digits, '.', '_' or '-'")
        if not isinstance(plugins, dict) or not plugins:
            f.fail(field, f"expected a mapping of plugin name -> args, got {_show(plugins)}")
        for plugin, args in plugins.items():
            if not isinstance(args, dict):
                f.fail(f"{field}.{plugin}", f"expected a mapping of args, got {_show(args)}")
            if not any(_uses(p.doc, str(plugin), default_plugins) for p in policies):
                f.fail(f"{field}.{plugin}", "no profile of this sweep enables or configures it")
        for policy in policies:
            names = [str(p) for p in plugins if _uses(policy.doc, str(p), default_plugins)]
            if not names:
                continue
            data = copy.deepcopy(policy.doc.data)
            for plugin in names:
                _merge_args(data, plugin, plugins[plugin])
            doc = PolicyDoc(f"{f.source}: {field} on {policy.name}", data)
            check_policy(doc, registry, default_plugins)
            out.setdefault(policy.name, []).append(Policy(f"{policy.name}+{name}", doc))
    return out


def _uses(doc: PolicyDoc, plugin: str, default_plugins: Plugins | None) -> bool:
    profile = doc.parse().profiles[0]
    if any(c.name == plugin for c in profile.plugin_config):
        return True
    merged = merge_plugins(default_plugins or Plugins(), profile.plugins)
    return any(
        ref.name == plugin
        for ep in (*Plugins.EXTENSION_POINTS, "multi_point")
        for ref in getattr(merged, ep).enabled
    )


def _merge_args(data: Any, plugin: str, args: Mapping[str, Any]) -> None:
    """Merge ``args`` into the (one) profile's pluginConfig entry for ``plugin``, adding the
    entry when the profile has none (the document was validated: these shapes hold)."""
    profile = data["profiles"][0]
    entries = profile.get("pluginConfig") or []
    profile["pluginConfig"] = entries
    for entry in entries:
        if entry.get("name") == plugin:
            entry["args"] = _deep_merge(entry.get("args") or {}, args)
            return
    entries.append({"name": plugin, "args": copy.deepcopy(dict(args))})


def _deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        both = isinstance(old, Mapping) and isinstance(value, Mapping)
        out[key] = _deep_merge(old, value) if both else copy.deepcopy(value)  # type: ignore[arg-type]
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
