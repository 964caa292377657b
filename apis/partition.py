"""GPU partition tables: Koordinator's ``gpu-partitions``, ``gpu-partition-policy`` and
``gpu-partition-spec`` (``apis/extension/device_share.go``).

Role: the wire forms of the card sets a node offers to multi-GPU pods, and their decoders
into frozen records:

- Device annotation ``scheduling.koordinator.sh/gpu-partitions`` (``PartitionTable``): a JSON
  object from the number of GPUs (a decimal string, Go's ``map[int]``) to the list of
  partitions of that size, each ``{"minors":[0,1],"gpuLinkType":"NVLink",
  "ringBusBandwidth":"450G","allocationScore":1}`` (Go's ``GPUPartition``; ``gpuLinkType``,
  ``ringBusBandwidth`` and ``allocationScore`` are omitted when empty/zero);
- label ``node.koordinator.sh/gpu-partition-policy`` (read from the Device CR, as
  Koordinator's scheduler does): ``Honor`` (only table partitions may be allocated) or
  ``Prefer`` (the default: table first, else the usual choice);
- pod annotation ``scheduling.koordinator.sh/gpu-partition-spec`` (``PartitionSpec``):
  ``{"allocatePolicy":"Restricted"|"BestEffort","ringBusBandwidth":"200Gi"}``; an empty policy
  is ``BestEffort``. A pod with a spec honors partitions on every node.

A larger ``allocationScore`` is a better partition (the API's "allocation quality";
``Restricted`` pods take only partitions of the best score of their size).

Invariants:

- Decoding validates every field and raises ``PartitionDecodeError`` (a
  ``TopologyDecodeError``) naming the path (``2[1].minors: ...``); ``null`` or a non-object
  table is an error, as in Koordinator; a key must equal its partitions' card count; unknown
  fields are ignored (Go's ``json.Unmarshal``).
- ``encode`` is deterministic and byte-compatible with Go's ``json.Marshal``: keys sorted as
  strings, fields in declaration order, ``omitempty`` honoured, compact.
- Round trip: ``PartitionTable.decode(t.encode()) == t``; records are immutable; minors of a
  partition are kept sorted ascending.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apis.jsonload import loads
from apis.jsonshow import show
from apis.quantity import Quantity, QuantityError
from apis.topology import TopologyDecodeError, json_kind

__all__ = [
    "ALLOCATE_BEST_EFFORT",
    "ALLOCATE_POLICIES",
    "ALLOCATE_RESTRICTED",
    "ANNOTATION_GPU_PARTITIONS",
    "ANNOTATION_GPU_PARTITION_SPEC",
    "LABEL_GPU_PARTITION_POLICY",
    "POLICY_HONOR",
    "POLICY_PREFER",
    "GPUPartition",
    "PartitionDecodeError",
    "PartitionSpec",
    "PartitionTable",
    "partition_policy",
]

ANNOTATION_GPU_PARTITIONS: Final = "scheduling.koordinator.sh/gpu-partitions"
ANNOTATION_GPU_PARTITION_SPEC: Final = "scheduling.koordinator.sh/gpu-partition-spec"
LABEL_GPU_PARTITION_POLICY: Final = "node.koordinator.sh/gpu-partition-policy"

POLICY_HONOR: Final = "Honor"
POLICY_PREFER: Final = "Prefer"

ALLOCATE_RESTRICTED: Final = "Restricted"
ALLOCATE_BEST_EFFORT: Final = "BestEffort"
ALLOCATE_POLICIES: Final = (ALLOCATE_RESTRICTED, ALLOCATE_BEST_EFFORT)

_INT_MAX: Final = 2**31 - 1


class PartitionDecodeError(TopologyDecodeError):
    """A partition table or spec that cannot be decoded; ``<field path>: <reason>``."""


def _int(v: object, path: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= _INT_MAX:
        raise PartitionDecodeError(path, f"expected an integer >= {minimum}, got {show(v)}")
    return v


def _quantity(v: object, path: str) -> Quantity:
    if not isinstance(v, str | int | float) or isinstance(v, bool):
        raise PartitionDecodeError(path, f"expected a quantity, got {json_kind(v)}")
    try:
        q = Quantity.parse(v.strip() if isinstance(v, str) else v)
    except QuantityError as err:
        raise PartitionDecodeError(path, str(err)) from None
    if q.value < 0:
        raise PartitionDecodeError(path, f"must not be negative, got {q.canonical()}")
    return q


def _object(v: object, path: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise PartitionDecodeError(path, f"expected an object, got {json_kind(v)}")
    return v


def _load(text: str) -> object:
    try:
        return loads(text)
    except (TypeError, ValueError) as exc:
        raise PartitionDecodeError("<root>", f"invalid JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class GPUPartition:
    """One allowed set of cards (Go's ``GPUPartition``)."""

    minors: tuple[int, ...]
    link_type: str = ""
    ring_bandwidth: Quantity | None = None
    allocation_score: int = 0

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.minors))
        if not ordered or len(set(ordered)) != len(ordered) or ordered[0] < 0:
            raise ValueError(f"partition minors must be distinct and non-negative: {ordered}")
        object.__setattr__(self, "minors", ordered)

    @property
    def mask(self) -> int:
        """The minors as a bit set (Koordinator's ``MinorsHash``)."""
        out = 0
        for m in self.minors:
            out |= 1 << m
        return out

    @classmethod
    def from_dict(cls, obj: object, path: str) -> GPUPartition:
        doc = _object(obj, path)
        raw = doc.get("minors")
        if isinstance(raw, str) or not isinstance(raw, Sequence) or not raw:
            raise PartitionDecodeError(
                f"{path}.minors", f"expected a non-empty array, got {show(raw)}"
            )
        minors = [_int(m, f"{path}.minors[{i}]", 0) for i, m in enumerate(raw)]
        if len(set(minors)) != len(minors):
            raise PartitionDecodeError(f"{path}.minors", f"duplicate minor in {minors}")
        link = doc.get("gpuLinkType")
        if link is not None and not isinstance(link, str):
            raise PartitionDecodeError(
                f"{path}.gpuLinkType", f"expected a string, got {json_kind(link)}"
            )
        bandwidth = doc.get("ringBusBandwidth")
        score = doc.get("allocationScore")
        return cls(
            minors=tuple(minors),
            link_type=link or "",
            ring_bandwidth=(
                None if bandwidth is None else _quantity(bandwidth, f"{path}.ringBusBandwidth")
            ),
            allocation_score=0 if score is None else _int(score, f"{path}.allocationScore", 0),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minors": list(self.minors)}
        if self.link_type:
            out["gpuLinkType"] = self.link_type
        if self.ring_bandwidth is not None:
            out["ringBusBandwidth"] = self.ring_bandwidth.canonical()
        if self.allocation_score:
            out["allocationScore"] = self.allocation_score
        return out


@dataclass(frozen=True, slots=True)
class PartitionTable:
    """Partitions by number of GPUs; ``of_size(n)`` best score first, then by minors."""

    partitions: Mapping[int, tuple[GPUPartition, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ordered: dict[int, tuple[GPUPartition, ...]] = {}
        for size in sorted(self.partitions):
            parts = self.partitions[size]
            for p in parts:
                if len(p.minors) != size:
                    raise ValueError(f"partition {list(p.minors)} listed under size {size}")
            ordered[size] = tuple(parts)
        object.__setattr__(self, "partitions", ordered)

    def __bool__(self) -> bool:
        return any(self.partitions.values())

    def __iter__(self) -> Iterator[GPUPartition]:
        for parts in self.partitions.values():
            yield from parts

    def sizes(self) -> tuple[int, ...]:
        return tuple(s for s, parts in self.partitions.items() if parts)

    def of_size(self, size: int) -> tuple[GPUPartition, ...]:
        """The partitions of ``size`` cards, best ``allocationScore`` first, then by minors."""
        return tuple(
            sorted(
                self.partitions.get(size, ()),
                key=lambda p: (-p.allocation_score, p.minors),
            )
        )

    # -- codec ----------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, obj: object) -> PartitionTable:
        doc = _object(obj, "<root>")
        out: dict[int, tuple[GPUPartition, ...]] = {}
        for key, raw in doc.items():
            text = key.strip()
            if not text.lstrip("-").isdigit():
                raise PartitionDecodeError(key, "expected a number of GPUs as the key")
            size = int(text)
            if size < 1:
                raise PartitionDecodeError(key, f"the number of GPUs must be >= 1, got {size}")
            if size in out:
                raise PartitionDecodeError(key, f"duplicate number of GPUs {size}")
            if raw is None:
                raw = []
            if isinstance(raw, str) or not isinstance(raw, Sequence):
                raise PartitionDecodeError(key, f"expected an array, got {json_kind(raw)}")
            parts: list[GPUPartition] = []
            for i, entry in enumerate(raw):
                part = GPUPartition.from_dict(entry, f"{size}[{i}]")
                if len(part.minors) != size:
                    raise PartitionDecodeError(
                        f"{size}[{i}].minors",
                        f"{len(part.minors)} minors listed under {size} GPUs",
                    )
                parts.append(part)
            out[size] = tuple(parts)
        return cls(out)

    def to_dict(self) -> dict[str, Any]:
        # Go's json.Marshal sorts map keys by their string form ("16" before "2").
        return {
            str(size): [p.to_dict() for p in self.partitions[size]]
            for size in sorted(self.partitions, key=str)
        }

    @classmethod
    def decode(cls, text: str) -> PartitionTable:
        """Decode the annotation's value; raises ``PartitionDecodeError``."""
        return cls.from_dict(_load(text))

    def encode(self) -> str:
        """The annotation's value: compact JSON, deterministic, as Go writes it."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """A pod's ``gpu-partition-spec``: how strictly it wants table partitions."""

    allocate_policy: str = ALLOCATE_BEST_EFFORT
    ring_bandwidth: Quantity | None = None

    @property
    def restricted(self) -> bool:
        return self.allocate_policy == ALLOCATE_RESTRICTED

    @classmethod
    def from_dict(cls, obj: object) -> PartitionSpec:
        doc = _object(obj, "<root>")
        policy = doc.get("allocatePolicy")
        if policy is None or policy == "":
            policy = ALLOCATE_BEST_EFFORT
        if policy not in ALLOCATE_POLICIES:
            raise PartitionDecodeError(
                "allocatePolicy",
                f"expected Restricted or BestEffort, got {show(policy)}",
            )
        bandwidth = doc.get("ringBusBandwidth")
        return cls(
            allocate_policy=policy,
            ring_bandwidth=None if bandwidth is None else _quantity(bandwidth, "ringBusBandwidth"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"allocatePolicy": self.allocate_policy}
        if self.ring_bandwidth is not None:
            out["ringBusBandwidth"] = self.ring_bandwidth.canonical()
        return out

    @classmethod
    def decode(cls, text: str) -> PartitionSpec:
        """Decode the annotation's value; raises ``PartitionDecodeError``."""
        return cls.from_dict(_load(text))

    def encode(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


def partition_policy(labels: Mapping[str, str]) -> str:
    """``Honor`` when the label says exactly that, else ``Prefer`` (Koordinator's rule)."""
    return POLICY_HONOR if labels.get(LABEL_GPU_PARTITION_POLICY) == POLICY_HONOR else POLICY_PREFER
