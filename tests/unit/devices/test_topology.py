"""Topology-aware choice: one PCIe switch, then one NUMA node, then packing; scopes."""

from __future__ import annotations

from typing import Any

import pytest

from apis.device import DeviceTopology
from scheduler.devices.topology import CardMeta, CardView, choose_scoped, choose_whole

# minor -> (numa, pcie): two NUMA nodes, two switches each, two cards per switch.
EIGHT = [(0, "A"), (0, "A"), (0, "B"), (0, "B"), (1, "C"), (1, "C"), (1, "D"), (1, "D")]
# One NUMA node, two switches of four cards.
WIDE = [(0, "E")] * 4 + [(0, "F")] * 4


def cards(layout: list[tuple[int, str]] | None, used: frozenset[int] | set[int] = frozenset(),
          n: int = 8) -> list[CardView]:
    out = []
    for m in range(n if layout is None else len(layout)):
        topo = None
        if layout is not None:
            numa, pcie = layout[m]
            topo = DeviceTopology(socket_id=numa, node_id=numa, pcie_id=pcie)
        meta = CardMeta(m, f"GPU-{m}", True, (100, 100, 100), {}, topo)
        u = (50, 50, 50) if m in used else (0, 0, 0)
        out.append(CardView(m, True, True, (100, 100, 100), u,
                            tuple(100 - x for x in u), meta))
    return out


def free_cands(all_cards: list[CardView], exclude: frozenset[int] | set[int] = frozenset()
               ) -> list[CardView]:
    return [c for c in all_cards if not c.in_use and c.minor not in exclude]


def minors(chosen: list[CardView] | None) -> list[int] | None:
    return None if chosen is None else [c.minor for c in chosen]


WHOLE: list[Any] = [
    pytest.param(EIGHT, set(), set(), 2, [0, 1], id="one-switch-lowest-minor"),
    pytest.param(EIGHT, {0}, set(), 2, [2, 3], id="skip-broken-switch"),
    pytest.param(WIDE, {0}, set(), 2, [1, 2], id="pack-next-to-used-cards"),
    pytest.param(WIDE, {4}, set(), 3, [5, 6, 7], id="pack-into-used-switch"),
    pytest.param(EIGHT, set(), set(), 4, [0, 1, 2, 3], id="one-numa-node"),
    pytest.param(EIGHT, {1}, set(), 4, [4, 5, 6, 7], id="other-numa-node"),
    pytest.param(EIGHT, {0}, set(), 3, [1, 2, 3], id="numa-in-use-first"),
    pytest.param(EIGHT, set(), set(), 6, [0, 1, 2, 3, 4, 5], id="fill-numa-then-switch"),
    pytest.param(EIGHT, {5}, set(), 6, [4, 6, 7, 0, 1, 2], id="fill-used-numa-first"),
    pytest.param(EIGHT, set(), {1, 3}, 2, [4, 5], id="unavailable-cards"),
]


@pytest.mark.parametrize(("layout", "used", "exclude", "count", "want"), WHOLE)
def test_choose_whole(layout: list[tuple[int, str]], used: set[int], exclude: set[int],
                      count: int, want: list[int]) -> None:
    all_cards = cards(layout, used)
    assert minors(choose_whole(free_cands(all_cards, exclude), all_cards, count)) == want


def test_choose_whole_needs_topology() -> None:
    all_cards = cards(None)
    assert choose_whole(all_cards, all_cards, 2) is None


def test_choose_whole_too_few() -> None:
    all_cards = cards(EIGHT)
    assert choose_whole(all_cards[:1], all_cards, 2) is None


def _order(c: CardView) -> tuple[int, int]:
    return (-c.used[0], c.minor)


SCOPED: list[Any] = [
    pytest.param(EIGHT, set(), 2, "PCIe", True, [0, 1], id="pcie-whole"),
    pytest.param(EIGHT, {0, 2, 4, 6}, 2, "PCIe", True, None, id="pcie-impossible"),
    pytest.param(EIGHT, {0, 2}, 2, "NUMANode", True, [4, 5], id="numa-prefers-one-switch"),
    pytest.param(EIGHT, {0, 2, 4, 6}, 2, "NUMANode", True, [1, 3], id="numa-across-switches"),
    pytest.param(EIGHT, {0, 1, 2, 4}, 4, "NUMANode", True, None, id="numa-impossible"),
    pytest.param(EIGHT, set(), 2, "Device", True, None, id="device-scope-two-cards"),
    pytest.param(EIGHT, {3}, 1, "Device", True, [0], id="device-scope-one-card"),
    pytest.param(EIGHT, set(), 5, "Node", True, [0, 1, 2, 3, 4], id="node-scope"),
    pytest.param(None, set(), 2, "PCIe", True, None, id="no-topology"),
    pytest.param(None, set(), 2, "", True, [0, 1], id="no-scope-no-topology"),
]


@pytest.mark.parametrize(("layout", "exclude", "count", "scope", "whole", "want"), SCOPED)
def test_choose_scoped(layout: list[tuple[int, str]] | None, exclude: set[int], count: int,
                       scope: str, whole: bool, want: list[int] | None) -> None:
    all_cards = cards(layout)
    cands = free_cands(all_cards, exclude)
    assert minors(choose_scoped(cands, all_cards, count, scope, whole, _order)) == want


def test_choose_scoped_shared_uses_order_inside_group() -> None:
    all_cards = cards(EIGHT, used={5})
    # Shared cards: every card is a candidate; inside the chosen switch the order decides.
    chosen = choose_scoped(all_cards, all_cards, 2, "PCIe", False, _order)
    assert minors(chosen) == [5, 4]
