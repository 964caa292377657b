"""``NodeOverlay``: a what-if picture of one node's cards over the shared ledger.

Role: the dry-run API of the device ledger for preemption, gangs and a scheduler extender:
"remove these pods' allocations on this node, add those, and would this request fit (and on
which cards)?" — without touching the real ledger. An overlay records only the holdings it
removes and adds; every read (``view``, ``allocate``) is the ledger's ``node_view`` with those
applied, so creating one is O(1) and a clone copies two small dicts.

Invariants:

- The ledger is never mutated through an overlay (the only ledger calls are reads).
- ``remove(uid)`` releases exactly the holding the ledger (or this overlay) has for ``uid`` on
  this node; removing twice or removing an unknown uid changes nothing. The node's
  ``devices-checkpoints`` holding (kubelet-allocated pods) cannot be removed: those pods are
  not ours to evict.
- ``add`` of a uid replaces that uid's previous addition in the overlay (idempotent by uid,
  like the ledger); an added holding of a uid the ledger holds hides the ledger's one.
- An overlay reads the ledger at the time of each read: it is meant to live within one
  scheduling cycle (the scheduling thread owns the ledger), not across events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler.devices.allocator import allocate
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import RESERVED, CardUse, DeviceRequest, Holding
from scheduler.devices.scoring import Scorer
from scheduler.devices.topology import NodeView
from scheduler.framework.status import Status

__all__ = ["NodeOverlay"]


class NodeOverlay:
    """One node's cards as the ledger has them, minus ``removed`` and plus ``added``."""

    def __init__(self, ledger: NodeDeviceLedger, node: str) -> None:
        self.ledger = ledger
        self.node = node
        self._removed: dict[str, Holding] = {}
        self._added: dict[str, Holding] = {}

    def clone(self) -> NodeOverlay:
        other = NodeOverlay(self.ledger, self.node)
        other._removed = dict(self._removed)
        other._added = dict(self._added)
        return other

    @property
    def removed(self) -> Sequence[Holding]:
        return tuple(self._removed.values())

    @property
    def added(self) -> Sequence[Holding]:
        return tuple(self._added.values())

    @property
    def changed(self) -> bool:
        """Whether this overlay removes or adds anything (else it reads as the ledger)."""
        return bool(self._removed or self._added)

    def remove(self, uid: str) -> bool:
        """Release ``uid``'s devices on this node in the overlay; False if it holds none."""
        if self._added.pop(uid, None) is not None:
            held = self.ledger.holding(uid)
            if held is not None and held.node == self.node:
                self._removed[uid] = held
            return True
        held = self.ledger.holding(uid)
        if held is None or held.node != self.node or uid in self._removed:
            return False
        self._removed[uid] = held
        return True

    def restore(self, uid: str) -> bool:
        """Undo ``remove(uid)`` (the pod holds what the ledger says again); False if it was
        not removed."""
        return self._removed.pop(uid, None) is not None

    def add(self, uid: str, uses: Iterable[CardUse]) -> Holding:
        """Let ``uid`` hold ``uses`` in the overlay (replacing what it held before)."""
        holding = Holding(uid, self.node, tuple(uses), RESERVED)
        held = self.ledger.holding(uid)
        if held is not None and held.node == self.node:
            self._removed[uid] = held
        self._added[uid] = holding
        return holding

    def view(self, device_types: Iterable[str]) -> NodeView:
        return self.ledger.node_view(
            self.node, device_types, self._removed.values(), self._added.values()
        )

    def allocate(self, request: DeviceRequest, scorer: Scorer) -> list[CardUse] | Status:
        """What ``allocate`` would give ``request`` on this what-if node."""
        return allocate(self.view(request.device_types), request, scorer)
