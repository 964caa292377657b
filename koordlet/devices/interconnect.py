"""PURE: per-card NVLink facts and per-pair PCIe levels -> the node's ``GPUTopology``.

Role: the one place that turns what a library saw on each card's NVLink ports (which GPU or
NVSwitch is at the other end, how many links, which NVLink version) and the common ancestor
of every pair into the pair list of the ``gpu-topology`` annotation (``apis.topology``). Both
libraries (NVML and the YAML fake) feed it, so the rules below hold on every node.

Rules (``docs/device-topology.md``):

- Direct links: a pair's direct NVLink count is what either side counted towards the other
  (the larger of the two, so one card that failed to read its ports does not hide the link).
- NVSwitch: two cards that reach at least one common NVSwitch talk over the switch fabric
  with as many links as the *smaller* of their switch-link totals (every byte leaves one
  card's ports and enters the other's); such a pair is ``nvswitch: true``. Cards behind
  NVSwitch that share no switch are not assumed connected.
- ``nvlinks`` = direct + switched links; ``bandwidth`` = ``nvlinks`` x the per-link rate of
  the lower NVLink version of the two cards (bytes per second each way; NVLink 1: 20 GB/s,
  2-4: 25 GB/s, 5: 50 GB/s), unknown when neither version is known.
- A pair without NVLink is ``PCIe`` with its common ancestor; a pair with neither is left
  out (unknown). Minors missing from ``cards`` simply have no NVLink.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from apis.topology import LINK_NVLINK, LINK_PCIE, GPULink, GPUTopology, nvlink_bandwidth

__all__ = ["NVLINK_BYTES_PER_LINK", "CardLinks", "build_topology"]

NVLINK_BYTES_PER_LINK: Final[Mapping[int, int]] = {
    1: 20 * 10**9,  # P100
    2: 25 * 10**9,  # V100
    3: 25 * 10**9,  # A100
    4: 25 * 10**9,  # H100
    5: 50 * 10**9,  # B200
}
"""Bytes per second, each way, of one NVLink link by NVLink version."""


@dataclass(frozen=True, slots=True)
class CardLinks:
    """The active NVLink links of one card, grouped by what is at the other end."""

    minor: int
    peers: Mapping[int, int] = field(default_factory=dict)
    """Peer GPU minor -> number of links."""
    switches: Mapping[str, int] = field(default_factory=dict)
    """NVSwitch identity (its PCI bus id on NVML) -> number of links."""
    version: int | None = None
    """NVLink version of the card's links; None when unknown."""


def _per_link(a: CardLinks | None, b: CardLinks | None) -> int | None:
    rates = [
        NVLINK_BYTES_PER_LINK[c.version]
        for c in (a, b)
        if c is not None and c.version is not None and c.version in NVLINK_BYTES_PER_LINK
    ]
    return min(rates) if rates else None


def _pair(
    a: int, b: int, cards: Mapping[int, CardLinks], ancestors: Mapping[tuple[int, int], str]
) -> GPULink | None:
    ca, cb = cards.get(a), cards.get(b)
    direct = max(
        ca.peers.get(b, 0) if ca is not None else 0, cb.peers.get(a, 0) if cb is not None else 0
    )
    switched = 0
    if ca is not None and cb is not None and set(ca.switches) & set(cb.switches):
        switched = min(sum(ca.switches.values()), sum(cb.switches.values()))
    ancestor = ancestors.get((a, b), "")
    nvlinks = direct + switched
    if nvlinks:
        rate = _per_link(ca, cb)
        return GPULink(
            minors=(a, b),
            link_type=LINK_NVLINK,
            nvlinks=nvlinks,
            nvswitch=switched > 0,
            bandwidth=None if rate is None else nvlink_bandwidth(nvlinks, rate),
            common_ancestor=ancestor,
        )
    if ancestor:
        return GPULink(minors=(a, b), link_type=LINK_PCIE, common_ancestor=ancestor)
    return None


def build_topology(
    minors: Iterable[int],
    cards: Mapping[int, CardLinks],
    ancestors: Mapping[tuple[int, int], str],
) -> GPUTopology:
    """The topology of the cards ``minors``; ``ancestors`` is keyed by (smaller, larger) minor."""
    links = (
        _pair(a, b, cards, ancestors) for a, b in itertools.combinations(sorted(set(minors)), 2)
    )
    return GPUTopology(tuple(link for link in links if link is not None))
