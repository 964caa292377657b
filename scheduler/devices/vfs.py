"""The choice of an SR-IOV virtual function on a NIC (Koordinator's ``allocateVF``).

Role: a pod whose hint for a device type carries a ``vfSelector`` gets, on each card it is
given, one virtual function: from the card's VF groups whose labels match the selector, not
held by anyone (``NodeView.vfs_taken``), and, when the pod designates VFs of that card in its
own ``device-allocated`` (Koordinator #2807), one of those; the lowest bus id wins (string
order, as Koordinator sorts). A card without such a VF is skipped by the allocator.

Invariants: pure; ``needs_vf`` is Koordinator's ``mustAllocateVF`` (a hint with a
``vfSelector``, even an empty one, which matches every group).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from apis.hints import DeviceHint
from scheduler.devices.request import VF, Holding
from scheduler.devices.topology import CardView

__all__ = ["choose_vf", "has_vfs", "needs_vf", "vfs_held"]


def needs_vf(hint: DeviceHint | None) -> bool:
    return hint is not None and hint.vf_selector is not None


def has_vfs(cards: Collection[CardView]) -> bool:
    """Koordinator's ``hasVirtualFunctions``: some card of the type declares VF groups."""
    return any(c.meta is not None and c.meta.vf_groups for c in cards)


def choose_vf(
    card: CardView,
    hint: DeviceHint,
    taken: Collection[str],
    designated: Collection[str] | None = None,
) -> VF | None:
    """The VF ``card`` gives the pod, or None when it has none left for it."""
    meta = card.meta
    if meta is None:
        return None
    selector = hint.vf_selector
    best: VF | None = None
    for group in meta.vf_groups:
        if selector is not None and not selector.matches(group.labels):
            continue
        for vf in group.vfs:
            if vf.bus_id in taken:
                continue
            if designated is not None and vf.bus_id not in designated:
                continue
            if best is None or vf.bus_id < best[1]:
                best = (vf.minor, vf.bus_id)
    return best


def vfs_held(holdings: Iterable[Holding]) -> dict[tuple[str, int], frozenset[str]]:
    """Per (device type, minor), the VF bus ids ``holdings`` hold (``NodeView.vfs_taken``)."""
    out: dict[tuple[str, int], set[str]] = {}
    for h in holdings:
        for use in h.uses:
            if use.vfs:
                out.setdefault((use.device_type, use.minor), set()).update(b for _, b in use.vfs)
    return {k: frozenset(v) for k, v in out.items()}
