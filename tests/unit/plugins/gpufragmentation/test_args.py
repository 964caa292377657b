"""GPUFragmentation args: defaults, every field, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.framework.interfaces import PluginArgsError
from scheduler.plugins.gpufragmentation.args import (
    GPUFragmentationArgs,
    parse_args,
    workload_args,
)
from scheduler.plugins.gpufragmentation.measure import PodShape


def test_defaults() -> None:
    args = parse_args({})
    assert args == GPUFragmentationArgs()
    assert args.strategy == "FragmentationGradient" and args.fail_fast
    assert args.workload.window == 0 and args.workload.popularity == 0.95


def test_every_field() -> None:
    args = parse_args(
        {
            "strategy": "BestFit",
            "randomSeed": 7,
            "gradient": {"quantization": "Sigmoid", "resolution": 50, "strandedWeight": 0.5,
                         "strandedReach": True, "pinnedWeight": 2},
            "tieBreak": ["SmallestNode", "FirstFit"],
            "failFast": False,
            "targetWorkload": {
                "window": 500,
                "seedWeight": 20,
                "refreshEvery": 10,
                "popularity": 1,
                "shapes": [
                    {"cpuMilli": 4000, "gpuMilli": 500, "gpuCount": 1, "weight": 3},
                    {"cpuMilli": 8000, "gpuCount": 2, "models": ["V100M32", "A10"]},
                    {"cpuMilli": 16000},
                ],
            },
        }
    )
    assert (args.strategy, args.random_seed, args.quantization) == ("BestFit", 7, "Sigmoid")
    assert (args.resolution, args.stranded_weight, args.stranded_reach) == (50, 0.5, True)
    assert args.pinned_weight == 2
    assert args.tie_break == ("SmallestNode", "FirstFit") and not args.fail_fast
    wl = args.workload
    assert (wl.window, wl.seed_weight, wl.refresh_every, wl.popularity) == (500, 20, 10, 1)
    assert wl.shapes == (
        (PodShape(4000, 500, 1), 3.0),
        (PodShape(8000, 1000, 2, ("A10", "V100M32")), 1.0),
        (PodShape(16000), 1.0),
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"nope": 1}, "<args>: unknown field(s) nope", id="unknown"),
        pytest.param({"strategy": "Best"}, "strategy: unsupported value 'Best'", id="strategy"),
        pytest.param(
            {"gradient": {"resolution": 0.5}}, "gradient.resolution: must be >= 1", id="res"
        ),
        pytest.param({"gradient": {"strandedWeight": -1}}, "strandedWeight: must be >= 0", id="w"),
        pytest.param({"gradient": {"quantization": "Log"}}, "gradient.quantization", id="q"),
        pytest.param({"tieBreak": ["FirstFit", "FirstFit"]}, "listed twice", id="tie-dup"),
        pytest.param({"tieBreak": ["Oldest"]}, "tieBreak[0]: unsupported", id="tie-unknown"),
        pytest.param({"failFast": "yes"}, "failFast: expected true or false", id="bool"),
        pytest.param({"randomSeed": True}, "randomSeed: expected an integer", id="seed-bool"),
        pytest.param(
            {"targetWorkload": {"shapes": [{"cpuMilli": 1, "gpuMilli": 500, "gpuCount": 2}]}},
            "targetWorkload.shapes[0].gpuMilli: a fractional share is on one card",
            id="frac-two-cards",
        ),
        pytest.param(
            {"targetWorkload": {"shapes": [{"gpuMilli": 1500, "gpuCount": 1}]}},
            "shapes[0].gpuMilli: must be in 1..1000",
            id="milli-range",
        ),
        pytest.param(
            {"targetWorkload": {"shapes": [{"gpuMilli": 500}]}},
            "shapes[0].gpuMilli: needs gpuCount",
            id="milli-without-count",
        ),
        pytest.param(
            {"targetWorkload": {"shapes": [{"weight": 0}]}},
            "shapes[0].weight: must be > 0",
            id="w0",
        ),
        pytest.param(
            {"targetWorkload": {"popularity": 0}}, "targetWorkload.popularity", id="popularity"
        ),
        pytest.param(
            {"targetWorkload": {"refreshEvery": 0}}, "refreshEvery: must be >= 1", id="refresh"
        ),
        pytest.param(
            {"targetWorkload": {"shapes": [{"models": "A10"}]}}, "shapes[0].models", id="models"
        ),
    ],
)
def test_errors_name_the_field(args: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginArgsError) as err:
        parse_args(args)
    assert str(err.value).startswith("GPUFragmentation args: ")
    assert message in str(err.value)


def test_workload_args_round_trip() -> None:
    shapes = {PodShape(4000, 500, 1): 3.0, PodShape(8000, 1000, 2, ("A10",)): 1.0, PodShape(1): 2.0}
    parsed = parse_args({"targetWorkload": workload_args(shapes, window=0)})
    assert dict(parsed.workload.shapes) == shapes
