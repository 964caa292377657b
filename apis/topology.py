"""GPU interconnect of a node: the Device annotation ``scheduling.koordinator.sh/gpu-topology``.

Role: the wire form of what the node agent discovers about GPU-to-GPU links (NVLink peers,
NVSwitch, the PCIe common ancestor of every pair), its decoder into frozen records the
scheduler can query cheaply (``GPUTopology.link(a, b)``), and the pure functions that rank a
*set* of cards by how well they are connected (``connectivity``, ``connectivity_score``) and
give its best-ring bandwidth (``ring_bandwidth``, Koordinator's ``ringBusBandwidth``). Format
and rules: ``docs/device-topology.md``.

Wire format (JSON; keys in this order, Go ``json.Marshal`` style, no blanks)::

    {"links":[{"minors":[0,1],"gpuLinkType":"NVLink","nvlinks":18,"nvswitch":true,
               "bandwidth":"450G","commonAncestor":"Single"}, ...]}

- one entry per unordered pair of GPU minors, ``minors`` sorted ascending, entries sorted by
  ``minors``; a pair that is absent is *unknown* (rank 0), not "unconnected";
- ``gpuLinkType``: ``NVLink`` when the pair talks over NVLink (directly or through NVSwitch),
  else ``PCIe``; other values (``HCCS`` …) are kept as they are;
- ``nvlinks``: NVLink links usable between the pair (omitted when 0); ``nvswitch``: the path
  runs through NVSwitch (omitted when false); ``bandwidth``: a Kubernetes quantity, bytes per
  second in each direction over NVLink (omitted when unknown);
- ``commonAncestor``: the closest PCIe/system level shared by the pair, from NVML's
  ``nvmlDeviceGetTopologyCommonAncestor``: ``Internal`` (same board), ``Single`` (one PCIe
  switch), ``Multiple`` (several switches), ``HostBridge``, ``Node`` (NUMA node), ``System``
  (across sockets); omitted when unknown.

Invariants:

- Decoding validates every field and raises ``TopologyDecodeError`` naming the path
  (``links[3].nvlinks: expected a non-negative integer, got -1``); duplicate pairs and pairs of
  one minor are errors.
- Round trip: ``GPUTopology.decode(t.encode()) == t``; unknown fields, at the top and in each
  entry, are kept in ``extra`` and written back untouched; ``encode`` is deterministic.
- Records are immutable; ``link(a, b) == link(b, a)``; lookups are O(1).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from apis.jsonload import loads, nesting_depth
from apis.quantity import DECIMAL_SI, Quantity, QuantityError

__all__ = [
    "ANCESTOR_HOSTBRIDGE",
    "ANCESTOR_INTERNAL",
    "ANCESTOR_LEVELS",
    "ANCESTOR_MULTIPLE",
    "ANCESTOR_NODE",
    "ANCESTOR_SINGLE",
    "ANCESTOR_SYSTEM",
    "ANNOTATION_GPU_TOPOLOGY",
    "LINK_NVLINK",
    "LINK_PCIE",
    "PERFECT",
    "Connectivity",
    "GPULink",
    "GPUTopology",
    "TopologyDecodeError",
    "connectivity",
    "connectivity_score",
    "json_kind",
    "nvlink_bandwidth",
    "pair_rank",
    "ring_bandwidth",
]

ANNOTATION_GPU_TOPOLOGY: Final = "scheduling.koordinator.sh/gpu-topology"
MAX_NESTING: Final = 100
"""The deepest annotation value decoded: unknown fields are kept (and deep-copied on encode),
so a value nested near the interpreter's recursion limit is refused, far above any real one."""

LINK_NVLINK: Final = "NVLink"
LINK_PCIE: Final = "PCIe"

ANCESTOR_INTERNAL: Final = "Internal"
ANCESTOR_SINGLE: Final = "Single"
ANCESTOR_MULTIPLE: Final = "Multiple"
ANCESTOR_HOSTBRIDGE: Final = "HostBridge"
ANCESTOR_NODE: Final = "Node"
ANCESTOR_SYSTEM: Final = "System"
ANCESTOR_LEVELS: Final = (
    ANCESTOR_INTERNAL,
    ANCESTOR_SINGLE,
    ANCESTOR_MULTIPLE,
    ANCESTOR_HOSTBRIDGE,
    ANCESTOR_NODE,
    ANCESTOR_SYSTEM,
)
"""Common-ancestor levels, closest first (NVML's NVML_TOPOLOGY_* order)."""

PERFECT: Final = 100
"""The rank of a set that needs no interconnect (zero or one card) and the top of the scale."""

_ANCESTOR_RANK: Final[Mapping[str, int]] = {
    ANCESTOR_INTERNAL: 60,
    ANCESTOR_SINGLE: 50,
    ANCESTOR_MULTIPLE: 40,
    ANCESTOR_HOSTBRIDGE: 30,
    ANCESTOR_NODE: 20,
    ANCESTOR_SYSTEM: 10,
}
_NVLINK_BASE: Final = 70
_NVLINK_FULL: Final = 18  # links at which an NVLink pair reaches PERFECT (H100 SXM: 18)
_INT32_MAX: Final = 2**31 - 1
_RING_EXACT_MAX: Final = 10  # cards up to which ring_bandwidth searches every ring


class TopologyDecodeError(ValueError):
    """An annotation that cannot be decoded; the message is ``<field path>: <reason>``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def json_kind(v: object) -> str:
    """The JSON type name of a decoded value, for error messages (shared by the apis codecs)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Mapping):
        return "object"
    if isinstance(v, Sequence):
        return "array"
    return type(v).__name__


def _count(v: object, path: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _INT32_MAX:
        raise TopologyDecodeError(path, f"expected a non-negative integer, got {json.dumps(v)}")
    return v


def _extra(obj: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in obj.items() if k not in known}


@dataclass(frozen=True, slots=True)
class GPULink:
    """What connects two GPUs of a node (see the module docstring for each field)."""

    minors: tuple[int, int]
    link_type: str = LINK_PCIE
    nvlinks: int = 0
    nvswitch: bool = False
    bandwidth: Quantity | None = None
    common_ancestor: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset(
        {"minors", "gpuLinkType", "nvlinks", "nvswitch", "bandwidth", "commonAncestor"}
    )

    @property
    def is_nvlink(self) -> bool:
        return self.link_type == LINK_NVLINK

    @classmethod
    def from_dict(cls, obj: object, path: str = "link") -> GPULink:
        if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
            raise TopologyDecodeError(path, f"expected an object, got {json_kind(obj)}")
        minors = obj.get("minors")
        if (
            not isinstance(minors, Sequence)
            or isinstance(minors, str)
            or len(minors) != 2
            or any(isinstance(m, bool) or not isinstance(m, int) for m in minors)
        ):
            raise TopologyDecodeError(
                f"{path}.minors", f"expected two integer minors, got {json.dumps(minors)}"
            )
        a, b = sorted(_count(m, f"{path}.minors") for m in minors)
        if a == b:
            raise TopologyDecodeError(f"{path}.minors", f"a pair needs two minors, got [{a},{b}]")
        link_type = obj.get("gpuLinkType")
        if not isinstance(link_type, str) or not link_type:
            raise TopologyDecodeError(
                f"{path}.gpuLinkType", f"expected a non-empty string, got {json_kind(link_type)}"
            )
        nvswitch = obj.get("nvswitch")
        if nvswitch is not None and not isinstance(nvswitch, bool):
            raise TopologyDecodeError(
                f"{path}.nvswitch", f"expected a boolean, got {json_kind(nvswitch)}"
            )
        bandwidth = obj.get("bandwidth")
        ancestor = obj.get("commonAncestor")
        if ancestor is not None and not isinstance(ancestor, str):
            raise TopologyDecodeError(
                f"{path}.commonAncestor", f"expected a string, got {json_kind(ancestor)}"
            )
        return cls(
            minors=(a, b),
            link_type=link_type,
            nvlinks=_count(obj.get("nvlinks"), f"{path}.nvlinks"),
            nvswitch=bool(nvswitch),
            bandwidth=None if bandwidth is None else _bandwidth(bandwidth, f"{path}.bandwidth"),
            common_ancestor=ancestor or "",
            extra=_extra(obj, cls._KNOWN),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minors": list(self.minors), "gpuLinkType": self.link_type}
        if self.nvlinks:
            out["nvlinks"] = self.nvlinks
        if self.nvswitch:
            out["nvswitch"] = True
        if self.bandwidth is not None:
            out["bandwidth"] = self.bandwidth.canonical()
        if self.common_ancestor:
            out["commonAncestor"] = self.common_ancestor
        for k, v in self.extra.items():
            out.setdefault(k, copy.deepcopy(v))
        return out


def _bandwidth(v: object, path: str) -> Quantity:
    try:
        if isinstance(v, str):
            q = Quantity.parse(v.strip())
        elif isinstance(v, int | float) and not isinstance(v, bool):
            q = Quantity.parse(v)
        else:
            raise TopologyDecodeError(path, f"expected a quantity, got {json_kind(v)}")
    except QuantityError as err:
        raise TopologyDecodeError(path, str(err)) from None
    if q.value < 0:
        raise TopologyDecodeError(path, f"must not be negative, got {q.canonical()}")
    return q


@dataclass(frozen=True, slots=True)
class GPUTopology:
    """Every known GPU pair of a node; ``link(a, b)`` answers in O(1)."""

    links: tuple[GPULink, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    _index: Mapping[tuple[int, int], GPULink] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    _KNOWN = frozenset({"links"})

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.links, key=lambda link: link.minors))
        index: dict[tuple[int, int], GPULink] = {}
        for link in ordered:
            a, b = link.minors
            if a >= b:
                raise ValueError(f"link minors must be ascending and distinct, got {link.minors}")
            if link.minors in index:
                raise ValueError(f"duplicate link {list(link.minors)}")
            index[link.minors] = link
        object.__setattr__(self, "links", ordered)
        object.__setattr__(self, "_index", index)

    def link(self, a: int, b: int) -> GPULink | None:
        """The link between minors ``a`` and ``b`` (either order); None when unknown."""
        return self._index.get((a, b) if a < b else (b, a))

    @property
    def minors(self) -> frozenset[int]:
        """Every minor that appears in a pair."""
        return frozenset(m for link in self.links for m in link.minors)

    def __bool__(self) -> bool:
        return bool(self.links)

    # -- codec ----------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, obj: object) -> GPUTopology:
        if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
            raise TopologyDecodeError("<root>", f"expected an object, got {json_kind(obj)}")
        raw = obj.get("links")
        if raw is None:
            raw = ()
        if isinstance(raw, str) or not isinstance(raw, Sequence):
            raise TopologyDecodeError("links", f"expected an array, got {json_kind(raw)}")
        links: list[GPULink] = []
        seen: set[tuple[int, int]] = set()
        for i, entry in enumerate(raw):
            link = GPULink.from_dict(entry, f"links[{i}]")
            if link.minors in seen:
                raise TopologyDecodeError(
                    f"links[{i}].minors", f"duplicate pair {list(link.minors)}"
                )
            seen.add(link.minors)
            links.append(link)
        return cls(links=tuple(links), extra=_extra(obj, cls._KNOWN))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"links": [link.to_dict() for link in self.links]}
        for k, v in self.extra.items():
            out.setdefault(k, copy.deepcopy(v))
        return out

    @classmethod
    def decode(cls, text: str) -> GPUTopology:
        """Decode the annotation's value; raises ``TopologyDecodeError``."""
        try:
            doc = loads(text)
        except (TypeError, ValueError) as exc:
            raise TopologyDecodeError("<root>", f"invalid JSON: {exc}") from None
        if nesting_depth(doc) > MAX_NESTING:  # unknown fields are kept and deep-copied
            raise TopologyDecodeError("<root>", f"nested deeper than {MAX_NESTING} levels")
        return cls.from_dict(doc)

    def encode(self) -> str:
        """The annotation's value: compact JSON, deterministic."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


def nvlink_bandwidth(nvlinks: int, per_link_bytes: int) -> Quantity:
    """``nvlinks`` links at ``per_link_bytes`` per second each way, as a DecimalSI quantity."""
    return Quantity.of(nvlinks * per_link_bytes, DECIMAL_SI)


# -- scoring ------------------------------------------------------------------------------------


def pair_rank(link: GPULink | None) -> int:
    """How well one pair is connected, 0 (unknown) to 100.

    NVLink pairs rank 71 to 100 by link count (``70 + 30 * min(nvlinks, 18) / 18``, at least
    71); other pairs by common ancestor: Internal 60, Single 50, Multiple 40, HostBridge 30,
    Node 20, System 10; an unknown pair or level ranks 0.
    """
    if link is None:
        return 0
    if link.is_nvlink:
        n = min(max(link.nvlinks, 1), _NVLINK_FULL)
        return max(_NVLINK_BASE + 1, _NVLINK_BASE + (PERFECT - _NVLINK_BASE) * n // _NVLINK_FULL)
    return _ANCESTOR_RANK.get(link.common_ancestor, 0)


@dataclass(frozen=True, slots=True, order=True)
class Connectivity:
    """How well a set of cards is connected; compares bottleneck first, then average.

    ``bottleneck``: the rank of the set's weakest pair (collective operations across the set
    run at the speed of their slowest hop); ``average``: the mean pair rank (integer), which
    separates sets of equal bottleneck. Both 0 to 100; a set of 0 or 1 card is (100, 100).
    """

    bottleneck: int
    average: int

    @property
    def score(self) -> int:
        """A 0-100 score for a node Score step: the bottleneck rank."""
        return self.bottleneck


def connectivity(topology: GPUTopology, minors: Iterable[int]) -> Connectivity:
    """The ``Connectivity`` of the cards ``minors`` (duplicates ignored) on ``topology``."""
    cards = sorted(set(minors))
    if len(cards) < 2:
        return Connectivity(PERFECT, PERFECT)
    ranks = [pair_rank(topology.link(a, b)) for a, b in itertools.combinations(cards, 2)]
    return Connectivity(min(ranks), sum(ranks) // len(ranks))


def connectivity_score(topology: GPUTopology, minors: Iterable[int]) -> int:
    """The 0-100 connectivity score of a set of cards: ``connectivity(...).score``."""
    return connectivity(topology, minors).score


def ring_bandwidth(topology: GPUTopology, minors: Iterable[int]) -> Quantity | None:
    """The bandwidth of the best ring through the cards ``minors`` (duplicates ignored).

    A ring all-reduce runs at the speed of its slowest hop, so this is the largest, over every
    ring that visits each card once, of the smallest pair ``bandwidth`` on it (Koordinator's
    ``ringBusBandwidth``; bytes per second each way). Two cards: their pair's bandwidth. None
    for fewer than two cards or when every ring needs a pair of unknown bandwidth (PCIe
    pairs carry none). Exact up to 10 cards (a search over card subsets, O(2^n n^2)); above
    that, the smallest bandwidth over all pairs (a lower bound; exact on NVSwitch boxes).
    """
    cards = sorted(set(minors))
    n = len(cards)
    if n < 2:
        return None
    bw: list[list[Fraction | None]] = [[None] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        link = topology.link(cards[i], cards[j])
        if link is not None and link.bandwidth is not None:
            bw[i][j] = bw[j][i] = link.bandwidth.value
    if n == 2 or n > _RING_EXACT_MAX:
        values = [bw[i][j] for i, j in itertools.combinations(range(n), 2)]
        if any(v is None for v in values):
            return None
        return Quantity.of(min(v for v in values if v is not None), DECIMAL_SI)
    # best[mask][v]: the best bottleneck of a path from card 0 through ``mask`` ending at v.
    full = (1 << n) - 1
    best: list[list[Fraction | None]] = [[None] * n for _ in range(1 << n)]
    best[1][0] = Fraction(-1)  # the empty path: no hop yet
    for mask in range(1, full + 1, 2):  # every mask holds card 0
        row = best[mask]
        for v in range(n):
            here = row[v]
            if here is None:
                continue
            for w in range(1, n):
                hop = bw[v][w]
                if mask & (1 << w) or hop is None:
                    continue
                value = hop if here < 0 else min(here, hop)
                old = best[mask | (1 << w)][w]
                if old is None or value > old:
                    best[mask | (1 << w)][w] = value
    result: Fraction | None = None
    for v in range(1, n):
        path, back = best[full][v], bw[v][0]
        if path is None or back is None:
            continue
        value = min(path, back)
        if result is None or value > result:
            result = value
    return None if result is None else Quantity.of(result, DECIMAL_SI)
