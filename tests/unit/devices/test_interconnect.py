"""Interconnect-aware choice of whole GPUs without a partition table
(scheduler.devices.interconnect, directly and through ``allocate``)."""

from __future__ import annotations

import pytest

from apis.device import Device
from apis.topology import GPUTopology
from scheduler.devices.allocator import allocate
from scheduler.devices.interconnect import (
    EXHAUSTIVE_SETS,
    choose_connected,
    pair_score,
    set_connectivity,
    set_score,
)
from scheduler.devices.request import parse_request
from scheduler.devices.scoring import Scorer
from scheduler.devices.topology import CardView
from scheduler.framework.status import Status
from tests.unit.devices.helpers import (
    GI,
    bound,
    gpu_alloc,
    gpu_pod,
    ledger_of,
    nvlink,
    nvswitch_topology,
    pairs_topology,
    pcie_link,
    topology_node,
)


def cards_of(
    node: Device, used: tuple[int, ...] | list[int] = ()
) -> tuple[list[CardView], list[CardView]]:
    """(free cards, all cards) of ``node`` with whole cards ``used``."""
    pods = [
        bound(gpu_pod(f"e{m}", {"nvidia.com/gpu": 1}), node.name, gpu_alloc(m, 100, 80 * GI, 100))
        for m in used
    ]
    view = ledger_of([node], pods).node_view(node.name, ("gpu",))
    all_cards = list(view.cards["gpu"])
    return [c for c in all_cards if not c.in_use], all_cards


def run(node: Device, used: list[int], count: int) -> list[int]:
    pods = [
        bound(gpu_pod(f"e{m}", {"nvidia.com/gpu": 1}), node.name, gpu_alloc(m, 100, 80 * GI, 100))
        for m in used
    ]
    ledger = ledger_of([node], pods)
    request = parse_request(gpu_pod("p", {"nvidia.com/gpu": count}).build())
    assert request is not None
    got = allocate(ledger.node_view(node.name, request.device_types), request, Scorer())
    assert not isinstance(got, Status), got
    return [u.minor for u in got]


# Cards 0,1 and 2,3 under one PCIe switch each, one NUMA node; NVLink only between 1 and 2
# (a bridge across switches): PCIe/NUMA alone would pick 0,1.
BRIDGED = GPUTopology(
    (
        pcie_link(0, 1, "Single"), pcie_link(2, 3, "Single"), pcie_link(0, 2, "Node"),
        pcie_link(0, 3, "Node"), pcie_link(1, 3, "Node"), nvlink(1, 2, 4, 100),
    )
)
FOUR = [(0, "A"), (0, "A"), (0, "B"), (0, "B")]


@pytest.mark.parametrize(
    ("node", "used", "count", "want"),
    [
        pytest.param(topology_node("n", 4, BRIDGED, layout=FOUR), [], 2, [1, 2],
                     id="nvlink-pair-over-pcie-switch"),
        pytest.param(topology_node("n", 4, None, layout=FOUR), [], 2, [0, 1],
                     id="no-interconnect-pcie-choice"),
        pytest.param(topology_node("n", 8, pairs_topology(8)), [0, 2], 2, [4, 5],
                     id="a100-pairs-whole-pair-over-two-halves"),
        pytest.param(topology_node("n", 8, pairs_topology(8)), [0], 4, [4, 5, 6, 7],
                     id="a100-pairs-two-whole-pairs-one-numa-first"),
        pytest.param(topology_node("n", 8, pairs_topology(8)), [0, 3, 4, 7], 2, [1, 2],
                     id="a100-pairs-scattered-same-numa"),
        pytest.param(topology_node("n", 8, nvswitch_topology(8)), [0], 2, [2, 3],
                     id="nvswitch-then-pcie-locality"),
        pytest.param(topology_node("n", 8, nvswitch_topology(8)), [0], 3, [1, 2, 3],
                     id="nvswitch-three-packs-next-to-used"),
    ],
)
def test_choice_through_allocate(node: Device, used: list[int], count: int, want: list[int]
                                 ) -> None:
    assert run(node, used, count) == want


def test_pair_score_falls_back_to_pcie_and_numa() -> None:
    node = topology_node("n", 4, GPUTopology((nvlink(0, 1, 18, 450),)),
                         layout=[(0, "A"), (0, "A"), (0, "B"), (1, "C")])
    _, cards = cards_of(node)
    topology = GPUTopology((nvlink(0, 1, 18, 450),))
    assert pair_score(topology, cards[0], cards[1]) == 100  # NVLink, 18 links
    assert pair_score(topology, cards[1], cards[0]) == 100
    assert pair_score(topology, cards[0], cards[2]) == 20  # same NUMA node
    assert pair_score(topology, cards[2], cards[3]) == 10  # across NUMA nodes
    assert set_score(topology, cards[:1]) == 100
    assert set_connectivity(topology, cards[:3]).average == (100 + 20 + 20) // 3
    assert set_score(topology, cards[:3]) == 20


def test_greedy_search_on_large_nodes() -> None:
    # 16 cards in NVLink pairs: C(16, 8) sets is above the exhaustive limit.
    assert EXHAUSTIVE_SETS < 12870
    node = topology_node("n", 16, pairs_topology(16))
    free, all_cards = cards_of(node, [0, 3])
    chosen = choose_connected(free, all_cards, 8, pairs_topology(16))
    assert chosen is not None
    minors = [c.minor for c in chosen]
    assert len(minors) == 8 and not {0, 3} & set(minors)
    # Whole pairs only: every chosen card's NVLink peer is chosen too.
    assert all(m ^ 1 in minors for m in minors)


def test_too_few_candidates() -> None:
    free, all_cards = cards_of(topology_node("n", 2, pairs_topology(2)))
    assert choose_connected(free, all_cards, 3, pairs_topology(2)) is None
    assert [c.minor for c in choose_connected(free, all_cards, 2, pairs_topology(2)) or []] == [
        0, 1
    ]
