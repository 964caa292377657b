"""``NodeSources``: which cards describe each node, and which of them the operator took away.

Role: the ledger's inputs about a node other than its pods. A node is described by its
Device CR (koordlet's real cards) or, on a node that has none — gpushare's device plugin
alone, a cluster that swapped the extender only — by the cards gpushare itself sees in the
node's capacity (SPEC §10): ``aliyun.com/gpu-count`` cards of ``aliyun.com/gpu-mem //
gpu-count`` units each (``apis.gpushare.capacity_cards``). On top, the operator's
``kube-system/unhealthy-gpu-<node>`` ConfigMap marks card indexes unhealthy. The module also
decodes what the ledger reads off a Device (its ``NodeMeta`` and its ``devices-checkpoints``
holding), counting and logging malformed annotations.

Invariants:

- ``device(node)``: the Device CR when the node has one (it takes over from the capacity the
  moment it appears; holdings are by minor, so pods placed before keep their cards), else the
  capacity-derived Device — minors ``0..count-1``, each ``gpu-core`` 100,
  ``gpu-memory-ratio`` 100 and ``gpu-memory`` of its units, healthy, no id — rebuilt when the
  capacity or the unit changes, gone when the capacity is (count 0, or fewer units than
  cards), else None.
- ``unhealthy(node)``: the minors the ConfigMap names, applied to whichever Device describes
  the node (minors it lacks are ignored); a deleted ConfigMap names none.
- Every setter answers whether anything the ledger lays out changed, so unchanged Node
  updates (status heartbeats) cost one comparison.
"""

from __future__ import annotations

import structlog

from apis.allocation import MAX_AMOUNT
from apis.checkpoint import CheckpointError
from apis.core import Node
from apis.device import Device, DeviceInfo
from apis.gpushare import (
    MAX_CAPACITY_CARDS,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    MemoryUnit,
    capacity_cards,
)
from apis.partition import POLICY_HONOR
from apis.quantity import BINARY_SI, DECIMAL_SI, Quantity
from apis.resources import DEVICE_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO
from apis.topology import GPUTopology, TopologyDecodeError
from scheduler.devices.request import CHECKPOINT, Holding, checkpoint_uses
from scheduler.devices.scopetree import device_has_scope_tree
from scheduler.devices.topology import NO_NODE_META, NodeMeta

__all__ = ["NodeSources", "capacity_device", "checkpoint_holding", "decode_meta"]

log = structlog.get_logger(__name__)


def capacity_device(node: str, count: int, units: int, unit: MemoryUnit) -> Device:
    """The Device gpushare's picture of a node stands for: ``count`` cards of ``units``."""
    resources = {
        GPU_CORE: Quantity.of(100, DECIMAL_SI),
        GPU_MEMORY_RATIO: Quantity.of(100, DECIMAL_SI),
        # more than any card has counts as 1 TiB (a number beyond int64 would break the
        # ledger's matrices; anyone who may patch a node's status can write one)
        GPU_MEMORY: Quantity.of(min(units * unit.bytes, MAX_AMOUNT), BINARY_SI),
    }
    cards = tuple(
        DeviceInfo(type=DEVICE_GPU, minor=m, health=True, resources=resources)
        for m in range(count)
    )
    return Device(name=node, devices=cards)


class NodeSources:
    """Device CRs, capacity-derived cards and unhealthy marks, per node (see the module)."""

    def __init__(self, unit: MemoryUnit = MemoryUnit.GiB) -> None:
        self._unit = unit
        self._crs: dict[str, Device] = {}
        self._capacity: dict[str, tuple[int, int]] = {}
        """Per node with gpushare capacity: (card count, units per card)."""
        self._derived: dict[str, Device] = {}
        self._unhealthy: dict[str, frozenset[int]] = {}
        self._refused: dict[str, int] = {}
        """Per node, the hostile gpu-count last warned about."""

    @property
    def unit(self) -> MemoryUnit:
        return self._unit

    def device(self, node: str) -> Device | None:
        """The Device that describes ``node`` now (its CR, else its capacity's cards)."""
        return self._crs.get(node) or self._derived.get(node)

    def unhealthy(self, node: str) -> frozenset[int]:
        return self._unhealthy.get(node, frozenset())

    # -- changes: each answers whether the node's picture changed ------------------------------

    def set_cr(self, device: Device) -> bool:
        self._crs[device.name] = device
        return True

    def delete_cr(self, node: str) -> bool:
        return self._crs.pop(node, None) is not None

    def set_node(self, node: Node) -> bool:
        """A Node added or updated: derive its cards from its capacity (or drop them)."""
        cards = capacity_cards(node.capacity)
        count = node.capacity.get(RESOURCE_GPU_COUNT, 0)
        if count > MAX_CAPACITY_CARDS and self._refused.get(node.name) != count:
            self._refused[node.name] = count  # said once per value, not per status update
            log.warning("aliyun.com/gpu-count beyond any node: no cards derived from it",
                        node=node.name, gpu_count=count, most_cards=MAX_CAPACITY_CARDS)
        if cards == self._capacity.get(node.name):
            return False
        if cards is None:
            self._capacity.pop(node.name, None)
            self._derived.pop(node.name, None)
            log.info("gpushare capacity gone: no cards derived for the node", node=node.name,
                     gpu_mem=node.capacity.get(RESOURCE_GPU_MEM, 0), gpu_count=count)
        else:
            self._capacity[node.name] = cards
            self._derived[node.name] = capacity_device(node.name, *cards, self._unit)
            log.info("cards derived from gpushare capacity (used while the node has no Device CR)",
                     node=node.name, cards=cards[0], units_per_card=cards[1],
                     unit=self._unit.name, device_cr=node.name in self._crs)
        return node.name not in self._crs

    def delete_node(self, name: str) -> bool:
        self._refused.pop(name, None)
        if self._capacity.pop(name, None) is None:
            return False
        self._derived.pop(name, None)
        return name not in self._crs

    def set_unhealthy(self, node: str, minors: frozenset[int]) -> bool:
        if minors == self.unhealthy(node):
            return False
        if minors:
            self._unhealthy[node] = minors
        else:
            self._unhealthy.pop(node, None)
        return True

    def set_unit(self, unit: MemoryUnit) -> list[str]:
        """The size of one unit changed: the nodes whose derived cards were rebuilt."""
        if unit is self._unit:
            return []
        self._unit = unit
        for name, cards in self._capacity.items():
            self._derived[name] = capacity_device(name, *cards, unit)
        return [n for n in self._capacity if n not in self._crs]


def decode_meta(device: Device) -> tuple[NodeMeta, int]:
    """The Device's GPU interconnect, partition table and policy, and how many of its
    annotations were malformed (logged; treated as absent)."""
    errors = 0
    try:
        topology = device.gpu_topology()
    except TopologyDecodeError as err:
        errors += 1
        log.warning("malformed gpu-topology annotation", node=device.name, error=str(err))
        topology = GPUTopology()
    try:
        table = device.gpu_partitions()
    except TopologyDecodeError as err:  # PartitionDecodeError is one
        errors += 1
        log.warning("malformed gpu-partitions annotation", node=device.name, error=str(err))
        table = None
    honor = device.gpu_partition_policy == POLICY_HONOR
    tree = device_has_scope_tree(device)
    if not topology and table is None and not honor and not tree:
        return NO_NODE_META, errors
    return NodeMeta(topology, table or None, honor, tree), errors


def checkpoint_holding(device: Device) -> tuple[Holding | None, int]:
    """The cards kubelet-allocated pods hold (``devices-checkpoints``), and 1 when that
    annotation is malformed (logged; treated as absent)."""
    try:
        uses = checkpoint_uses(device)
    except CheckpointError as err:
        log.warning("malformed devices-checkpoints annotation", node=device.name,
                    error=err.message)
        return None, 1
    if not uses:
        return None, 0
    return Holding(f"checkpoint:{device.name}", device.name, uses, CHECKPOINT), 0
