"""DeviceShare args: defaults, the scoring strategy and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.framework.interfaces import PluginArgsError
from scheduler.plugins.deviceshare.args import (
    DEFAULT_RESOURCES,
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    DeviceShareArgs,
    parse_args,
)

RATIO = "koordinator.sh/gpu-memory-ratio"
MEMORY = "koordinator.sh/gpu-memory"
CORE = "koordinator.sh/gpu-core"

VALID: list[Any] = [
    pytest.param({}, DeviceShareArgs(LEAST_ALLOCATED, DEFAULT_RESOURCES), id="empty-defaults"),
    pytest.param({"scoringStrategy": None}, DeviceShareArgs(), id="null-strategy"),
    pytest.param(
        {"scoringStrategy": {"type": "MostAllocated"}},
        DeviceShareArgs(MOST_ALLOCATED, DEFAULT_RESOURCES),
        id="most-default-resources",
    ),
    pytest.param(
        {"scoringStrategy": {"type": "LeastAllocated", "resources": []}},
        DeviceShareArgs(LEAST_ALLOCATED, DEFAULT_RESOURCES),
        id="empty-resources-defaults",
    ),
    pytest.param(
        {"scoringStrategy": {"resources": [{"name": CORE, "weight": 3}, {"name": RATIO}]}},
        DeviceShareArgs(LEAST_ALLOCATED, ((CORE, 3), (RATIO, 1))),
        id="type-defaults-weight-defaults",
    ),
    pytest.param(
        {"scoringStrategy": {"type": "MostAllocated",
                             "resources": [{"name": MEMORY, "weight": 0}]}},
        DeviceShareArgs(MOST_ALLOCATED, ((MEMORY, 1),)),
        id="weight-zero-is-one",
    ),
    pytest.param(
        {"scoringStrategy": {"resources": [{"name": "koordinator.sh/rdma", "weight": 100}]}},
        DeviceShareArgs(LEAST_ALLOCATED, (("koordinator.sh/rdma", 100),)),
        id="max-weight",
    ),
]


@pytest.mark.parametrize(("args", "want"), VALID)
def test_parse_args_valid(args: dict[str, Any], want: DeviceShareArgs) -> None:
    assert parse_args(args) == want


INVALID: list[Any] = [
    pytest.param({"foo": 1}, "<args>: unknown field(s) foo", id="unknown-top"),
    pytest.param({"scoringStrategy": "x"}, "scoringStrategy: expected a mapping",
                 id="strategy-not-mapping"),
    pytest.param({"scoringStrategy": {"kind": 1}}, "scoringStrategy: unknown field(s) kind",
                 id="strategy-unknown-field"),
    pytest.param({"scoringStrategy": {"type": "Balanced"}},
                 "scoringStrategy.type: unsupported value 'Balanced'", id="bad-type"),
    pytest.param({"scoringStrategy": {"resources": {"name": RATIO}}},
                 "scoringStrategy.resources: expected a list", id="resources-not-list"),
    pytest.param({"scoringStrategy": {"resources": [{"weight": 1}]}},
                 "scoringStrategy.resources[0].name: expected a non-empty string",
                 id="missing-name"),
    pytest.param({"scoringStrategy": {"resources": [{"name": "cpu"}]}},
                 "scoringStrategy.resources[0].name: unsupported resource 'cpu'",
                 id="unsupported-name"),
    pytest.param({"scoringStrategy": {"resources": [{"name": RATIO, "weight": "2"}]}},
                 "scoringStrategy.resources[0].weight: expected an integer", id="weight-str"),
    pytest.param({"scoringStrategy": {"resources": [{"name": RATIO, "weight": True}]}},
                 "scoringStrategy.resources[0].weight: expected an integer", id="weight-bool"),
    pytest.param({"scoringStrategy": {"resources": [{"name": RATIO, "weight": 101}]}},
                 "scoringStrategy.resources[0].weight: resource weight of "
                 f"{RATIO} not in valid range (0, 100], got 101", id="weight-too-big"),
    pytest.param({"scoringStrategy": {"resources": [{"name": RATIO, "weight": -1}]}},
                 "scoringStrategy.resources[0].weight: resource weight", id="weight-negative"),
    pytest.param({"scoringStrategy": {"resources": [{"name": RATIO}, {"name": RATIO}]}},
                 f"scoringStrategy.resources[1].name: duplicate resource '{RATIO}'",
                 id="duplicate"),
    pytest.param({"scoringStrategy": {"resources": [{"name": RATIO, "wieght": 1}]}},
                 "scoringStrategy.resources[0]: unknown field(s) wieght", id="typo-field"),
]


@pytest.mark.parametrize(("args", "message"), INVALID)
def test_parse_args_invalid(args: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginArgsError) as exc:
        parse_args(args)
    assert str(exc.value).startswith(f"DeviceShare args: {message}")
