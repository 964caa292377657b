"""GPUFragmentation plugin args: scoring strategy, card choice and target workload.

Role: validate the ``pluginConfig`` args into a frozen ``GPUFragmentationArgs``::

    args:
      strategy: FragmentationGradient   # or the FGD paper's baselines: BestFit, Random,
                                        # DotProduct, GPUClustering, GPUPacking
      randomSeed: 0                     # Random's card choice
      gradient:                         # how FragmentationGradient compares nodes
        quantization: Linear            # steps of `resolution` milli-GPU; Sigmoid: as published
        resolution: 100                 #   (FGD's int(100 * sigmoid(-gradient / 1000)))
        strandedWeight: 1               # the stranded-GPU look-ahead (0: none)
        strandedReach: false            # weight it by the share of GPU tasks that accept
                                        #   the node's model
        pinnedWeight: 0                 # steer GPUs away from the models whose free GPUs
                                        #   the model-pinned demand needs most (0: off)
      tieBreak: [SmallestNode, FirstFit]  # then, in order: fewest GPU cards, the least GPU
                                        # left (Packing), the earliest node (FirstFit)
      targetWorkload:
        shapes:                         # the fixed distribution, or the learned one's prior
        - {cpuMilli: 4000, gpuMilli: 500, gpuCount: 1, weight: 3}
        - {cpuMilli: 8000, gpuMilli: 1000, gpuCount: 2, weight: 1, models: [V100M32]}
        - {cpuMilli: 16000, weight: 1}  # CPU-only
        window: 1000                    # learn from the last N pods seen (0: fixed)
        seedWeight: 100                 # the shapes above count as this many pods
        refreshEvery: 50                # rebuild the distribution every N new pods
        popularity: 0.95                # keep the most frequent shapes making up 95%

Invariants: unknown fields and bad values raise ``PluginArgsError`` naming the field path
(``GPUFragmentation args: targetWorkload.shapes[1].gpuMilli: ...``); a parsed object always
has a known strategy and quantization, a resolution of at least 1 milli-GPU, distinct known
tie-break criteria, non-negative integer amounts, ``gpuMilli`` in 1..1000 exactly when
``gpuCount > 0``, a fractional share only on one card, positive weights, ``popularity`` in
(0, 1] and ``refreshEvery >= 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.framework.plugin_args import ArgsReader
from scheduler.plugins.gpufragmentation.measure import GPU_MILLI, PodShape
from scheduler.plugins.gpufragmentation.workload import WorkloadConfig

__all__ = [
    "BEST_FIT",
    "CLUSTERING",
    "DOT_PRODUCT",
    "FRAGMENTATION_GRADIENT",
    "LINEAR",
    "PACKING",
    "RANDOM",
    "SIGMOID",
    "STRATEGIES",
    "TIE_BREAKS",
    "TIE_FIRST",
    "TIE_PACKING",
    "TIE_SMALLEST",
    "GPUFragmentationArgs",
    "parse_args",
]

FRAGMENTATION_GRADIENT: Final = "FragmentationGradient"
BEST_FIT: Final = "BestFit"
RANDOM: Final = "Random"
DOT_PRODUCT: Final = "DotProduct"
CLUSTERING: Final = "GPUClustering"
PACKING: Final = "GPUPacking"
STRATEGIES: Final = (FRAGMENTATION_GRADIENT, BEST_FIT, RANDOM, DOT_PRODUCT, CLUSTERING, PACKING)
TIE_SMALLEST: Final = "SmallestNode"
TIE_PACKING: Final = "Packing"
TIE_FIRST: Final = "FirstFit"
TIE_BREAKS: Final = (TIE_SMALLEST, TIE_PACKING, TIE_FIRST)
LINEAR: Final = "Linear"
SIGMOID: Final = "Sigmoid"
QUANTIZATIONS: Final = (LINEAR, SIGMOID)
MIN_RESOLUTION: Final = 1.0

_ARG_KEYS: Final = frozenset(
    {"strategy", "randomSeed", "gradient", "tieBreak", "failFast", "targetWorkload"}
)
_GRADIENT_KEYS: Final = frozenset(
    {"quantization", "resolution", "strandedWeight", "strandedReach", "pinnedWeight"}
)
_WORKLOAD_KEYS: Final = frozenset({"shapes", "window", "seedWeight", "refreshEvery", "popularity"})
_SHAPE_KEYS: Final = frozenset({"cpuMilli", "gpuMilli", "gpuCount", "weight", "models"})


@dataclass(frozen=True, slots=True)
class GPUFragmentationArgs:
    strategy: str = FRAGMENTATION_GRADIENT
    random_seed: int = 0
    quantization: str = LINEAR
    resolution: float = MIN_RESOLUTION
    """Linear quantization step in milli-GPU (at least 1: gradients are compared in whole
    milli-GPU at the finest)."""
    stranded_weight: float = 0.0
    """Weight of the stranded-GPU look-ahead term (0: the paper's gradient alone)."""
    pinned_weight: float = 0.0
    """Weight of the pinned-demand term: ``pinnedWeight x taken x pressure`` where a model's
    pressure is the share of GPU demand pinned to models that accept it over the model's
    share of the cluster's free GPU (``Workload.pinned_of``; 0 without model constraints)."""
    stranded_reach: bool = False
    """Scale each node's look-ahead term by the share of the workload's GPU tasks that accept
    its model (``Workload.reach_of``; 1 everywhere without model constraints)."""
    tie_break: tuple[str, ...] = ()
    fail_fast: bool = True
    """PreFilter turns a pod away at once when no node has its cpu, memory and cards free."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)


_ARGS = ArgsReader("GPUFragmentation")
_fail = _ARGS.fail
_mapping = _ARGS.mapping


def _int(value: Any, path: str, default: int, minimum: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, f"expected an integer, got {value!r}")
    if value < minimum:
        raise _fail(path, f"must be >= {minimum}, got {value}")
    return value


def _number(value: Any, path: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, f"expected a number, got {value!r}")
    return float(value)


def _choice(value: Any, path: str, default: str, allowed: tuple[str, ...]) -> str:
    if value is None or value == "":
        return default
    if value not in allowed:
        quoted = ", ".join(f'"{a}"' for a in allowed)
        raise _fail(path, f"unsupported value {value!r}: supported values: {quoted}")
    return str(value)


def _shape(spec: Any, path: str) -> tuple[PodShape, float]:
    spec = _mapping(spec, path, _SHAPE_KEYS)
    cpu = _int(spec.get("cpuMilli"), f"{path}.cpuMilli", 0)
    count = _int(spec.get("gpuCount"), f"{path}.gpuCount", 0)
    milli = _int(spec.get("gpuMilli"), f"{path}.gpuMilli", GPU_MILLI if count else 0)
    if count and not 0 < milli <= GPU_MILLI:
        raise _fail(f"{path}.gpuMilli", f"must be in 1..{GPU_MILLI} with gpuCount, got {milli}")
    if not count and milli:
        raise _fail(f"{path}.gpuMilli", "needs gpuCount >= 1")
    if count > 1 and milli < GPU_MILLI:
        raise _fail(f"{path}.gpuMilli", "a fractional share is on one card (gpuCount 1)")
    weight = _number(spec.get("weight"), f"{path}.weight", 1.0)
    if weight <= 0:
        raise _fail(f"{path}.weight", f"must be > 0, got {weight}")
    raw_models = spec.get("models") or []
    if not isinstance(raw_models, list | tuple) or not all(
        isinstance(m, str) and m for m in raw_models
    ):
        raise _fail(f"{path}.models", f"expected a list of model names, got {raw_models!r}")
    return PodShape(cpu, milli, count, tuple(sorted(set(raw_models)))), weight


def parse_workload(raw: Any, path: str = "targetWorkload") -> WorkloadConfig:
    if raw is None:
        return WorkloadConfig()
    raw = _mapping(raw, path, _WORKLOAD_KEYS)
    specs = raw.get("shapes") or []
    if not isinstance(specs, list | tuple):
        raise _fail(f"{path}.shapes", f"expected a list, got {specs!r}")
    shapes = tuple(_shape(s, f"{path}.shapes[{i}]") for i, s in enumerate(specs))
    popularity = _number(raw.get("popularity"), f"{path}.popularity", 0.95)
    if not 0 < popularity <= 1:
        raise _fail(f"{path}.popularity", f"must be in (0, 1], got {popularity}")
    seed_weight = _number(raw.get("seedWeight"), f"{path}.seedWeight", 100.0)
    if seed_weight < 0:
        raise _fail(f"{path}.seedWeight", f"must be >= 0, got {seed_weight}")
    return WorkloadConfig(
        shapes=shapes,
        seed_weight=seed_weight,
        window=_int(raw.get("window"), f"{path}.window", 0),
        refresh_every=_int(raw.get("refreshEvery"), f"{path}.refreshEvery", 50, minimum=1),
        popularity=popularity,
    )


def _bool(raw: Any, path: str, default: bool) -> bool:
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise _fail(path, f"expected true or false, got {raw!r}")
    return raw


def _nonneg(raw: Any, path: str) -> float:
    value = _number(raw, path, 0.0)
    if value < 0:
        raise _fail(path, f"must be >= 0, got {value:g}")
    return value


def _tie_break(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list | tuple):
        raise _fail("tieBreak", f"expected a list of criteria, got {raw!r}")
    out = tuple(_choice(v, f"tieBreak[{i}]", "", TIE_BREAKS) for i, v in enumerate(raw))
    if "" in out:
        raise _fail("tieBreak", "empty criterion")
    if len(set(out)) != len(out):
        raise _fail("tieBreak", f"a criterion is listed twice: {list(out)}")
    return out


def parse_args(args: Mapping[str, Any]) -> GPUFragmentationArgs:
    """Validate GPUFragmentation's ``pluginConfig`` args (an empty mapping gives defaults)."""
    args = _mapping(args, "<args>", _ARG_KEYS)
    gradient = _mapping(args.get("gradient") or {}, "gradient", _GRADIENT_KEYS)
    resolution = _number(gradient.get("resolution"), "gradient.resolution", MIN_RESOLUTION)
    if resolution < MIN_RESOLUTION:
        raise _fail("gradient.resolution", f"must be >= {MIN_RESOLUTION:g}, got {resolution:g}")
    return GPUFragmentationArgs(
        strategy=_choice(args.get("strategy"), "strategy", FRAGMENTATION_GRADIENT, STRATEGIES),
        random_seed=_int(args.get("randomSeed"), "randomSeed", 0),
        quantization=_choice(
            gradient.get("quantization"), "gradient.quantization", LINEAR, QUANTIZATIONS
        ),
        resolution=resolution,
        stranded_weight=_nonneg(gradient.get("strandedWeight"), "gradient.strandedWeight"),
        pinned_weight=_nonneg(gradient.get("pinnedWeight"), "gradient.pinnedWeight"),
        stranded_reach=_bool(gradient.get("strandedReach"), "gradient.strandedReach", False),
        tie_break=_tie_break(args.get("tieBreak")),
        fail_fast=_bool(args.get("failFast"), "failFast", True),
        workload=parse_workload(args.get("targetWorkload")),
    )


def workload_args(shapes: Mapping[PodShape, float], **options: Any) -> dict[str, Any]:
    """The ``targetWorkload`` args for ``shapes`` (what the simulator injects)."""
    specs = []
    for shape, weight in shapes.items():
        spec: dict[str, Any] = {"cpuMilli": shape.cpu_milli, "weight": weight}
        if shape.gpu_count:
            spec["gpuMilli"] = shape.gpu_milli
            spec["gpuCount"] = shape.gpu_count
        if shape.models:
            spec["models"] = list(shape.models)
        specs.append(spec)
    return {"shapes": specs, **options}
