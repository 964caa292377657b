"""Shared validation of plugins' ``pluginConfig`` args: one error format, one scoringStrategy.

Several plugins take kube's ``scoringStrategy {type, resources: [{name, weight}]}`` shape
(NodeResourcesFit, DeviceShare, ...). Plugins never import each other, so the shape's rules
live here, with the error format every plugin uses:
``<Plugin> args: <field path>: <problem>``.

Invariants: a parsed strategy type is LeastAllocated or MostAllocated (absent or empty means
the caller's default, or is an error); a parsed weight is in [1, 100] (0 or absent means 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from scheduler.framework.interfaces import PluginArgsError

LEAST_ALLOCATED: Final = "LeastAllocated"
MOST_ALLOCATED: Final = "MostAllocated"
MAX_RESOURCE_WEIGHT: Final = 100

_RESOURCE_KEYS: Final = frozenset({"name", "weight"})


class ArgsReader:
    """Reads one plugin's args; every error names the plugin and the field path."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin

    def fail(self, path: str, problem: str) -> PluginArgsError:
        return PluginArgsError(f"{self.plugin} args: {path}: {problem}")

    def mapping(self, value: Any, path: str, allowed: frozenset[str]) -> Mapping[str, Any]:
        """``value`` as a mapping with no keys beyond ``allowed``."""
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected a mapping, got {value!r}")
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            raise self.fail(path, f"unknown field(s) {', '.join(unknown)}")
        return value

    def strategy_type(
        self, value: Any, path: str = "scoringStrategy.type", default: str | None = LEAST_ALLOCATED
    ) -> str:
        """The strategy; absent or empty gives ``default`` (None: required, as kube's
        NodeResourcesFitArgs validation demands once a scoringStrategy is given)."""
        if (value is None or value == "") and default is not None:
            return default
        if value not in (LEAST_ALLOCATED, MOST_ALLOCATED):
            raise self.fail(
                path,
                f'unsupported value {value!r}: supported values: "{LEAST_ALLOCATED}", '
                f'"{MOST_ALLOCATED}"',
            )
        return str(value)

    def resource_weights(
        self,
        specs: Any,
        path: str = "scoringStrategy.resources",
        *,
        allowed: Sequence[str] | None = None,
        unique: bool = False,
    ) -> tuple[tuple[str, int], ...] | None:
        """``[{name, weight}]`` as (name, weight) pairs; None when absent or empty (defaults)."""
        if specs is None or (isinstance(specs, list | tuple) and not specs):
            return None
        if not isinstance(specs, list | tuple):
            raise self.fail(path, f"expected a list, got {specs!r}")
        parsed: list[tuple[str, int]] = []
        seen: set[str] = set()
        for i, spec in enumerate(specs):
            where = f"{path}[{i}]"
            spec = self.mapping(spec, where, _RESOURCE_KEYS)
            name = spec.get("name")
            if not isinstance(name, str) or not name:
                raise self.fail(f"{where}.name", f"expected a non-empty string, got {name!r}")
            if allowed is not None and name not in allowed:
                raise self.fail(
                    f"{where}.name",
                    f"unsupported resource {name!r} (supported: {', '.join(allowed)})",
                )
            if unique and name in seen:
                raise self.fail(f"{where}.name", f"duplicate resource {name!r}")
            seen.add(name)
            weight = spec.get("weight")
            if weight is None:
                weight = 0
            if isinstance(weight, bool) or not isinstance(weight, int):
                raise self.fail(f"{where}.weight", f"expected an integer, got {weight!r}")
            if weight == 0:
                weight = 1  # v1 defaulting
            if not 0 < weight <= MAX_RESOURCE_WEIGHT:
                raise self.fail(
                    f"{where}.weight",
                    f"resource weight of {name} not in valid range "
                    f"(0, {MAX_RESOURCE_WEIGHT}], got {weight}",
                )
            parsed.append((name, weight))
        return tuple(parsed)
