"""Tests for koordlet.reporting.partitions: the gpu-partitions table derived from the discovered
interconnect of the reference boxes (config/examples/fake-gpus-*.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apis.quantity import Quantity
from apis.topology import LINK_PCIE, GPULink, GPUTopology
from koordlet.devices.fake import load_fake_spec
from koordlet.reporting.partitions import derive_partitions, is_nvswitch_box

EXAMPLES = Path(__file__).resolve().parents[3] / "config" / "examples"


def box(name: str) -> tuple[GPUTopology, list[int]]:
    spec = load_fake_spec(EXAMPLES / f"fake-gpus-{name}.yaml")
    return spec.topology(), [g.gpu.minor for g in spec.gpus]


def layout(name: str) -> dict[int, list[tuple[tuple[int, ...], str | None, int]]]:
    topology, minors = box(name)
    table = derive_partitions(topology, minors)
    assert table is not None
    return {
        size: [
            (p.minors, None if p.ring_bandwidth is None else p.ring_bandwidth.canonical(),
             p.allocation_score)
            for p in table.partitions[size]
        ]
        for size in table.sizes()
    }


def test_h100_nvswitch_gets_aligned_blocks() -> None:
    topology, minors = box("h100-nvswitch")
    assert is_nvswitch_box(topology, minors)
    got = layout("h100-nvswitch")
    assert got[1] == [((m,), None, 1) for m in range(8)]
    assert got[2] == [((0, 1), "450G", 1), ((2, 3), "450G", 1), ((4, 5), "450G", 1),
                      ((6, 7), "450G", 1)]
    assert got[4] == [((0, 1, 2, 3), "450G", 1), ((4, 5, 6, 7), "450G", 1)]
    assert got[8] == [(tuple(range(8)), "450G", 1)]
    table = derive_partitions(topology, minors)
    assert table is not None and all(p.link_type == "NVLink" for p in table)


def test_a100_nvlink_pairs_offer_one_and_two_only() -> None:
    topology, minors = box("a100-nvlink-pairs")
    assert not is_nvswitch_box(topology, minors)
    got = layout("a100-nvlink-pairs")
    assert sorted(got) == [1, 2]
    assert got[2] == [((0, 1), "300G", 1), ((2, 3), "300G", 1), ((4, 5), "300G", 1),
                      ((6, 7), "300G", 1)]


def test_v100_cube_mesh_ranks_by_ring_bandwidth() -> None:
    got = layout("v100-cube-mesh")
    # Pairs with two links (50G) score 2, pairs with one link (25G) score 1.
    assert dict((m, (bw, s)) for m, bw, s in got[2]) == {
        (0, 1): ("25G", 1), (0, 2): ("25G", 1), (0, 3): ("50G", 2),
        (1, 2): ("50G", 2), (1, 3): ("25G", 1), (2, 3): ("50G", 2),
    }
    assert got[4] == [((0, 1, 2, 3), "25G", 1)]


def test_pcie_only_gets_no_table() -> None:
    topology, minors = box("t4-pcie")
    assert derive_partitions(topology, minors) is None


G = 10**9


def _nv(a: int, b: int, gbs: int) -> GPULink:
    return GPULink((a, b), "NVLink", 4, bandwidth=Quantity.of(gbs * G))


@pytest.mark.parametrize(
    ("links", "minors", "expected"),
    [
        pytest.param((), [0, 1], None, id="no-links"),
        pytest.param((GPULink((0, 1), LINK_PCIE, common_ancestor="Single"),), [0, 1], None,
                     id="pcie-pair"),
        pytest.param((_nv(0, 1, 100),), [0], None, id="one-card"),
        pytest.param(
            # A ring 0-1-2-3-0 of NVLink, no diagonals: the 4-set is offered (ring bottleneck
            # 100G), the diagonals are not pairs.
            (_nv(0, 1, 100), _nv(1, 2, 200), _nv(2, 3, 100), _nv(0, 3, 200)),
            [0, 1, 2, 3],
            {1: [(0,), (1,), (2,), (3,)], 2: [(0, 1), (0, 3), (1, 2), (2, 3)], 4: [(0, 1, 2, 3)]},
            id="ring-without-diagonals",
        ),
        pytest.param(
            # A chain 0-1-2 (no 0-2): three cards give sizes 1 and 2 only.
            (_nv(0, 1, 100), _nv(1, 2, 100)),
            [0, 1, 2],
            {1: [(0,), (1,), (2,)], 2: [(0, 1), (1, 2)]},
            id="chain",
        ),
    ],
)
def test_rules_on_small_graphs(
    links: tuple[GPULink, ...], minors: list[int], expected: dict[int, list[tuple[int, ...]]] | None
) -> None:
    table = derive_partitions(GPUTopology(links), minors)
    if expected is None:
        assert table is None
        return
    assert table is not None
    assert {s: [p.minors for p in table.partitions[s]] for s in table.sizes()} == expected


def test_deterministic_and_independent_of_minor_order() -> None:
    topology, minors = box("v100-cube-mesh")
    a = derive_partitions(topology, minors)
    b = derive_partitions(topology, list(reversed(minors)))
    assert a is not None and b is not None and a.encode() == b.encode()


def _hybrid_cube_mesh() -> GPUTopology:
    """8 x V100 SXM2 (DGX-1): two fully linked quads 0-3 and 4-7, card i linked to i+4; the
    pairs 0-3, 1-2, 4-7, 5-6 and the four cross links have two links (50G), the rest one."""
    double = {(0, 3), (1, 2), (4, 7), (5, 6), (0, 4), (1, 5), (2, 6), (3, 7)}
    links = []
    for a in range(8):
        for b in range(a + 1, 8):
            if a // 4 == b // 4 or b == a + 4:
                n = 2 if (a, b) in double else 1
                links.append(GPULink((a, b), "NVLink", n, bandwidth=Quantity.of(n * 25 * G)))
    return GPUTopology(tuple(links))


def test_v100_hybrid_cube_mesh_eight_cards() -> None:
    table = derive_partitions(_hybrid_cube_mesh(), range(8))
    assert table is not None and table.sizes() == (1, 2, 4, 8)
    pairs = {p.minors: p.allocation_score for p in table.of_size(2)}
    assert len(pairs) == 16  # 6 + 6 in the quads, 4 across
    assert {m for m, s in pairs.items() if s == 2} == {
        (0, 3), (1, 2), (4, 7), (5, 6), (0, 4), (1, 5), (2, 6), (3, 7)
    }
    fours = [p.minors for p in table.of_size(4)]
    assert (0, 1, 2, 3) in fours and (4, 5, 6, 7) in fours and (0, 1, 4, 5) in fours
    assert (0, 1, 2, 4) not in fours  # card 4 has one NVLink peer in that set: no ring
    best_four = table.of_size(4)[0]
    assert best_four.ring_bandwidth == Quantity.parse("50G")  # e.g. 0-3-7-4-0, all doubles
    assert [p.minors for p in table.of_size(8)] == [tuple(range(8))]


def test_sixteen_cards_use_aligned_blocks() -> None:
    pairs = GPUTopology(tuple(_nv(a, a + 1, 300) for a in range(0, 16, 2)))
    table = derive_partitions(pairs, range(16))
    assert table is not None and table.sizes() == (1, 2)
    assert [p.minors for p in table.of_size(2)] == [(a, a + 1) for a in range(0, 16, 2)]
    mesh = GPUTopology(tuple(_nv(a, b, 100) for a in range(16) for b in range(a + 1, 16)))
    full = derive_partitions(mesh, range(16))
    assert full is not None and full.sizes() == (1, 2, 4, 8, 16)
    assert [p.minors for p in full.of_size(8)] == [tuple(range(8)), tuple(range(8, 16))]
