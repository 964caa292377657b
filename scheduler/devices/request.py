"""What pods ask for and what holders take: the parsing layer of the device ledger (SPEC §3,
§5, §8), used by DeviceShare, GPUFragmentation and any other front end.

Role, part 1: turn a pod into a frozen ``DeviceRequest`` (computed once in PreFilter): the
validated, converted per-device-type request (``apis.resources.device_requests`` +
``gpu_split``), how many devices of each type it needs and what each device must give, and
its hint annotations (``device-allocate-hint``, ``device-joint-allocate``) and GPU partition
spec (``gpu-partition-spec``, ``apis.partition``; GPU requests only). Koordinator's
``preparePod`` / ``GetPodDeviceRequests`` / ``parsePodDeviceShareExtensions`` /
``DefaultDeviceHandler.CalcDesiredRequestsAndCount`` (``pkg/scheduler/plugins/deviceshare``).

Invariants:

- ``parse_request`` returns None for a pod without device resources (hints are then not even
  parsed, as in Koordinator) and raises ``RequestError`` with the exact user-facing message
  otherwise; the plugin turns it into UnschedulableAndUnresolvable.
- ``invalid resource unit <name>: <quantity>`` applies where Koordinator's
  ``ValidatePercentageResource`` applies: ``koordinator.sh/gpu``, ``rdma`` and ``fpga`` whose
  ``Value()`` (the exact quantity rounded up) is above 100 and not a multiple of 100; the
  quantity is printed from the exact request (``100.5`` prints as ``100500m``). Other
  non-integer amounts are rounded up, as ``Value()`` does.
- Per-device amounts are aligned with ``RESOURCES_BY_TYPE[device_type]``; ``requested`` says
  which of them the pod asked for (the others are 0 and, for a GPU, completed once the card is
  known: memory from ratio or ratio from memory).
- Types are listed in the fixed order gpu, rdma, fpga; ``joint_types`` keeps the annotation's
  order (primary first) restricted to requested types not hinted ``ApplyForAll``.

Role, part 2: the records of what a holder takes from cards (``CardUse``, ``Holding``) and
their reading from a bound pod's ``device-allocated`` annotation (``held_uses``, by the one
counting rule ``apis.allocation.held_amounts``: an invalid entry holds its card whole, an
annotation that does not decode every card of the node) and from a Device's
``devices-checkpoints`` annotation (``checkpoint_uses``: each listed GPU taken whole). Unknown
device types and resources are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

from apis.allocation import (
    ALLOCATED_RESOURCES,
    ANNOTATION_DEVICE_ALLOCATED,
    MAX_AMOUNT,
    AllocationDecodeError,
    AllocationReading,
    decode_allocations,
    held_amounts,
    read_allocations,
)
from apis.checkpoint import decode_devices_checkpoints
from apis.core import Pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, LABEL_GPU_ISOLATION_PROVIDER, Device
from apis.gpushare import RESOURCE_GPU_MEM, MemoryUnit, placement_of
from apis.hints import (
    ANNOTATION_DEVICE_ALLOCATE_HINT,
    ANNOTATION_DEVICE_JOINT_ALLOCATE,
    APPLY_FOR_ALL,
    EXCLUSIVE_DEVICE_LEVEL,
    JOINT_SCOPE_SAME_PCIE,
    REQUESTS_AS_COUNT,
    SCOPE_NODE,
    DeviceHint,
    HintDecodeError,
    parse_allocate_hints,
    parse_joint_allocate,
)
from apis.partition import ANNOTATION_GPU_PARTITION_SPEC, PartitionDecodeError, PartitionSpec
from apis.quantity import DECIMAL_SI, Quantity
from apis.resources import (
    DEVICE_FPGA,
    DEVICE_GPU,
    DEVICE_RDMA,
    DEVICE_RESOURCE_NAMES,
    DEVICE_TYPES,
    FPGA,
    GPU_MEMORY,
    KOORD_GPU,
    RDMA,
    GPUSplit,
    InvalidDeviceRequest,
    device_requests,
    gpu_split,
    invalid_unit_message,
)

__all__ = [
    "ANNOTATION",
    "CHECKPOINT",
    "GPU_CORE_INDEX",
    "GPU_MEMORY_INDEX",
    "GPU_RATIO_INDEX",
    "RESERVED",
    "RESOURCES_BY_TYPE",
    "RESOURCE_INDEX",
    "VF",
    "CardUse",
    "DeviceRequest",
    "Holding",
    "InvalidAllocation",
    "RequestError",
    "TypeRequest",
    "checkpoint_uses",
    "gpushare_uses",
    "held_uses",
    "node_cards",
    "parse_request",
    "uses_from_annotation",
]

RESOURCES_BY_TYPE: Final[Mapping[str, tuple[str, ...]]] = ALLOCATED_RESOURCES
"""Per device type, the per-card resources the ledger tracks (matrix index = position)."""

GPU_CORE_INDEX: Final = 0
GPU_RATIO_INDEX: Final = 1
GPU_MEMORY_INDEX: Final = 2

_UNIT_CHECKED: Final = (KOORD_GPU, RDMA, FPGA)
_RESOURCE_OF: Final = {DEVICE_RDMA: RDMA, DEVICE_FPGA: FPGA}


class RequestError(ValueError):
    """The pod's device request is invalid; ``message`` is the exact user-facing text."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class TypeRequest:
    """What one device type needs: ``count`` devices each giving ``per_device``.

    ``count`` 0 means "every device that matches the hint's selector" (``ApplyForAll``).
    ``total`` is the pod-level converted request aligned like ``per_device`` (node scoring).
    """

    device_type: str
    count: int
    per_device: tuple[int, ...]
    requested: tuple[bool, ...]
    total: tuple[int, ...]
    shared: bool = False


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """Everything Filter, Score and Reserve need to know about a pod's devices."""

    types: tuple[TypeRequest, ...]
    converted: Mapping[str, Mapping[str, int]]
    gpu: GPUSplit | None = None
    hints: Mapping[str, DeviceHint] = field(default_factory=dict)
    joint_types: tuple[str, ...] = ()
    joint_same_pcie: bool = False
    gpushare_units: int = 0
    """The pod's ``aliyun.com/gpu-mem`` (kube's effective request, init containers included),
    0 for other pods: it asks for that memory on one card, and its bind carries gpushare's
    annotations too."""
    gpushare_pod_units: int = 0
    """The units gpushare counts for the pod — its app containers' limits alone — written as
    ``ALIYUN_COM_GPU_MEM_POD``, which gpushare's extender and device plugin read back."""
    partition: PartitionSpec | None = None
    """The pod's ``gpu-partition-spec``: it honors GPU partition tables on every node."""
    designated: Mapping[str, Mapping[int, frozenset[str]]] = field(default_factory=dict)
    """The pod's own ``device-allocated`` where it names virtual functions (Koordinator
    #2807): per device type, the cards it may get and, per card, the VF bus ids it may get
    (empty: any VF of that card)."""
    isolation_provider: str = ""
    """The pod's ``koordinator.sh/gpu-isolation-provider`` label."""

    @property
    def whole_gpus(self) -> int:
        """How many whole GPUs the pod asks for (0 for shared or no GPU)."""
        t = self.type_request(DEVICE_GPU)
        return t.count if t is not None and not t.shared and t.count > 0 else 0

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(t.device_type for t in self.types)

    def type_request(self, device_type: str) -> TypeRequest | None:
        for t in self.types:
            if t.device_type == device_type:
                return t
        return None

    @property
    def vectorizable(self) -> bool:
        """True when feasibility is a plain per-card fit count (no hint, no joint rule, no
        partition spec; nodes that honor partition tables are refined by the plugin)."""
        if len(self.joint_types) >= 2 or (self.partition is not None and self.whole_gpus):
            return False
        if self.designated:
            return False
        for t in self.types:
            hint = self.hints.get(t.device_type)
            if hint is not None and not _trivial(hint):
                return False
        return True


def _trivial(hint: DeviceHint) -> bool:
    return (
        hint.selector is None
        and hint.vf_selector is None
        and hint.allocate_strategy == ""
        and hint.required_topology_scope in ("", SCOPE_NODE)
    )


def _designated(annotations: Mapping[str, str]) -> dict[str, dict[int, frozenset[str]]]:
    """Koordinator's ``constructDesignatedVF`` over the pod's own ``device-allocated``: only
    an annotation naming VFs designates anything; one that does not decode is an error, as
    in Koordinator's ``preparePod``."""
    raw = annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw is None:
        return {}
    try:
        decoded = decode_allocations(raw)
    except AllocationDecodeError as err:
        raise RequestError(err.message) from None
    if not any(a.extension is not None and a.extension.vfs for v in decoded.values() for a in v):
        return {}
    out: dict[str, dict[int, frozenset[str]]] = {}
    for device_type, allocations in decoded.items():
        out[device_type] = {
            a.minor: frozenset(vf.bus_id for vf in a.extension.vfs)
            if a.extension is not None else frozenset()
            for a in allocations
        }
    return out


def _exact_quantity(pod: Pod, name: str) -> Quantity | int:
    exact = pod.requests_exact.get(name)
    if exact is None:
        return pod.requests.get(name, 0)
    return Quantity(Fraction(exact), DECIMAL_SI)


def _gpushare(requests: Mapping[str, int], unit: MemoryUnit) -> tuple[Mapping[str, int], int]:
    """A gpushare request (``aliyun.com/gpu-mem`` units) as the GPU memory it stands for:
    kube's effective request, init containers included (they run on the card too)."""
    units = requests.get(RESOURCE_GPU_MEM, 0)
    if units <= 0:
        return requests, 0
    others = sorted(n for n in DEVICE_RESOURCE_NAMES[DEVICE_GPU] if requests.get(n))
    if others:
        raise RequestError(
            f"{RESOURCE_GPU_MEM} cannot be combined with {' '.join(others)}: "
            "ask for GPU memory one way"
        )
    converted = {k: v for k, v in requests.items() if k != RESOURCE_GPU_MEM}
    converted[GPU_MEMORY] = units * unit.bytes
    return converted, units


def _converted(pod: Pod, requests: Mapping[str, int]) -> dict[str, dict[str, int]]:
    try:
        return device_requests(requests)
    except InvalidDeviceRequest as err:
        message = err.message
        for name in _UNIT_CHECKED:
            value = pod.requests.get(name)
            if value is not None and message == invalid_unit_message(name, value):
                message = invalid_unit_message(name, _exact_quantity(pod, name))
                break
        raise RequestError(message) from None


def _gpu_request(converted: Mapping[str, int]) -> tuple[TypeRequest, GPUSplit]:
    split = gpu_split(converted)
    per = (split.core_per_gpu or 0, split.ratio_per_gpu or 0, split.memory_per_gpu or 0)
    requested = (
        split.core_per_gpu is not None,
        split.ratio_per_gpu is not None,
        split.memory_per_gpu is not None,
    )
    total = tuple(converted.get(name, 0) for name in RESOURCES_BY_TYPE[DEVICE_GPU])
    return TypeRequest(DEVICE_GPU, split.count, per, requested, total, split.shared), split


def _common_request(device_type: str, amount: int, hint: DeviceHint | None) -> TypeRequest:
    """``DefaultDeviceHandler.CalcDesiredRequestsAndCount`` for rdma and fpga."""
    count, per = 1, amount
    if amount > 100 and amount % 100 == 0:
        count, per = amount // 100, 100
    elif hint is not None and hint.allocate_strategy == APPLY_FOR_ALL:
        count = 0
    elif hint is not None and hint.allocate_strategy == REQUESTS_AS_COUNT:
        count = amount
        per = 100 if hint.exclusive_policy == EXCLUSIVE_DEVICE_LEVEL else 1
    return TypeRequest(device_type, count, (per,), (True,), (amount,), per < 100)


def parse_request(pod: Pod, gpushare_unit: MemoryUnit = MemoryUnit.GiB) -> DeviceRequest | None:
    """The pod's device request, None when it requests no device; raises ``RequestError``.
    ``gpushare_unit`` is the size of one ``aliyun.com/gpu-mem`` (SPEC §10)."""
    requests, gpushare_units = _gpushare(pod.requests, gpushare_unit)
    converted = _converted(pod, requests)
    if not converted:
        return None
    annotations = pod.annotations
    try:
        hints: Mapping[str, DeviceHint] = {}
        raw_hints = annotations.get(ANNOTATION_DEVICE_ALLOCATE_HINT)
        if raw_hints is not None:
            hints = parse_allocate_hints(raw_hints)
        raw_joint = annotations.get(ANNOTATION_DEVICE_JOINT_ALLOCATE)
        joint = parse_joint_allocate(raw_joint) if raw_joint is not None else None
    except HintDecodeError as err:
        raise RequestError(err.message) from None
    partition: PartitionSpec | None = None
    raw_partition = annotations.get(ANNOTATION_GPU_PARTITION_SPEC)
    if raw_partition is not None and DEVICE_GPU in converted:
        try:
            partition = PartitionSpec.decode(raw_partition)
        except PartitionDecodeError as err:
            raise RequestError(f"invalid GPUPartitionSpec annotation, err: {err}") from None
    types: list[TypeRequest] = []
    split: GPUSplit | None = None
    for device_type in DEVICE_TYPES:
        req = converted.get(device_type)
        if not req:
            continue
        if device_type == DEVICE_GPU:
            treq, split = _gpu_request(req)
        else:
            treq = _common_request(
                device_type, req[_RESOURCE_OF[device_type]], hints.get(device_type)
            )
        types.append(treq)
    joint_types: tuple[str, ...] = ()
    same_pcie = False
    if joint is not None:
        joint_types = tuple(
            dict.fromkeys(
                t
                for t in joint.device_types
                if t in converted
                and not (t in hints and hints[t].allocate_strategy == APPLY_FOR_ALL)
            )
        )
        same_pcie = joint.required_scope == JOINT_SCOPE_SAME_PCIE
    return DeviceRequest(
        types=tuple(types),
        converted={t: dict(r) for t, r in converted.items()},
        gpu=split,
        hints={t: h for t, h in hints.items() if t in converted},
        joint_types=joint_types,
        joint_same_pcie=same_pcie,
        gpushare_units=gpushare_units,
        gpushare_pod_units=pod.app_limits.get(RESOURCE_GPU_MEM, 0) if gpushare_units else 0,
        partition=partition,
        designated=_designated(annotations),
        isolation_provider=pod.labels.get(LABEL_GPU_ISOLATION_PROVIDER, ""),
    )


# ---------------------------------------------------------------------------------------------
# What holders take: our reservations, bound pods' annotations, the node's checkpoint.

RESERVED: Final = "reserved"
ANNOTATION: Final = "annotation"
CHECKPOINT: Final = "checkpoint"

RESOURCE_INDEX: Final[Mapping[str, Mapping[str, int]]] = {
    t: {r: i for i, r in enumerate(rs)} for t, rs in RESOURCES_BY_TYPE.items()
}
"""Device type -> resource name -> its index in ``RESOURCES_BY_TYPE[type]``."""


VF = tuple[int, str]
"""A virtual function of an SR-IOV NIC as an allocation names it: (VF minor, bus id)."""


@dataclass(frozen=True, slots=True)
class CardUse:
    """What a holder takes from one card: ``resources`` sorted by name, and the virtual
    functions of the card it was handed (``extension.vfs``; empty for whole cards)."""

    device_type: str
    minor: int
    resources: tuple[tuple[str, int], ...]
    vfs: tuple[VF, ...] = ()

    @classmethod
    def of(
        cls, device_type: str, minor: int, resources: Mapping[str, int], vfs: tuple[VF, ...] = ()
    ) -> CardUse:
        return cls(device_type, minor, tuple(sorted(resources.items())), vfs)

    def sort_key(self) -> tuple[str, int, tuple[tuple[str, int], ...], tuple[VF, ...]]:
        return (self.device_type, self.minor, self.resources, self.vfs)


@dataclass(frozen=True, slots=True)
class Holding:
    """A pod's (or the node's checkpoint's) devices on one node."""

    uid: str
    node: str
    uses: tuple[CardUse, ...]
    source: str = ANNOTATION
    annotation: str = field(default="", compare=False)
    """The ``device-allocated`` text this holding was read from or will be written as."""

    def sorted_uses(self) -> tuple[CardUse, ...]:
        return tuple(sorted(self.uses, key=CardUse.sort_key))

    def same_allocation(self, other: Holding) -> bool:
        return self.node == other.node and self.sorted_uses() == other.sorted_uses()

    def state(self) -> tuple[str, str, tuple[CardUse, ...]]:
        """Node, source and uses in a canonical order (for comparisons)."""
        return (self.node, self.source, self.sorted_uses())


def node_cards(device: Device) -> list[tuple[str, int, dict[str, int]]]:
    """(type, minor, declared amounts) of each tracked device of a Device CR (the first of a
    minor wins, as in the ledger's row)."""
    cards: list[tuple[str, int, dict[str, int]]] = []
    for device_type, names in RESOURCES_BY_TYPE.items():
        seen: set[int] = set()
        for d in device.devices_of_type(device_type):
            if d.minor is None or d.minor in seen:
                continue
            seen.add(d.minor)
            cards.append((device_type, d.minor, {n: d.resource_value(n) for n in names}))
    return cards


def held_uses(reading: AllocationReading, device: Device | None) -> tuple[CardUse, ...]:
    """What a bound pod's annotation holds on its node, whose Device CR is ``device``
    (``held_amounts``: an invalid entry's card whole, every card when it does not decode)."""
    cards = node_cards(device) if device is not None and not reading.valid else ()
    vfs = {(t, minor): named for t, minor, named in reading.vfs}
    uses: list[CardUse] = []
    for device_type, minor, amounts in held_amounts(reading, cards):
        index = RESOURCE_INDEX.get(device_type)
        if index is not None:
            uses.append(CardUse.of(device_type, minor,
                                   {n: a for n, a in amounts.items() if n in index},
                                   vfs.get((device_type, minor), ())))
    return tuple(uses)


def uses_from_annotation(raw: str) -> tuple[CardUse, ...]:
    """The known device types and resources of a valid ``device-allocated`` value; raises
    ``AllocationDecodeError`` naming the problems of an invalid one."""
    reading = read_allocations(raw)
    if not reading.valid:
        raise AllocationDecodeError("; ".join(reading.problems))
    return held_uses(reading, None)


def gpushare_uses(annotations: Mapping[str, str], unit: MemoryUnit) -> tuple[CardUse, ...]:
    """What a pod placed by gpushare holds (``ALIYUN_COM_GPU_MEM_IDX``/``_POD``): that memory
    on that card; raises ``GPUShareDecodeError``."""
    placement = placement_of(annotations)
    if placement is None or not placement.units:
        return ()
    # Anyone can write these on a pod: more than any card has counts as the whole card (and
    # a number beyond int64 would break the ledger's matrices).
    memory = min(placement.units * unit.bytes, MAX_AMOUNT)
    return (CardUse.of(DEVICE_GPU, placement.index, {GPU_MEMORY: memory}),)


def checkpoint_uses(device: Device) -> tuple[CardUse, ...]:
    """The GPUs of ``device`` that its ``devices-checkpoints`` annotation lists (matched by
    card id), each taken whole (its declared amounts); raises ``CheckpointError``."""
    raw = device.annotations.get(ANNOTATION_DEVICES_CHECKPOINTS)
    if raw is None:
        return ()
    held = {i for e in decode_devices_checkpoints(raw) for i in e.device_ids}
    uses: dict[int, CardUse] = {}
    names = RESOURCES_BY_TYPE[DEVICE_GPU]
    for d in device.devices_of_type(DEVICE_GPU):
        if d.minor is None or not d.id or d.id not in held or d.minor in uses:
            continue
        uses[d.minor] = CardUse.of(DEVICE_GPU, d.minor, {n: d.resource_value(n) for n in names})
    return tuple(uses.values())


@dataclass(frozen=True, slots=True)
class InvalidAllocation:
    """A bound pod whose ``device-allocated`` annotation is invalid, and what it holds."""

    pod: Pod
    reading: AllocationReading
    held: tuple[tuple[str, int], ...]
    """(device type, minor) of the cards it holds whole, as the node's Device CR is now."""

    def describe(self) -> str:
        """One line: the problems and the cards counted as taken."""
        cards = ", ".join(f"{t} {m}" for t, m in self.held) or "none yet (no such card)"
        problems = "; ".join(self.reading.problems)
        if len(problems) > 400:  # an event message has room for a few problems, not all
            problems = problems[:400] + "..."
        return (f"invalid {ANNOTATION_DEVICE_ALLOCATED} annotation ({problems}); "
                f"cards counted as fully used on node {self.pod.node_name}: {cards}")
