"""The scheduler's device ledger: one source of truth for card state, below the plugins.

Role: every node's cards (GPU, RDMA, FPGA) and who holds what, shared by every profile and
plugin of one scheduler — Koordinator's ``nodeDeviceCache``. DeviceShare allocates through it,
GPUFragmentation ranks cards on it, and preemption, gangs and a scheduler extender are to use it
rather than keep their own picture. Layout, by concern:

- ``request``: a pod's device request (``parse_request``) and what holders take
  (``CardUse``, ``Holding``; from ``device-allocated`` and ``devices-checkpoints``);
- ``ledger``: ``NodeDeviceLedger``, the holdings by pod uid, the Device CRs and the events,
  over ``table``: the matrices (``CardTable`` per type: resources x nodes x cards
  ``total``/``used``/``free``, ``healthy``, the per-card ``share``; ``card_views``);
- ``topology``: the read-only card and node records (``CardView``, ``NodeView``, ``NodeMeta``)
  and the PCIe/NUMA choice;
- ``interconnect``: the NVLink-aware choice of several whole GPUs and a set's connectivity
  score (``choose_connected``, ``set_score``; ``docs/topology.md``);
- ``scopetree``: Koordinator's GPU scope tree (node, NUMA nodes, PCIe switches): beside the
  GPUs in use, tightest scope first, ``requiredTopologyScope`` (``choose_by_scope``);
- ``vfs``: the SR-IOV VF a NIC gives a pod with a ``vfSelector`` (``choose_vf``) and the VFs
  holders hold (``vfs_held``; ``NodeView.vfs_taken``);
- ``partitions``: the choice by GPU partition table (``choose_partition``: Honor/Prefer,
  Restricted/BestEffort, Koordinator's reasons);
- ``scoring``: card and node scores (``Scorer``: LeastAllocated / MostAllocated, weights);
- ``allocator``: which cards a request gets on a node (``allocate``), whole-cluster feasibility
  (``feasible_rows``, ``rows_feasible``; ``rowfit``: one row's, in Python ints) and the
  per-card fit as matrices (``card_fits``, ``card_taken``, ``card_left``);
- ``rowcache``: ``RequestRows``, the feasibility and node score of every row per request
  shape, recomputed only for the rows that changed (DeviceShare's Filter and Score);
- ``overlay``: ``NodeOverlay``, a what-if node over the ledger that never mutates it.

``ledger_of(handle)`` is the typed accessor: the scheduler's one ledger, created on first use
with its event handler registered once.

Invariants: the ledger is written only on the scheduling thread — by the cluster events its
handler receives and by DeviceShare's Reserve/Unreserve; every other user reads it or works on
an overlay. The package imports the framework and ``apis`` only (its layer sits between the
plugins and the framework), never a plugin.
"""

from __future__ import annotations

from scheduler.devices.allocator import (
    allocate,
    card_fits,
    card_left,
    card_taken,
    feasible_rows,
    rows_feasible,
)
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.overlay import NodeOverlay
from scheduler.devices.request import (
    CardUse,
    DeviceRequest,
    Holding,
    RequestError,
    TypeRequest,
    parse_request,
)
from scheduler.devices.scoring import Scorer, ScoringPolicy
from scheduler.devices.table import SHARE
from scheduler.devices.topology import CardView, NodeView
from scheduler.framework.interfaces import Handle

__all__ = [
    "SHARE",
    "CardUse",
    "CardView",
    "DeviceRequest",
    "Holding",
    "NodeDeviceLedger",
    "NodeOverlay",
    "NodeView",
    "RequestError",
    "Scorer",
    "ScoringPolicy",
    "TypeRequest",
    "allocate",
    "card_fits",
    "card_left",
    "card_taken",
    "feasible_rows",
    "ledger_of",
    "parse_request",
    "rows_feasible",
]


def ledger_of(handle: Handle) -> NodeDeviceLedger:
    """The scheduler's one device ledger (its event handler registered once, on creation)."""

    def make() -> NodeDeviceLedger:
        ledger = NodeDeviceLedger()
        handle.add_event_handler(ledger.apply_change)
        return ledger

    return handle.component(NodeDeviceLedger, make)
