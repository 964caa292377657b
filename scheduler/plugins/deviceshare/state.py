"""DeviceShare's cycle-state entry: the pod's frozen request, this cycle's what-if per node, and
the allocation Reserve made.

Role: what DeviceShare keeps for one pod between its extension points. The what-if of a cycle
— preemption's dry runs (RemovePod frees a victim's cards; AddPod gives a reprieved one back)
and the pods nominated to a node (AddPod adds the allocation they would get, so their cards stay
taken) — is one ``scheduler.devices.NodeOverlay`` per node over the shared ledger: the same
mechanism every other what-if user (preemption, gangs, explain, an extender) reaches for. The
ledger itself is never changed by it.

Invariants: ``overlays`` holds only nodes whose overlay removes or adds something (so
``overlaid()`` is the set of nodes this cycle sees differently, and a node without one takes
the ledger's fast paths); ``clone()`` copies the what-if (AddPod on a copy never changes the
original) and starts with an empty connectivity cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.overlay import NodeOverlay
from scheduler.devices.request import CardUse, DeviceRequest, Holding
from scheduler.devices.topology import NodeView

__all__ = ["DeviceShareState"]


@dataclass(slots=True)
class DeviceShareState:
    """The cycle-state entry: the frozen request, the what-if per node, the allocation."""

    request: DeviceRequest | None
    overlays: dict[str, NodeOverlay] = field(default_factory=dict)
    """Per node, this cycle's what-if: victims' holdings removed, nominated pods' added."""
    saturated: set[str] = field(default_factory=set)
    """Nodes where a nominated pod's devices do not even fit: nothing is left for others."""
    holding: Holding | None = None
    annotation: str = ""
    gpushare: dict[str, str] = field(default_factory=dict)
    """gpushare's bind annotations (``aliyun.com/gpu-mem`` pods), computed at Reserve."""
    connectivity: dict[str, int] = field(default_factory=dict)
    """Per node, ``allocate``'s outcome for the pod: -1 (fails) or the connectivity score of
    the cards it gives (see ``DeviceShare._outcome``)."""

    def clone(self) -> DeviceShareState:
        return DeviceShareState(
            self.request,
            {node: overlay.clone() for node, overlay in self.overlays.items()},
            set(self.saturated),
            self.holding,
            self.annotation,
            dict(self.gpushare),
        )

    @property
    def removed(self) -> dict[str, Sequence[Holding]]:
        """Per node with any, the holdings this cycle counts as released (victims)."""
        return {node: o.removed for node, o in self.overlays.items() if o.removed}

    def overlaid(self) -> set[str]:
        """Nodes this cycle sees differently from the ledger."""
        return set(self.overlays) | self.saturated

    def view(self, ledger: NodeDeviceLedger, node: str, types: Sequence[str]) -> NodeView:
        """``node``'s cards of ``types`` as this cycle sees them."""
        overlay = self.overlays.get(node)
        return ledger.node_view(node, types) if overlay is None else overlay.view(types)

    def remove(self, ledger: NodeDeviceLedger, node: str, uid: str) -> None:
        """``uid``'s devices on ``node`` are free in this cycle (a victim; or a nominated pod
        added before, which then keeps nothing here)."""
        overlay = self.overlays.get(node) or NodeOverlay(ledger, node)
        if overlay.remove(uid):
            self._keep(node, overlay)

    def restore(self, node: str, uid: str) -> bool:
        """Undo ``remove`` of ``uid`` on ``node`` (a reprieved victim keeps its cards); False
        when it was not removed there."""
        overlay = self.overlays.get(node)
        if overlay is None or not overlay.restore(uid):
            return False
        self._keep(node, overlay)
        return True

    def add(self, ledger: NodeDeviceLedger, node: str, uid: str, uses: Sequence[CardUse]) -> None:
        """``uid`` holds ``uses`` on ``node`` in this cycle (a nominated pod's kept cards)."""
        overlay = self.overlays.get(node) or NodeOverlay(ledger, node)
        overlay.add(uid, uses)
        self._keep(node, overlay)

    def _keep(self, node: str, overlay: NodeOverlay) -> None:
        if overlay.changed:
            self.overlays[node] = overlay
        else:
            self.overlays.pop(node, None)
