"""Scoring: SPEC §6 integer formulas for cards and nodes; whole-ledger == per-node scores."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import parse_request
from scheduler.devices.scoring import Scorer
from scheduler.devices.topology import CardView
from scheduler.plugins.deviceshare.args import DeviceShareArgs, parse_args
from tests.unit.devices.helpers import GI, gpu_pod, ledgers

LEAST = Scorer(DeviceShareArgs("LeastAllocated"))
MOST = Scorer(DeviceShareArgs("MostAllocated"))

RESOURCE_SCORES: list[Any] = [
    pytest.param(LEAST, 0, 100, 100, id="least-empty"),
    pytest.param(LEAST, 30, 100, 70, id="least-30"),
    pytest.param(LEAST, 100, 100, 0, id="least-full"),
    pytest.param(LEAST, 101, 100, 0, id="least-over"),
    pytest.param(LEAST, 1, 3, 66, id="least-truncates"),
    pytest.param(MOST, 30, 100, 30, id="most-30"),
    pytest.param(MOST, 150, 100, 100, id="most-over-capped"),
    pytest.param(MOST, 2, 3, 66, id="most-truncates"),
    pytest.param(LEAST, 5, 0, 0, id="zero-total"),
]


@pytest.mark.parametrize(("scorer", "requested", "total", "want"), RESOURCE_SCORES)
def test_resource_score(scorer: Scorer, requested: int, total: int, want: int) -> None:
    assert scorer.resource_score(requested, total) == want


def view(total: tuple[int, ...], used: tuple[int, ...]) -> CardView:
    free = tuple(max(t - u, 0) for t, u in zip(total, used, strict=True))
    return CardView(0, True, True, total, used, free, None)


CARD_SCORES: list[Any] = [
    # default weights: ratio 1, memory 1 (core 0): (ratio score + memory score) // 2
    pytest.param({}, (100, 100, 80 * GI), (0, 0, 0), (50, 50, 40 * GI), 50, id="least-empty"),
    pytest.param({}, (100, 100, 80 * GI), (50, 50, 40 * GI), (50, 50, 40 * GI), 0,
                 id="least-fills"),
    pytest.param({"scoringStrategy": {"type": "MostAllocated"}}, (100, 100, 80 * GI),
                 (25, 25, 20 * GI), (50, 50, 40 * GI), 75, id="most"),
    pytest.param({"scoringStrategy": {"resources": [
        {"name": "koordinator.sh/gpu-core", "weight": 3},
        {"name": "koordinator.sh/gpu-memory-ratio", "weight": 1}]}},
        (100, 100, 80 * GI), (0, 60, 0), (20, 20, 0), 65, id="weighted"),
    pytest.param({}, (100, 100, 0), (0, 40, 0), (10, 10, 0), 50, id="zero-memory-skipped"),
    pytest.param({}, (0, 0, 0), (0, 0, 0), (10, 10, 0), 0, id="unhealthy-zero"),
]


@pytest.mark.parametrize(("args", "total", "used", "amounts", "want"), CARD_SCORES)
def test_card_score(args: dict[str, Any], total: tuple[int, ...], used: tuple[int, ...],
                    amounts: tuple[int, ...], want: int) -> None:
    assert Scorer(parse_args(args)).card_score("gpu", view(total, used), amounts) == want


def test_node_score_sums_cards_and_uses_pod_total() -> None:
    request = parse_request(gpu_pod("p", {"nvidia.com/gpu": 2}).build())
    assert request is not None
    cards = {"gpu": [view((100, 100, 80 * GI), (100, 100, 80 * GI)),
                     view((100, 100, 80 * GI), (0, 0, 0)),
                     view((100, 100, 80 * GI), (0, 0, 0)),
                     view((100, 100, 80 * GI), (0, 0, 0))]}
    # ratio: (400 - (100 + 200)) * 100 // 400 = 25; memory: (320 - 80) * 100 // 320 = 75
    assert LEAST.node_score(cards, request) == (25 + 75) // 2
    # MostAllocated: ratio 75, memory 25
    assert MOST.node_score(cards, request) == 50


def test_node_score_multiple_types() -> None:
    request = parse_request(gpu_pod("p", {"koordinator.sh/gpu-memory-ratio": 50,
                                          "koordinator.sh/rdma": 50}).build())
    assert request is not None
    cards = {"gpu": [view((100, 100, 10), (0, 0, 0))], "rdma": [view((100,), (25,))]}
    # ratio 50, memory 100, rdma 25 -> 175 // 3
    assert LEAST.node_score(cards, request) == 58


# ---------------------------------------------------------------------------------------------
# Property: score_rows (row sums, numpy) == node_score (per card) on random ledgers.

REQUESTS: list[dict[str, Any]] = [
    {"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 3},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory": "4Gi"},
    {"koordinator.sh/rdma": 50, "koordinator.sh/fpga": 100},
    {"nvidia.com/gpu": 1, "koordinator.sh/rdma": 200},
]
STRATEGIES = [
    {},
    {"scoringStrategy": {"type": "MostAllocated"}},
    {"scoringStrategy": {"type": "MostAllocated", "resources": [
        {"name": "koordinator.sh/gpu-core", "weight": 2}, {"name": "koordinator.sh/rdma"}]}},
]
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(), st.sampled_from(REQUESTS), st.sampled_from(STRATEGIES))
def test_score_rows_equals_node_score(ledger: NodeDeviceLedger, requests: dict[str, Any],
                                      args: dict[str, Any]) -> None:
    scorer = Scorer(parse_args(args))
    request = parse_request(gpu_pod("p", requests).build())
    assert request is not None
    rows = scorer.score_rows(ledger, request)
    assert len(rows) == ledger.n_rows + 1 and rows[-1] == 0
    for n in range(ledger.n_rows):
        name = f"n{n}"
        row = ledger.row_of(name)
        assert row is not None
        cards = ledger.node_view(name, request.device_types).cards
        assert rows[row] == scorer.node_score(cards, request), name
