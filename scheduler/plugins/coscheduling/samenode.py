"""Gangs kept on one node: where the members go and which cards they share.

Role: the placement rules of a gang whose ``network-topology-spec`` says ``MustGather`` at
``NodeTopologyLayer`` (``apis.gang.GangSpec.same_node``), on the scheduler's one device ledger
(``scheduler.devices``):

- the gang's node is the node of its first member that is assumed (reserved) or bound; once it
  is known, every other member may go only there (Filter: other nodes are
  UnschedulableAndUnresolvable ``gang <id> stays on node <node>``);
- before that, the first member's node must hold the whole gang's card need: the member's
  whole GPUs times the members still to place (``total-number`` minus those assumed or bound),
  allocated as one set by ``scheduler.devices.allocate`` (partition tables, interconnect and
  all); else Unschedulable ``gang <id> needs <n> GPUs on one node``;
- Score (first member only): the connectivity score (0-100) of that set on the node
  (``interconnect.set_score``), so the node where the whole gang's cards are best connected
  wins; 0 on nodes that publish no interconnect;
- the planned set is the gang's *plan* on that node; every member's card choice is narrowed to
  the plan through DeviceShare's ``PREFERRED_GPUS_KEY`` hook (cycle state only), so the members'
  cards together form the planned set. DeviceShare falls back to its own choice when the plan's
  free cards cannot serve a member.

Invariants: pure reads of the ledger (never a write); the plan is computed before the first
member's cards are reserved and dropped when the gang has no member assumed or bound; members
without whole GPUs only follow the node rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from apis.core import Pod
from apis.resources import DEVICE_GPU
from scheduler.devices import allocate, ledger_of
from scheduler.devices.interconnect import set_score
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import DeviceRequest, RequestError, parse_request
from scheduler.devices.scoring import Scorer
from scheduler.framework.interfaces import Handle
from scheduler.framework.status import Status

__all__ = ["PREFERRED_GPUS_KEY", "GangPlacement", "SameNode"]

PREFERRED_GPUS_KEY: Final = "DeviceShare/preferred-gpus"
"""DeviceShare's cycle-state hook: an object with ``get(node_name) -> Sequence[int] | None``."""


@dataclass(slots=True)
class GangPlacement:
    """Where a same-node gang is, and the cards planned for its members there."""

    node: str | None = None
    plan: tuple[int, ...] = ()
    planned_on: str | None = None
    plans: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per candidate node, the set found for the first member in this cycle."""


class _Preference:
    """The ``PREFERRED_GPUS_KEY`` object of one member's cycle."""

    def __init__(self, rules: SameNode, placement: GangPlacement, pod: Pod, need: int) -> None:
        self._rules, self._placement, self._pod, self._need = rules, placement, pod, need

    def get(self, node: str) -> Sequence[int] | None:
        p = self._placement
        if p.node is not None:
            return p.plan if p.node == node and p.plan else None
        found = p.plans.get(node)
        if found is None:
            found = self._rules.gang_set(self._pod, node, self._need)
        if found:
            p.planned_on, p.plan = node, found
        return found or None


class SameNode:
    """The rules above, over the scheduler's device ledger."""

    def __init__(self, handle: Handle) -> None:
        self._handle = handle
        self._ledger: NodeDeviceLedger | None = None
        self._scorer = Scorer()

    @property
    def ledger(self) -> NodeDeviceLedger:
        if self._ledger is None:
            self._ledger = ledger_of(self._handle)
        return self._ledger

    @staticmethod
    def request_of(pod: Pod) -> DeviceRequest | None:
        try:
            return parse_request(pod)
        except RequestError:
            return None  # DeviceShare reports it

    def gang_request(self, pod: Pod, need: int) -> DeviceRequest | None:
        """The pod's GPU request scaled to ``need`` whole cards (None without whole GPUs)."""
        request = self.request_of(pod)
        if request is None or not request.whole_gpus:
            return None
        treq = request.type_request(DEVICE_GPU)
        assert treq is not None
        return replace(request, types=(replace(treq, count=need),), joint_types=())

    def gang_set(self, pod: Pod, node: str, need: int) -> tuple[int, ...]:
        """The ``need`` cards the gang would get on ``node`` (empty when they do not fit)."""
        request = self.gang_request(pod, need)
        if request is None:
            return ()
        view = self.ledger.node_view(node, (DEVICE_GPU,))
        got = allocate(view, request, self._scorer)
        if isinstance(got, Status):
            return ()
        return tuple(sorted(u.minor for u in got))

    def score(self, placement: GangPlacement, pod: Pod, node: str, need: int) -> int:
        found = placement.plans.get(node)
        if found is None:
            found = self.gang_set(pod, node, need)
            placement.plans[node] = found
        view = self.ledger.node_view(node, (DEVICE_GPU,))
        topology = view.meta.gpu_topology
        if not found or not topology:
            return 0
        cards = [c for c in view.cards.get(DEVICE_GPU, ()) if c.minor in set(found)]
        return set_score(topology, cards)

    def preference(self, placement: GangPlacement, pod: Pod, need: int) -> _Preference:
        return _Preference(self, placement, pod, need)
