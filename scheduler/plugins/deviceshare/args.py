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

from apis.gpushare import MemoryUnit
from apis.resources import FPGA, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from scheduler.devices.scoring import DEFAULT_RESOURCES
from scheduler.framework.plugin_args import (
    LEAST_ALLOCATED,
    MAX_RESOURCE_WEIGHT,
    MOST_ALLOCATED,
    ArgsReader,
)

__all__ = [
    "DEFAULT_RESOURCES",
    "LEAST_ALLOCATED",
    "MOST_ALLOCATED",
    "SCORABLE_RESOURCES",
    "DeviceShareArgs",
    "parse_args",
]

MAX_WEIGHT: Final = MAX_RESOURCE_WEIGHT

SCORABLE_RESOURCES: Final = (GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA, FPGA)

_ARG_KEYS: Final = frozenset({"scoringStrategy", "gpushareMemoryUnit"})
_STRATEGY_KEYS: Final = frozenset({"type", "resources"})


@dataclass(frozen=True, slots=True)
class DeviceShareArgs:
    """The validated args: the card/node scoring strategy and its weighted resources."""

    strategy: str = LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    gpushare_unit: MemoryUnit = MemoryUnit.GiB
    """One ``aliyun.com/gpu-mem`` (``gpushareMemoryUnit: GiB|MiB``, as gpushare's device
    plugin ``--memory-unit``)."""


_ARGS = ArgsReader("DeviceShare")


def parse_args(args: Mapping[str, Any]) -> DeviceShareArgs:
    """Validate DeviceShare's ``pluginConfig`` args (an empty mapping gives the defaults)."""
    args = _ARGS.mapping(args, "<args>", _ARG_KEYS)
    unit = _unit(args.get("gpushareMemoryUnit"))
    raw = args.get("scoringStrategy")
    if raw is None:
        return DeviceShareArgs(gpushare_unit=unit)
    raw = _ARGS.mapping(raw, "scoringStrategy", _STRATEGY_KEYS)
    kind = _ARGS.strategy_type(raw.get("type"))
    resources = _ARGS.resource_weights(
        raw.get("resources"), allowed=SCORABLE_RESOURCES, unique=True
    )
    return DeviceShareArgs(kind, resources or DEFAULT_RESOURCES, unit)


def _unit(raw: Any) -> MemoryUnit:
    if raw is None:
        return MemoryUnit.GiB
    if raw not in MemoryUnit.__members__:
        raise _ARGS.fail("gpushareMemoryUnit", f"must be GiB or MiB, got {raw!r}")
    return MemoryUnit[raw]
