"""DeviceShare plugin args: ``scoringStrategy {type, resources: [{name, weight}]}`` (SPEC §6).

Role: validate the ``pluginConfig`` args of DeviceShare into a frozen ``DeviceShareArgs``.
Defaults follow Koordinator's v1beta3 defaulting: LeastAllocated with weight 1 on
gpu-memory-ratio, gpu-memory, rdma and fpga.

Invariants: unknown fields and bad values raise ``PluginArgsError`` whose message names the
field path (``DeviceShare args: scoringStrategy.resources[1].weight: ...``); a parsed args
object always has a supported strategy and at least one resource, each named at most once,
with a weight in [1, 100] (0 or absent means 1, as v1 defaulting does). Only resources that a
device card carries can be weighted (gpu-core, gpu-memory, gpu-memory-ratio, rdma, fpga).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from apis.resources import FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from scheduler.framework.interfaces import PluginArgsError

__all__ = [
    "DEFAULT_RESOURCES",
    "LEAST_ALLOCATED",
    "MOST_ALLOCATED",
    "SCORABLE_RESOURCES",
    "DeviceShareArgs",
    "parse_args",
]

LEAST_ALLOCATED: Final = "LeastAllocated"
MOST_ALLOCATED: Final = "MostAllocated"
_STRATEGIES: Final = (LEAST_ALLOCATED, MOST_ALLOCATED)
MAX_WEIGHT: Final = 100

SCORABLE_RESOURCES: Final = (GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA, FPGA)
DEFAULT_RESOURCES: Final[tuple[tuple[str, int], ...]] = (
    (GPU_MEMORY_RATIO, 1),
    (GPU_MEMORY, 1),
    (RDMA, 1),
    (FPGA, 1),
)

_ARG_KEYS: Final = frozenset({"scoringStrategy"})
_STRATEGY_KEYS: Final = frozenset({"type", "resources"})
_RESOURCE_KEYS: Final = frozenset({"name", "weight"})


@dataclass(frozen=True, slots=True)
class DeviceShareArgs:
    """The validated args: the card/node scoring strategy and its weighted resources."""

    strategy: str = LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES


def _fail(path: str, problem: str) -> PluginArgsError:
    return PluginArgsError(f"DeviceShare args: {path}: {problem}")


def _mapping(value: Any, path: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected a mapping, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise _fail(path, f"unknown field(s) {', '.join(unknown)}")
    return value


def _resource(spec: Any, path: str) -> tuple[str, int]:
    spec = _mapping(spec, path, _RESOURCE_KEYS)
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(f"{path}.name", f"expected a non-empty string, got {name!r}")
    if name not in SCORABLE_RESOURCES:
        allowed = ", ".join(SCORABLE_RESOURCES)
        raise _fail(f"{path}.name", f"unsupported resource {name!r} (supported: {allowed})")
    weight = spec.get("weight")
    if weight is None:
        weight = 0
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise _fail(f"{path}.weight", f"expected an integer, got {weight!r}")
    if weight == 0:
        weight = 1
    if not 0 < weight <= MAX_WEIGHT:
        raise _fail(
            f"{path}.weight",
            f"resource weight of {name} not in valid range (0, {MAX_WEIGHT}], got {weight}",
        )
    return name, weight


def parse_args(args: Mapping[str, Any]) -> DeviceShareArgs:
    """Validate DeviceShare's ``pluginConfig`` args (an empty mapping gives the defaults)."""
    args = _mapping(args, "<args>", _ARG_KEYS)
    raw = args.get("scoringStrategy")
    if raw is None:
        return DeviceShareArgs()
    raw = _mapping(raw, "scoringStrategy", _STRATEGY_KEYS)
    kind = raw.get("type")
    if kind is None or kind == "":
        kind = LEAST_ALLOCATED
    if kind not in _STRATEGIES:
        raise _fail(
            "scoringStrategy.type",
            f'unsupported value {kind!r}: supported values: "{LEAST_ALLOCATED}", '
            f'"{MOST_ALLOCATED}"',
        )
    specs = raw.get("resources")
    if specs is None or (isinstance(specs, list | tuple) and not specs):
        return DeviceShareArgs(str(kind), DEFAULT_RESOURCES)
    if not isinstance(specs, list | tuple):
        raise _fail("scoringStrategy.resources", f"expected a list, got {specs!r}")
    parsed: list[tuple[str, int]] = []
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        path = f"scoringStrategy.resources[{i}]"
        name, weight = _resource(spec, path)
        if name in seen:
            raise _fail(f"{path}.name", f"duplicate resource {name!r}")
        seen.add(name)
        parsed.append((name, weight))
    return DeviceShareArgs(str(kind), tuple(parsed))
