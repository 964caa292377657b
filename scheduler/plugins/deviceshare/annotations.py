"""What a bind writes for DeviceShare: the ``device-allocated`` annotation (Koordinator's wire
form, ``extension.vfs`` included, as Go's ``json.Marshal`` writes it) and gpushare's
``ALIYUN_COM_GPU_MEM_*`` annotations, from the cards Reserve took."""

from __future__ import annotations

from collections.abc import Sequence

from apis.allocation import (
    AllocatedVF,
    AllocationExtension,
    DeviceAllocation,
    IntAllocation,
    encode_allocations,
    encode_int_allocations,
)
from apis.gpushare import MemoryUnit
from apis.gpushare import bind_annotations as gpushare_bind_annotations
from apis.resources import DEVICE_GPU
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import GPU_MEMORY_INDEX, CardUse, DeviceRequest

__all__ = ["allocation_annotation", "gpushare_annotations"]


def allocation_annotation(ledger: NodeDeviceLedger, node: str, uses: Sequence[CardUse]) -> str:
    """``scheduling.koordinator.sh/device-allocated`` for ``uses`` on ``node``."""
    if any(use.vfs for use in uses):
        return _with_vfs(ledger, node, uses)
    allocations: dict[str, list[IntAllocation]] = {}
    for use in uses:
        meta = ledger.card_meta(node, use.device_type, use.minor)
        allocations.setdefault(use.device_type, []).append(
            (use.minor, tuple(sorted(use.resources)), meta.id if meta is not None else "")
        )
    return encode_int_allocations(allocations)


def _with_vfs(ledger: NodeDeviceLedger, node: str, uses: Sequence[CardUse]) -> str:
    """The annotation with ``extension.vfs`` (Go's ``json.Marshal`` byte for byte)."""
    allocations: dict[str, list[DeviceAllocation]] = {}
    for use in uses:
        meta = ledger.card_meta(node, use.device_type, use.minor)
        extension = None
        if use.vfs:
            extension = AllocationExtension(
                vfs=tuple(AllocatedVF(minor, bus) for minor, bus in use.vfs)
            )
        allocations.setdefault(use.device_type, []).append(DeviceAllocation.from_ints(
            use.minor, dict(use.resources), meta.id if meta is not None else "", extension
        ))  # fmt: skip
    return encode_allocations(allocations)


def gpushare_annotations(
    ledger: NodeDeviceLedger,
    unit: MemoryUnit,
    request: DeviceRequest,
    node: str,
    uses: Sequence[CardUse],
    now_ns: int,
) -> dict[str, str]:
    """gpushare's bind annotations, so that its device plugin (or koordlet's) serves the
    pod: the card, the pod's units, the card's units, ``ASSIGNED=false``, the assume time."""
    use = next(u for u in uses if u.device_type == DEVICE_GPU)
    meta = ledger.card_meta(node, DEVICE_GPU, use.minor)
    card_bytes = meta.declared[GPU_MEMORY_INDEX] if meta is not None else 0
    return gpushare_bind_annotations(
        use.minor, request.gpushare_pod_units, card_bytes // unit.bytes, now_ns
    )
