"""The ``scheduling.koordinator.sh/device-allocated`` pod annotation (SPEC section 5).

Role: encode the scheduler's per-device allocations byte-identically to Go's ``json.Marshal``
of Koordinator's ``DeviceAllocations`` type, and decode what Koordinator (or we) wrote, with
Go's ``json.Unmarshal`` leniency and clear errors.  It also hosts the small Go-JSON toolkit
that the other annotation codecs of ``apis`` share (``go_json_dumps``, ``go_json_loads``).

Invariants:

- Encoding: compact; map keys sorted by bytes; fields in Go struct order ``minor``,
  ``resources``, ``id``, ``extension`` with ``id`` and ``extension`` omitted when empty/None;
  quantities as canonical Kubernetes strings; strings escaped like Go (``<``, ``>``, ``&``,
  U+2028, U+2029 as ``\\u003c``..., control characters as ``\\n``, ``\\b``... (Go 1.22+) or
  ``\\u00XX``, everything else verbatim UTF-8).
- Decoding follows Go: field names match case-insensitively (later keys win), unknown fields
  are ignored, ``null`` means absent, quantities may be strings or bare numbers (parsed from
  the number's literal text).  Stricter than Go on purpose: a ``null`` allocation entry and a
  negative minor are errors.  Every error is an ``AllocationDecodeError`` naming the path.
- ``DeviceAllocation.resources`` holds ``Quantity`` objects, so each keeps its format
  (``BinarySI`` for gpu-memory, ``DecimalSI`` for percents) and prints canonically.
- Counting (``read_allocations`` + ``held_amounts``, the one rule of the scheduler's ledger,
  ``inspect`` and the device metrics): an annotation that anyone could have written on a
  bound pod is never trusted to make a card look less used. An entry with a negative amount,
  an amount beyond one device (a percent above 100, anything else above 1Ti), no positive
  amount of its type's resources, or a card named twice holds the card it names whole; an
  annotation that does not decode holds every card of its node (a Go node agent fails open on
  it: the container keeps the image's ``NVIDIA_VISIBLE_DEVICES=all``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from apis.quantity import BINARY_SI, DECIMAL_SI, Quantity, QuantityError, int_value
from apis.resources import (
    DEVICE_FPGA,
    DEVICE_GPU,
    DEVICE_RDMA,
    FPGA,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    RDMA,
)

__all__ = [
    "ALLOCATED_RESOURCES",
    "ANNOTATION_DEVICE_ALLOCATED",
    "MAX_AMOUNT",
    "MAX_PERCENT",
    "AllocatedVF",
    "AllocationDecodeError",
    "AllocationExtension",
    "AllocationReading",
    "DeviceAllocation",
    "GoJSONError",
    "JSONNumber",
    "JSONObject",
    "decode_allocations",
    "encode_allocations",
    "encode_int_allocations",
    "go_json_dumps",
    "go_json_loads",
    "held_amounts",
    "read_allocations",
    "read_int",
    "read_list",
    "read_object",
    "read_string",
]

ANNOTATION_DEVICE_ALLOCATED: Final = "scheduling.koordinator.sh/device-allocated"
_GPU_MEMORY: Final = GPU_MEMORY
_BINARY_RESOURCES: Final = frozenset({_GPU_MEMORY})

# -- Go-compatible JSON ---------------------------------------------------------------------------

_SHORT_ESCAPES: Final = {
    '"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
}  # fmt: skip


def _escape_char(c: str) -> str:
    short = _SHORT_ESCAPES.get(c)
    if short is not None:
        return short
    code = ord(c)
    if 0xD800 <= code <= 0xDFFF:  # not representable in a Go string: invalid UTF-8 -> U+FFFD
        return "\\ufffd"
    return f"\\u{code:04x}"


_NEEDS_ESCAPE: Final = re.compile('[\\x00-\\x1f"\\\\<>&\\u2028\\u2029\\ud800-\\udfff]')


def _go_string(s: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _escape_char(m.group()), s) + '"'


def go_json_dumps(value: object) -> str:
    """Compact JSON exactly as Go's ``json.Marshal`` prints these values.

    Accepts None, bool, int, str, ``Quantity`` (canonical string), mappings with string keys
    (sorted) and sequences; a ``dict`` preserves no order of its own, so field order of Go
    structs is the caller's job (use a list of pairs via ``JSONObject``).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, Quantity):
        return _go_string(value.canonical())
    if isinstance(value, JSONNumber):
        return value.text
    if isinstance(value, JSONObject):
        return "{" + ",".join(f"{_go_string(k)}:{go_json_dumps(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, Mapping):
        items = sorted(value.items())
        return "{" + ",".join(f"{_go_string(k)}:{go_json_dumps(v)}" for k, v in items) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(go_json_dumps(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as Go JSON")


@dataclass(frozen=True, slots=True)
class JSONNumber:
    """A JSON number kept as its literal text (Go decodes numbers from the literal)."""

    text: str


@dataclass(frozen=True, slots=True)
class JSONObject:
    """A JSON object as its (key, value) pairs in document order, duplicates included."""

    pairs: tuple[tuple[str, Any], ...]

    def fields(self, names: Sequence[str]) -> dict[str, Any]:
        """Go struct decoding: keys match ``names`` case-insensitively, later keys win."""
        folded = {n.casefold(): n for n in names}
        out: dict[str, Any] = {}
        for key, value in self.pairs:
            name = folded.get(key.casefold())
            if name is not None:
                out[name] = value
        return out

    def as_map(self) -> dict[str, Any]:
        """Go map decoding: exact keys, later duplicates win."""
        return dict(self.pairs)


class GoJSONError(ValueError):
    """Malformed or mistyped JSON; the message is ``<path>: <reason>``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON value {name}")


def go_json_loads(text: str) -> Any:
    """Parse JSON into ``JSONObject``/list/str/bool/None/``JSONNumber``; raises GoJSONError."""
    if not isinstance(text, str):
        raise GoJSONError("", f"expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(
            text,
            object_pairs_hook=lambda pairs: JSONObject(tuple(pairs)),
            parse_int=JSONNumber,
            parse_float=JSONNumber,
            parse_constant=_reject_constant,
        )
    except RecursionError:
        raise GoJSONError("", "invalid JSON: nested too deeply") from None
    except ValueError as err:
        raise GoJSONError("", f"invalid JSON: {err}") from None


def _json_kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, JSONNumber):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, JSONObject):
        return "object"
    return "array"


def read_object(v: object, path: str) -> JSONObject | None:
    """An object, or None for ``null``."""
    if v is None or isinstance(v, JSONObject):
        return v
    raise GoJSONError(path, f"expected an object, got {_json_kind(v)}")


def read_list(v: object, path: str) -> list[Any]:
    """An array (``null`` reads as empty)."""
    if v is None:
        return []
    if isinstance(v, list):
        return v
    raise GoJSONError(path, f"expected an array, got {_json_kind(v)}")


def read_string(v: object, path: str) -> str:
    """A string (``null`` reads as empty)."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    raise GoJSONError(path, f"expected a string, got {_json_kind(v)}")


def read_int(v: object, path: str, bits: int = 64) -> int | None:
    """A JSON integer literal within a signed ``bits``-bit range, or None for ``null``."""
    if v is None:
        return None
    if not isinstance(v, JSONNumber):
        raise GoJSONError(path, f"expected an integer, got {_json_kind(v)}")
    try:
        n = int(v.text)
    except ValueError:
        raise GoJSONError(path, f"expected an integer, got {v.text}") from None
    if not -(2 ** (bits - 1)) <= n < 2 ** (bits - 1):
        raise GoJSONError(path, f"integer {v.text} out of int{bits} range")
    return n


def _read_quantity(v: object, path: str) -> Quantity:
    """Go's ``Quantity.UnmarshalJSON``: a string or a bare number, blanks trimmed."""
    if v is None:
        return Quantity.of(0)
    if isinstance(v, str | JSONNumber):
        text = v.text if isinstance(v, JSONNumber) else v
        try:
            return Quantity.parse(text.strip())
        except QuantityError as err:
            raise GoJSONError(path, str(err)) from None
    raise GoJSONError(path, f"expected a quantity, got {_json_kind(v)}")


# -- the annotation ------------------------------------------------------------------------------


class AllocationDecodeError(ValueError):
    """A malformed ``device-allocated`` annotation; the message names the offending path."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class AllocatedVF:
    """A virtual function handed to the pod (``minor`` and ``busID``, both omitempty)."""

    minor: int = 0
    bus_id: str = ""

    def _pairs(self) -> JSONObject:
        pairs: list[tuple[str, Any]] = []
        if self.minor:
            pairs.append(("minor", self.minor))
        if self.bus_id:
            pairs.append(("busID", self.bus_id))
        return JSONObject(tuple(pairs))


@dataclass(frozen=True, slots=True)
class AllocationExtension:
    """Koordinator's ``DeviceAllocationExtension`` (RDMA VFs, shared-resource template)."""

    vfs: tuple[AllocatedVF, ...] = ()
    gpu_shared_resource_template: str = ""

    def _pairs(self) -> JSONObject:
        pairs: list[tuple[str, Any]] = []
        if self.vfs:
            pairs.append(("vfs", [vf._pairs() for vf in self.vfs]))
        if self.gpu_shared_resource_template:
            pairs.append(("gpuSharedResourceTemplate", self.gpu_shared_resource_template))
        return JSONObject(tuple(pairs))


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """What one device gives a pod: its minor, per-device resources, its id."""

    minor: int
    resources: Mapping[str, Quantity] = field(default_factory=dict)
    id: str = ""
    extension: AllocationExtension | None = None

    @classmethod
    def from_ints(
        cls,
        minor: int,
        resources: Mapping[str, int],
        id: str = "",
        extension: AllocationExtension | None = None,
    ) -> DeviceAllocation:
        """Build from integers: ``gpu-memory`` becomes BinarySI, everything else DecimalSI."""
        quantities = {
            name: Quantity.of(value, BINARY_SI if name in _BINARY_RESOURCES else DECIMAL_SI)
            for name, value in resources.items()
        }
        return cls(minor, quantities, id, extension)

    def resource_value(self, name: str) -> int:
        """The named resource as an integer (``Value()`` semantics), 0 when absent."""
        q = self.resources.get(name)
        return 0 if q is None else int_value(q)

    def _pairs(self) -> JSONObject:
        if not -(2**31) <= self.minor < 2**31:
            raise ValueError(f"minor {self.minor} out of int32 range")
        pairs: list[tuple[str, Any]] = [
            ("minor", self.minor),
            ("resources", dict(self.resources)),
        ]
        if self.id:
            pairs.append(("id", self.id))
        if self.extension is not None:
            pairs.append(("extension", self.extension._pairs()))
        return JSONObject(tuple(pairs))


def encode_allocations(allocs: Mapping[str, Sequence[DeviceAllocation]]) -> str:
    """The annotation value, byte-identical to Go's ``json.Marshal(DeviceAllocations)``."""
    return go_json_dumps({t: [a._pairs() for a in items] for t, items in allocs.items()})


IntAllocation = tuple[int, tuple[tuple[str, int], ...], str]
"""``(minor, resources sorted by name, id)``: what the scheduler allocates on one card."""


@lru_cache(maxsize=4096)
def _resources_json(resources: tuple[tuple[str, int], ...]) -> str:
    return go_json_dumps(
        {
            name: Quantity.of(value, BINARY_SI if name in _BINARY_RESOURCES else DECIMAL_SI)
            for name, value in resources
        }
    )


def encode_int_allocations(allocs: Mapping[str, Sequence[IntAllocation]]) -> str:
    """``encode_allocations`` of ``DeviceAllocation.from_ints`` values, byte for byte, without
    building them: the scheduler's hot path (Reserve). Each card's resources are encoded once
    per distinct shape (cached); ids and minors are spliced in."""
    parts = []
    for device_type in sorted(allocs):
        items = []
        for minor, resources, device_id in allocs[device_type]:
            if not -(2**31) <= minor < 2**31:
                raise ValueError(f"minor {minor} out of int32 range")
            text = f'{{"minor":{minor},"resources":{_resources_json(resources)}'
            if device_id:
                text += f',"id":{_go_string(device_id)}'
            items.append(text + "}")
        parts.append(f"{_go_string(device_type)}:[{','.join(items)}]")
    return "{" + ",".join(parts) + "}"


def _decode_vf(v: object, path: str) -> AllocatedVF:
    obj = read_object(v, path)
    f = obj.fields(("minor", "busID")) if obj is not None else {}
    return AllocatedVF(
        minor=read_int(f.get("minor"), f"{path}.minor") or 0,
        bus_id=read_string(f.get("busID"), f"{path}.busID"),
    )


def _decode_extension(v: object, path: str) -> AllocationExtension | None:
    obj = read_object(v, path)
    if obj is None:
        return None
    f = obj.fields(("vfs", "gpuSharedResourceTemplate"))
    vfs = read_list(f.get("vfs"), f"{path}.vfs")
    return AllocationExtension(
        vfs=tuple(_decode_vf(vf, f"{path}.vfs[{i}]") for i, vf in enumerate(vfs)),
        gpu_shared_resource_template=read_string(
            f.get("gpuSharedResourceTemplate"), f"{path}.gpuSharedResourceTemplate"
        ),
    )


def _decode_one(v: object, path: str) -> DeviceAllocation:
    obj = read_object(v, path)
    if obj is None:
        raise GoJSONError(path, "expected an object, got null")
    f = obj.fields(("minor", "resources", "id", "extension"))
    minor = read_int(f.get("minor"), f"{path}.minor", bits=32) or 0
    if minor < 0:
        raise GoJSONError(f"{path}.minor", f"must not be negative, got {minor}")
    res = read_object(f.get("resources"), f"{path}.resources")
    resources = {
        name: _read_quantity(q, f"{path}.resources[{json.dumps(name)}]")
        for name, q in (res.as_map().items() if res is not None else ())
    }
    return DeviceAllocation(
        minor=minor,
        resources=resources,
        id=read_string(f.get("id"), f"{path}.id"),
        extension=_decode_extension(f.get("extension"), f"{path}.extension"),
    )


def decode_allocations(s: str) -> dict[str, list[DeviceAllocation]]:
    """Parse the annotation; raises ``AllocationDecodeError`` with a path-naming message."""
    try:
        top = read_object(go_json_loads(s), "")
        out: dict[str, list[DeviceAllocation]] = {}
        for device_type, items in top.as_map().items() if top is not None else ():
            entries = read_list(items, device_type)
            out[device_type] = [
                _decode_one(e, f"{device_type}[{i}]") for i, e in enumerate(entries)
            ]
    except GoJSONError as err:
        raise AllocationDecodeError(
            f"invalid {ANNOTATION_DEVICE_ALLOCATED} annotation: {err}"
        ) from None
    return out


# -- counting what a bound pod's annotation holds ---------------------------------------------

ALLOCATED_RESOURCES: Final[Mapping[str, tuple[str, ...]]] = {
    DEVICE_GPU: (GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY),
    DEVICE_RDMA: (RDMA,),
    DEVICE_FPGA: (FPGA,),
}
"""Per device type, the per-device resources an allocation takes (what is accounted)."""

MAX_PERCENT: Final = 100
"""A percent resource (gpu-core, gpu-memory-ratio, rdma, fpga) of one device: 100 is all."""
MAX_AMOUNT: Final = 2**40
"""Any other amount on one device (bytes of gpu-memory): 1Ti is beyond every card, and
sums of such amounts stay far inside int64."""
_PERCENT: Final = frozenset({GPU_CORE, GPU_MEMORY_RATIO, RDMA, FPGA})

CardKey = tuple[str, int]
"""(device type, minor)."""
CardAmounts = tuple[str, int, tuple[tuple[str, int], ...]]
"""(device type, minor, resources as (name, integer amount) sorted by name)."""
CardVFs = tuple[str, int, tuple[tuple[int, str], ...]]
"""(device type, minor, the virtual functions an entry names as (VF minor, bus id))."""


@dataclass(frozen=True, slots=True)
class AllocationReading:
    """A bound pod's ``device-allocated`` annotation as counted (``read_allocations``)."""

    amounts: tuple[CardAmounts, ...] = ()
    """The valid entries, in annotation order (at most one per card)."""
    whole: tuple[CardKey, ...] = ()
    """The cards named by invalid entries: each is held whole."""
    unreadable: bool = False
    """The annotation does not decode: every card of the pod's node is held whole."""
    problems: tuple[str, ...] = ()
    """Why it is invalid, one line per problem (empty: valid)."""
    vfs: tuple[CardVFs, ...] = ()
    """The virtual functions each valid entry names (``extension.vfs``), entries without
    any left out: who holds which VF of an SR-IOV NIC."""

    @property
    def valid(self) -> bool:
        return not self.problems


def _amount_problem(name: str, q: Quantity) -> str | None:
    if q.value < 0:
        return f"negative amount {q.canonical()}"
    cap = MAX_PERCENT if name in _PERCENT else MAX_AMOUNT
    if q.value > cap:
        return f"{q.canonical()} is more than one device has"
    return None


def read_allocations(text: str) -> AllocationReading:
    """Read an annotation for counting: valid entries as amounts (``Value()``, rounded up),
    invalid ones as cards held whole (see the module docstring). Never raises."""
    try:
        decoded = decode_allocations(text)
    except AllocationDecodeError as err:
        reason = err.message.removeprefix(f"invalid {ANNOTATION_DEVICE_ALLOCATED} annotation: ")
        return AllocationReading(unreadable=True, problems=(reason,))
    amounts: dict[CardKey, CardAmounts] = {}
    vfs: dict[CardKey, CardVFs] = {}
    whole: dict[CardKey, None] = {}
    problems: list[str] = []
    for device_type, allocations in decoded.items():
        tracked = ALLOCATED_RESOURCES.get(device_type)
        for i, a in enumerate(allocations):
            key = (device_type, a.minor)
            path = f"{device_type}[{i}]"
            found = []
            if key in amounts or key in whole:
                found.append(f"{path}.minor: device {a.minor} named twice")
            for name, q in a.resources.items():
                problem = _amount_problem(name, q)
                if problem is not None:
                    found.append(f"{path}.resources[{json.dumps(name)}]: {problem}")
            if not found and tracked is not None and not any(
                a.resource_value(n) > 0 for n in tracked
            ):
                # The node agent hands the device out all the same (NVIDIA_VISIBLE_DEVICES).
                found.append(f"{path}.resources: takes nothing of the device it names")
            if found:
                problems.extend(found)
                amounts.pop(key, None)
                vfs.pop(key, None)
                whole[key] = None
            else:
                amounts[key] = (
                    device_type,
                    a.minor,
                    tuple(sorted((n, a.resource_value(n)) for n in a.resources)),
                )
                if a.extension is not None and a.extension.vfs:
                    named = tuple((vf.minor, vf.bus_id) for vf in a.extension.vfs)
                    vfs[key] = (device_type, a.minor, named)
    return AllocationReading(
        tuple(amounts.values()), tuple(whole), False, tuple(problems), tuple(vfs.values())
    )


def held_amounts(
    reading: AllocationReading, cards: Iterable[tuple[str, int, Mapping[str, int]]]
) -> list[tuple[str, int, dict[str, int]]]:
    """What ``reading`` takes from each device, given ``cards``, the (device type, minor,
    declared capacity) of every device of the pod's node: a valid entry its amounts (on a card
    of the node or not), an invalid one its card's whole capacity, an unreadable annotation
    every card's. The one counting rule of the ledger, ``inspect`` and the device metrics."""
    if reading.unreadable:
        return [(t, minor, dict(capacity)) for t, minor, capacity in cards]
    out = [(t, minor, dict(resources)) for t, minor, resources in reading.amounts]
    if reading.whole:
        named = set(reading.whole)
        out.extend((t, minor, dict(capacity)) for t, minor, capacity in cards
                   if (t, minor) in named)
    return out
