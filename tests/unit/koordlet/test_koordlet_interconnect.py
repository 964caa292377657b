"""koordlet.devices.interconnect: per-card NVLink facts -> pairs (the rules of the module)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.topology import GPULink
from koordlet.devices.interconnect import CardLinks, build_topology


def _one(cards: list[CardLinks], ancestors: dict[tuple[int, int], str] | None = None) -> GPULink:
    t = build_topology((0, 1), {c.minor: c for c in cards}, ancestors or {})
    link = t.link(0, 1)
    assert link is not None
    return link


@pytest.mark.parametrize(
    ("cards", "expected"),
    [
        (
            [CardLinks(0, {1: 4}, version=2), CardLinks(1, {0: 4}, version=2)],
            ("NVLink", 4, False, "100G"),
        ),
        (  # one side could not read its ports: the other side's count stands
            [CardLinks(0, {1: 4}, version=2), CardLinks(1)],
            ("NVLink", 4, False, "100G"),
        ),
        (  # switch fabric: the smaller of the two cards' switch-link totals
            [
                CardLinks(0, switches={"a": 6, "b": 6}, version=3),
                CardLinks(1, switches={"b": 2, "c": 2}, version=3),
            ],
            ("NVLink", 4, True, "100G"),
        ),
        (  # direct and switched links add up
            [
                CardLinks(0, {1: 2}, {"a": 4}, version=4),
                CardLinks(1, {0: 2}, {"a": 4}, version=4),
            ],
            ("NVLink", 6, True, "150G"),
        ),
        (  # mixed versions: the slower per-link rate
            [CardLinks(0, {1: 2}, version=5), CardLinks(1, {0: 2}, version=1)],
            ("NVLink", 2, False, "40G"),
        ),
        (  # one version known
            [CardLinks(0, {1: 2}, version=5), CardLinks(1, {0: 2})],
            ("NVLink", 2, False, "100G"),
        ),
        (  # no version known, or a version this agent has no rate for
            [CardLinks(0, {1: 2}), CardLinks(1, {0: 2}, version=9)],
            ("NVLink", 2, False, None),
        ),
    ],
    ids=[
        "direct",
        "one-sided",
        "switch",
        "direct-and-switch",
        "mixed-versions",
        "one-version",
        "no-rate",
    ],
)
def test_nvlink_pairs(cards: list[CardLinks], expected: tuple[str, int, bool, str | None]) -> None:
    link = _one(cards, {(0, 1): "System"})
    bandwidth = None if link.bandwidth is None else link.bandwidth.canonical()
    assert (link.link_type, link.nvlinks, link.nvswitch, bandwidth) == expected
    assert link.common_ancestor == "System"


def test_pairs_without_nvlink() -> None:
    t = build_topology(
        (2, 0, 1, 1),
        {0: CardLinks(0, switches={"a": 6}), 2: CardLinks(2, switches={"b": 6})},
        {(0, 1): "Single", (1, 2): "Node"},
    )
    assert [(link.minors, link.link_type, link.common_ancestor) for link in t.links] == [
        ((0, 1), "PCIe", "Single"),
        ((1, 2), "PCIe", "Node"),
    ]  # (0, 2): different switches and no level known -> unknown, left out
    assert build_topology((), {}, {}) == build_topology((3,), {}, {})
    assert not build_topology((3,), {}, {})


_counts = st.dictionaries(st.integers(0, 5), st.integers(1, 18), max_size=4)
_switches = st.dictionaries(st.sampled_from(["s0", "s1", "s2"]), st.integers(1, 6), max_size=3)


@st.composite
def _cards(draw: st.DrawFn) -> dict[int, CardLinks]:
    out = {}
    for m in draw(st.lists(st.integers(0, 5), unique=True, max_size=6)):
        peers = {p: n for p, n in draw(_counts).items() if p != m}
        version = draw(st.none() | st.integers(1, 6))
        out[m] = CardLinks(m, peers, draw(_switches), version)
    return out


@given(_cards(), st.permutations(list(range(6))))
def test_pairs_do_not_depend_on_order_or_on_which_side_reported(
    cards: dict[int, CardLinks], order: list[int]
) -> None:
    t = build_topology(order, cards, {})
    assert build_topology(sorted(order), dict(reversed(cards.items())), {}) == t
    for link in t.links:
        a, b = link.minors
        ca, cb = cards.get(a), cards.get(b)
        direct = max(ca.peers.get(b, 0) if ca else 0, cb.peers.get(a, 0) if cb else 0)
        assert link.nvlinks >= direct > 0 or link.nvswitch
        assert link.nvswitch == bool(ca and cb and set(ca.switches) & set(cb.switches))
    # A card that lost its own reports keeps the links its peers saw.
    for m, card in cards.items():
        blind = {**cards, m: CardLinks(m, {}, card.switches, card.version)}
        for p, n in card.peers.items():
            if p in cards and cards[p].peers.get(m, 0) >= n:
                assert build_topology(order, blind, {}).link(m, p) == t.link(m, p)
