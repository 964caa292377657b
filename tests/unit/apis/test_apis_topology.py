"""Tests for apis.topology: the gpu-topology annotation codec, lookups and connectivity scores."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.device import ANNOTATION_GPU_TOPOLOGY, Device
from apis.quantity import DECIMAL_SI, Quantity
from apis.topology import (
    ANCESTOR_LEVELS,
    LINK_NVLINK,
    LINK_PCIE,
    Connectivity,
    GPULink,
    GPUTopology,
    TopologyDecodeError,
    connectivity,
    connectivity_score,
    nvlink_bandwidth,
    pair_rank,
    ring_bandwidth,
)

G = 10**9


def nv(a: int, b: int, n: int, *, switch: bool = False, ancestor: str = "System") -> GPULink:
    return GPULink((a, b), LINK_NVLINK, n, switch, Quantity.of(n * 25 * G, DECIMAL_SI), ancestor)


def pcie(a: int, b: int, ancestor: str) -> GPULink:
    return GPULink((a, b), LINK_PCIE, common_ancestor=ancestor)


# -- codec ----------------------------------------------------------------------------------------


def test_encode_is_the_documented_wire_form() -> None:
    t = GPUTopology((pcie(0, 2, "Node"), nv(0, 1, 12, ancestor="Single")))
    assert t.encode() == (
        '{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvlinks":12,"bandwidth":"300G",'
        '"commonAncestor":"Single"},{"minors":[0,2],"gpuLinkType":"PCIe","commonAncestor":"Node"}]}'
    )
    switch = GPUTopology((nv(3, 5, 18, switch=True),))
    assert json.loads(switch.encode())["links"][0] == {
        "minors": [3, 5],
        "gpuLinkType": "NVLink",
        "nvlinks": 18,
        "nvswitch": True,
        "bandwidth": "450G",
        "commonAncestor": "System",
    }


def test_decode_normalises_pair_order_and_keeps_unknown_fields() -> None:
    doc = {
        "links": [
            {"minors": [5, 1], "gpuLinkType": "HCCS", "future": {"x": [1]}, "bandwidth": 1e9},
            {"minors": [0, 1], "gpuLinkType": "PCIe"},
        ],
        "nvswitches": 4,
    }
    t = GPUTopology.decode(json.dumps(doc))
    assert [link.minors for link in t.links] == [(0, 1), (1, 5)]
    hccs = t.link(5, 1)
    assert hccs is not None and hccs.link_type == "HCCS" and hccs.extra == {"future": {"x": [1]}}
    assert hccs.bandwidth == Quantity.parse("1G")
    assert t.extra == {"nvswitches": 4}
    out = json.loads(t.encode())
    assert out["nvswitches"] == 4 and out["links"][1]["future"] == {"x": [1]}
    assert GPUTopology.decode(t.encode()) == t


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[", "<root>: invalid JSON"),
        ("[]", "<root>: expected an object, got array"),
        ('{"links":{}}', "links: expected an array, got object"),
        ('{"links":[1]}', "links[0]: expected an object, got number"),
        ('{"links":[{"gpuLinkType":"PCIe"}]}', "links[0].minors: expected two integer minors"),
        ('{"links":[{"minors":[1,2,3],"gpuLinkType":"PCIe"}]}', "links[0].minors: expected two"),
        ('{"links":[{"minors":[1,true],"gpuLinkType":"PCIe"}]}', "links[0].minors: expected two"),
        ('{"links":[{"minors":[1,-1],"gpuLinkType":"PCIe"}]}', "links[0].minors: expected a non-"),
        ('{"links":[{"minors":[2,2],"gpuLinkType":"PCIe"}]}', "links[0].minors: a pair needs two"),
        ('{"links":[{"minors":[0,1]}]}', "links[0].gpuLinkType: expected a non-empty string"),
        (
            '{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvlinks":-1}]}',
            "links[0].nvlinks: expected a non-negative integer, got -1",
        ),
        (
            '{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvswitch":"yes"}]}',
            "links[0].nvswitch: expected a boolean, got string",
        ),
        (
            '{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","bandwidth":"12Zi"}]}',
            "links[0].bandwidth: ",
        ),
        (
            '{"links":[{"minors":[0,1],"gpuLinkType":"NVLink","bandwidth":"-1G"}]}',
            "links[0].bandwidth: must not be negative",
        ),
        (
            '{"links":[{"minors":[0,1],"gpuLinkType":"PCIe","commonAncestor":3}]}',
            "links[0].commonAncestor: expected a string, got number",
        ),
        (
            '{"links":[{"minors":[0,1],"gpuLinkType":"PCIe"},{"minors":[1,0],"gpuLinkType":"PCIe"}]}',
            "links[1].minors: duplicate pair [0, 1]",
        ),
    ],
    ids=[
        "not-json",
        "root-array",
        "links-object",
        "entry-number",
        "no-minors",
        "three-minors",
        "bool-minor",
        "negative-minor",
        "same-minor",
        "no-link-type",
        "negative-nvlinks",
        "nvswitch-string",
        "bad-bandwidth",
        "negative-bandwidth",
        "ancestor-number",
        "duplicate-pair",
    ],
)
def test_decode_errors_name_the_field(doc: str, message: str) -> None:
    with pytest.raises(TopologyDecodeError) as err:
        GPUTopology.decode(doc)
    assert str(err.value).startswith(message)


def test_records_reject_inconsistent_construction() -> None:
    with pytest.raises(ValueError, match="duplicate link"):
        GPUTopology((pcie(0, 1, "Node"), pcie(0, 1, "System")))
    with pytest.raises(ValueError, match="ascending"):
        GPUTopology((pcie(1, 0, "Node"),))


_json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=5)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def _links(draw: st.DrawFn, max_minor: int = 2**31 - 1) -> GPULink:
    a, b = sorted(draw(st.lists(st.integers(0, max_minor), min_size=2, max_size=2, unique=True)))
    extra_keys = st.text(min_size=1, max_size=6).filter(lambda k: k not in GPULink._KNOWN)
    return GPULink(
        minors=(a, b),
        link_type=draw(st.sampled_from([LINK_NVLINK, LINK_PCIE, "HCCS"])),
        nvlinks=draw(st.integers(0, 2**31 - 1)),
        nvswitch=draw(st.booleans()),
        bandwidth=draw(
            st.none() | st.integers(0, 10**15).map(lambda v: Quantity.of(v, DECIMAL_SI))
        ),
        common_ancestor=draw(st.sampled_from(("", *ANCESTOR_LEVELS, "Future"))),
        extra=draw(st.dictionaries(extra_keys, _json, max_size=2)),
    )


@st.composite
def _topologies(draw: st.DrawFn, max_minor: int = 2**31 - 1) -> GPUTopology:
    links = draw(st.lists(_links(max_minor), max_size=12, unique_by=lambda link: link.minors))
    extra_keys = st.text(min_size=1, max_size=6).filter(lambda k: k != "links")
    return GPUTopology(tuple(links), draw(st.dictionaries(extra_keys, _json, max_size=2)))


@given(_topologies())
def test_round_trip(t: GPUTopology) -> None:
    text = t.encode()
    again = GPUTopology.decode(text)
    assert again == t
    assert again.encode() == text
    for link in t.links:
        assert again.link(*reversed(link.minors)) == link


# -- the Device's view ----------------------------------------------------------------------------


def _device(annotations: dict[str, str]) -> Device:
    return Device.from_dict({"metadata": {"name": "n1", "annotations": annotations}})


def test_device_gpu_topology() -> None:
    assert _device({}).gpu_topology() == GPUTopology()
    assert not _device({}).gpu_topology()
    t = GPUTopology((nv(0, 1, 2),))
    assert _device({ANNOTATION_GPU_TOPOLOGY: t.encode()}).gpu_topology() == t
    with pytest.raises(TopologyDecodeError, match="invalid JSON"):
        _device({ANNOTATION_GPU_TOPOLOGY: "{"}).gpu_topology()


# -- scoring --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("link", "rank"),
    [
        (None, 0),
        (nv(0, 1, 18, switch=True), 100),
        (nv(0, 1, 24), 100),
        (nv(0, 1, 12), 90),
        (nv(0, 1, 2), 73),
        (nv(0, 1, 1), 71),
        (GPULink((0, 1), LINK_NVLINK), 71),
        (pcie(0, 1, "Internal"), 60),
        (pcie(0, 1, "Single"), 50),
        (pcie(0, 1, "Multiple"), 40),
        (pcie(0, 1, "HostBridge"), 30),
        (pcie(0, 1, "Node"), 20),
        (pcie(0, 1, "System"), 10),
        (pcie(0, 1, ""), 0),
        (GPULink((0, 1), "HCCS", 4), 0),
    ],
    ids=lambda v: f"{v.link_type}{v.nvlinks}{v.common_ancestor}" if isinstance(v, GPULink) else "",
)
def test_pair_rank(link: GPULink | None, rank: int) -> None:
    assert pair_rank(link) == rank


def _pairs_box() -> GPUTopology:
    """4 cards: NVLink pairs (0,1) and (2,3) under one switch each, the pairs on two sockets."""
    return GPUTopology(
        (
            nv(0, 1, 12, ancestor="Single"),
            nv(2, 3, 12, ancestor="Single"),
            pcie(0, 2, "System"),
            pcie(0, 3, "System"),
            pcie(1, 2, "System"),
            pcie(1, 3, "System"),
        )
    )


@pytest.mark.parametrize(
    ("minors", "expected"),
    [
        ((), Connectivity(100, 100)),
        ((2,), Connectivity(100, 100)),
        ((0, 1), Connectivity(90, 90)),
        ((1, 0, 1), Connectivity(90, 90)),
        ((0, 2), Connectivity(10, 10)),
        ((0, 1, 2), Connectivity(10, 36)),
        ((0, 1, 2, 3), Connectivity(10, 36)),
        ((0, 7), Connectivity(0, 0)),
    ],
    ids=["empty", "one", "pair", "duplicates", "cross-socket", "three", "all", "unknown-card"],
)
def test_connectivity(minors: tuple[int, ...], expected: Connectivity) -> None:
    t = _pairs_box()
    assert connectivity(t, minors) == expected
    assert connectivity_score(t, minors) == expected.bottleneck


def test_connectivity_orders_sets_bottleneck_first() -> None:
    t = _pairs_box()
    assert connectivity(t, (0, 1)) > connectivity(t, (0, 2))
    # Same bottleneck (System); the set holding an NVLink pair wins on average.
    assert connectivity(t, (0, 1, 2)) > connectivity(
        GPUTopology(tuple(pcie(a, b, "System") for a, b in ((0, 1), (0, 2), (1, 2)))), (0, 1, 2)
    )


def test_nvlink_bandwidth() -> None:
    assert nvlink_bandwidth(18, 25 * G).canonical() == "450G"
    assert nvlink_bandwidth(0, 25 * G).canonical() == "0"


def _reference(t: GPUTopology, minors: list[int]) -> tuple[int, int]:
    """Brute force over ordered pairs (each pair twice): same bottleneck and mean."""
    cards = sorted(set(minors))
    if len(cards) < 2:
        return 100, 100
    ranks = [pair_rank(t.link(a, b)) for a in cards for b in cards if a != b]
    return min(ranks), sum(ranks) // len(ranks)


@given(_topologies(max_minor=8), st.lists(st.integers(0, 8), max_size=6))
def test_connectivity_matches_a_brute_force(t: GPUTopology, minors: list[int]) -> None:
    c = connectivity(t, minors)
    assert (c.bottleneck, c.average) == _reference(t, minors)
    assert 0 <= c.bottleneck <= c.average <= 100


# -- ring bandwidth -------------------------------------------------------------------------------


def _mesh() -> GPUTopology:
    """The V100 hybrid-cube-mesh quad: NV1 on (0,1), (0,2), (1,3); NV2 on the rest."""
    counts = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2}
    return GPUTopology(tuple(nv(a, b, n) for (a, b), n in counts.items()))


@pytest.mark.parametrize(
    ("topology", "minors", "expected"),
    [
        (_mesh(), (), None),
        (_mesh(), (3,), None),
        (_mesh(), (0, 3), "50G"),
        (_mesh(), (3, 0, 3), "50G"),
        (_mesh(), (0, 1, 2, 3), "25G"),
        (_mesh(), (0, 2, 3), "25G"),
        (_mesh(), (1, 2, 3), "25G"),
        (_pairs_box(), (0, 1), "300G"),
        (_pairs_box(), (0, 2), None),
        (_pairs_box(), (0, 1, 2, 3), None),
        (_mesh(), (0, 9), None),
        (
            # a ring 0-1-2-3 over fast links beats the slow diagonals it avoids
            GPUTopology(
                (nv(0, 1, 12), nv(1, 2, 12), nv(2, 3, 12), nv(0, 3, 12), nv(0, 2, 1), nv(1, 3, 1))
            ),
            (0, 1, 2, 3),
            "300G",
        ),
    ],
    ids=[
        "none",
        "one",
        "pair",
        "duplicates",
        "mesh-quad",
        "mesh-triple",
        "mesh-triple-2",
        "nvlink-pair",
        "pcie-pair",
        "needs-pcie",
        "unknown-card",
        "ring-avoids-slow-diagonals",
    ],
)
def test_ring_bandwidth(
    topology: GPUTopology, minors: tuple[int, ...], expected: str | None
) -> None:
    got = ring_bandwidth(topology, minors)
    assert (None if got is None else got.canonical()) == expected


def _brute_ring(t: GPUTopology, cards: list[int]) -> Quantity | None:
    best = None
    for rest in itertools.permutations(cards[1:]):
        ring = [cards[0], *rest, cards[0]]
        hops = [t.link(a, b) for a, b in itertools.pairwise(ring)]
        if any(h is None or h.bandwidth is None for h in hops):
            continue
        value = min(h.bandwidth for h in hops if h is not None and h.bandwidth is not None)
        best = value if best is None or value > best else best
    return best


@given(_topologies(max_minor=6), st.lists(st.integers(0, 6), min_size=3, max_size=7, unique=True))
def test_ring_bandwidth_matches_every_ring(t: GPUTopology, minors: list[int]) -> None:
    assert ring_bandwidth(t, minors) == _brute_ring(t, sorted(minors))


def test_ring_bandwidth_above_the_exact_limit_is_the_weakest_pair() -> None:
    switch = GPUTopology(
        tuple(nv(a, b, 18, switch=True) for a, b in itertools.combinations(range(12), 2))
    )
    got = ring_bandwidth(switch, range(12))
    assert got is not None and got.canonical() == "450G"
    one_pcie = GPUTopology((*switch.links[1:], pcie(0, 1, "Single")))
    assert ring_bandwidth(one_pcie, range(12)) is None
