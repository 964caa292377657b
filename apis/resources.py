"""Device resource names, the allowed request combinations and their conversion (SPEC section 3).

Role: turn a pod's integer resource requests into the validated per-device-type requirement
that the scheduler allocates, with Koordinator's exact rules and error messages
(``pkg/scheduler/plugins/deviceshare/utils.go``: ``ValidateDeviceRequest``,
``ConvertDeviceRequest``, ``calcDesiredRequestsAndCountForGPU``).

Invariants:

- Inputs are integers: percent resources as plain percents, ``gpu-memory`` in bytes,
  ``nvidia.com/gpu`` as a count (callers convert quantities with ``Value()`` semantics, i.e.
  ``apis.quantity.int_value``).  Zero requests are dropped first (``quotav1.RemoveZeros``).
- Device types are validated in the order gpu, rdma, fpga and the first error wins.  Go walks
  a map there (random order); a fixed order keeps our messages deterministic.
- ``invalid resource device requests: [...]`` lists the device type's requested names sorted
  and space-separated (Go prints ``quotav1.ResourceNames`` of a map, i.e. in random order, with
  ``%v`` of a slice; sorting is the deterministic choice among Go's possible outputs).
- A negative request is rejected as ``invalid resource unit <name>: <value>`` (the API server
  never admits one; Go would silently pass it through).
- Conversions between memory bytes and ratio use exact integer arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from apis.quantity import DECIMAL_SI, Quantity, format_quantity

__all__ = [
    "ALL_DEVICE_RESOURCES",
    "DEVICE_FPGA",
    "DEVICE_GPU",
    "DEVICE_RDMA",
    "DEVICE_RESOURCE_NAMES",
    "DEVICE_TYPES",
    "DOMAIN_PREFIX",
    "FPGA",
    "GPU_CORE",
    "GPU_MEMORY",
    "GPU_MEMORY_RATIO",
    "GPU_SHARED",
    "KOORD_GPU",
    "NVIDIA_GPU",
    "RDMA",
    "GPUSplit",
    "InvalidDeviceRequest",
    "device_requests",
    "gpu_split",
    "invalid_combination_message",
    "invalid_unit_message",
    "is_valid_percentage",
    "memory_from_ratio",
    "ratio_from_memory",
]

DOMAIN_PREFIX: Final = "koordinator.sh/"

GPU_CORE: Final = "koordinator.sh/gpu-core"
GPU_MEMORY: Final = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO: Final = "koordinator.sh/gpu-memory-ratio"
GPU_SHARED: Final = "koordinator.sh/gpu.shared"
KOORD_GPU: Final = "koordinator.sh/gpu"
NVIDIA_GPU: Final = "nvidia.com/gpu"
RDMA: Final = "koordinator.sh/rdma"
FPGA: Final = "koordinator.sh/fpga"

DEVICE_GPU: Final = "gpu"
DEVICE_RDMA: Final = "rdma"
DEVICE_FPGA: Final = "fpga"
DEVICE_TYPES: Final[tuple[str, ...]] = (DEVICE_GPU, DEVICE_RDMA, DEVICE_FPGA)

DEVICE_RESOURCE_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    DEVICE_GPU: (NVIDIA_GPU, KOORD_GPU, GPU_SHARED, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO),
    DEVICE_RDMA: (RDMA,),
    DEVICE_FPGA: (FPGA,),
}
"""Device type -> the pod resource names that request it."""

ALL_DEVICE_RESOURCES: Final = frozenset(n for ns in DEVICE_RESOURCE_NAMES.values() for n in ns)

# Resources whose value is checked on its own ("invalid resource unit ...").
_UNIT_CHECKED: Final = frozenset({KOORD_GPU, RDMA, FPGA})


class InvalidDeviceRequest(ValueError):
    """A pod's device request that Koordinator rejects; ``str(err)`` is Koordinator's message."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def invalid_unit_message(name: str, quantity: Quantity | int | str) -> str:
    """``invalid resource unit <name>: <quantity>``, the quantity in canonical form."""
    if isinstance(quantity, int):
        quantity = format_quantity(quantity, DECIMAL_SI)
    return f"invalid resource unit {name}: {quantity}"


def invalid_combination_message(names: Iterable[str]) -> str:
    """``invalid resource device requests: [a b]``, Go's ``%v`` of the sorted names."""
    return f"invalid resource device requests: [{' '.join(sorted(names))}]"


def is_valid_percentage(value: int) -> bool:
    """Koordinator's ``ValidatePercentageResource``: at most 100, or a multiple of 100."""
    return not (value > 100 and value % 100 != 0)


def _percent_ok(req: Mapping[str, int]) -> bool:
    return all(is_valid_percentage(req[n]) for n in (GPU_CORE, GPU_MEMORY_RATIO) if n in req)


def _shared_ok(req: Mapping[str, int]) -> bool:
    shared = req[GPU_SHARED]
    for name in (GPU_CORE, GPU_MEMORY_RATIO):
        if name in req and (req[name] % shared != 0 or req[name] // shared > 100):
            return False
    return True


def _always(req: Mapping[str, int]) -> bool:
    return True


_COMBINATIONS: Final[dict[frozenset[str], Callable[[Mapping[str, int]], bool]]] = {
    frozenset({NVIDIA_GPU}): _always,
    frozenset({KOORD_GPU}): _always,
    frozenset({GPU_MEMORY}): _percent_ok,
    frozenset({GPU_MEMORY_RATIO}): _percent_ok,
    frozenset({GPU_CORE, GPU_MEMORY}): _percent_ok,
    frozenset({GPU_CORE, GPU_MEMORY_RATIO}): _percent_ok,
    frozenset({GPU_SHARED, GPU_MEMORY}): _shared_ok,
    frozenset({GPU_SHARED, GPU_MEMORY_RATIO}): _shared_ok,
    frozenset({GPU_SHARED, GPU_CORE, GPU_MEMORY}): _shared_ok,
    frozenset({GPU_SHARED, GPU_CORE, GPU_MEMORY_RATIO}): _shared_ok,
    frozenset({RDMA}): _always,
    frozenset({FPGA}): _always,
}


def _valid_combination(req: Mapping[str, int]) -> bool:
    check = _COMBINATIONS.get(frozenset(req))
    return check is not None and check(req)


def _convert(req: dict[str, int]) -> dict[str, int]:
    if NVIDIA_GPU in req:
        return {GPU_CORE: req[NVIDIA_GPU] * 100, GPU_MEMORY_RATIO: req[NVIDIA_GPU] * 100}
    if KOORD_GPU in req:
        return {GPU_CORE: req[KOORD_GPU], GPU_MEMORY_RATIO: req[KOORD_GPU]}
    return req


def device_requests(requests: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Validate and convert a pod's requests into device type -> resource name -> amount.

    Non-device resources (cpu, memory, ...) are ignored; a pod with no device resource gives
    ``{}``.  ``nvidia.com/gpu: N`` becomes gpu-core and gpu-memory-ratio N*100,
    ``koordinator.sh/gpu: V`` becomes gpu-core and gpu-memory-ratio V, every other allowed
    combination is kept as is (``gpu.shared`` included).  Raises ``InvalidDeviceRequest``.
    """
    result: dict[str, dict[str, int]] = {}
    for device_type in DEVICE_TYPES:
        masked = {
            name: requests[name]
            for name in DEVICE_RESOURCE_NAMES[device_type]
            if requests.get(name, 0) != 0
        }
        if not masked:
            continue
        for name in sorted(masked):
            value = masked[name]
            if value < 0 or (name in _UNIT_CHECKED and not is_valid_percentage(value)):
                raise InvalidDeviceRequest(invalid_unit_message(name, value))
        if not _valid_combination(masked):
            raise InvalidDeviceRequest(invalid_combination_message(masked))
        result[device_type] = _convert(masked)
    return result


@dataclass(frozen=True, slots=True)
class GPUSplit:
    """How a converted GPU request spreads over cards.

    ``core_per_gpu`` is None when no gpu-core was requested; ``ratio_per_gpu`` is None when
    only memory was requested (the ratio is filled in once the card is known); then
    ``memory_per_gpu`` holds the bytes per card.  When a ratio is present ``memory_per_gpu``
    is None (memory is filled in once the card is known).
    """

    count: int
    core_per_gpu: int | None
    ratio_per_gpu: int | None
    memory_per_gpu: int | None
    shared: bool


def gpu_split(gpu_request: Mapping[str, int]) -> GPUSplit:
    """Per-GPU split of a converted gpu request (``device_requests(...)["gpu"]``).

    count = ``gpu.shared`` if given; else ratio/100 when ratio > 100 is a multiple of 100;
    else 1.  Each card gets core/count and ratio/count (integer division).  The request is
    shared when the per-card ratio is below 100 or when only memory was requested.
    """
    shared_count = gpu_request.get(GPU_SHARED, 0)
    core = gpu_request.get(GPU_CORE)
    ratio = gpu_request.get(GPU_MEMORY_RATIO)
    memory = gpu_request.get(GPU_MEMORY)
    count = 1
    if shared_count > 0:
        count = shared_count
    elif ratio is not None and ratio > 100 and ratio % 100 == 0:
        count = ratio // 100
    core_per_gpu = core // count if core is not None else None
    if ratio is not None:
        ratio_per_gpu = ratio // count
        return GPUSplit(count, core_per_gpu, ratio_per_gpu, None, ratio_per_gpu < 100)
    memory_per_gpu = memory // count if memory is not None else None
    return GPUSplit(count, core_per_gpu, None, memory_per_gpu, memory is not None)


def memory_from_ratio(ratio: int, total_bytes: int) -> int:
    """Bytes of a card for a memory ratio: ``floor(ratio * total_bytes / 100)``."""
    return ratio * total_bytes // 100


def ratio_from_memory(memory: int, total_bytes: int) -> int:
    """Memory ratio of a card for some bytes: ``int(memory / total_bytes * 100)``, truncated.

    Exact integer arithmetic (Koordinator computes it in float64, which can come out one lower
    when the quotient is not representable, e.g. 29 of 100 bytes).
    """
    if total_bytes <= 0:
        raise ValueError(f"total_bytes must be positive, got {total_bytes}")
    q = abs(memory) * 100 // total_bytes
    return q if memory >= 0 else -q
