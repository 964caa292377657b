"""Coscheduling: all-or-nothing placement of gangs (Koordinator's gang API).

Role: a QueueSort, PreFilter, Filter, Score, Reserve and Permit plugin (Filter and Score act
only on gangs kept on one node, ``samenode``; every other pod Skips them). Members of a gang are
reserved (their devices held by DeviceShare) and parked at Permit until ``min-available``
members of the gang, and of every gang in its group, are assumed; then every waiting member is
allowed at once. In Strict mode, when any member fails after Reserve (its wait timed out, a
later plugin failed, the bind failed, or it was deleted while waiting) every waiting member of
the group is rejected; the framework then runs Unreserve for each, so no reservation outlives
the attempt. A gang may be defined by a ``scheduling.sigs.k8s.io`` PodGroup (its labelled pods);
a gang whose wait times out gets Koordinator's timeout mark on its pods (``plugin.py``).

Invariants: the plugin's state changes only on the scheduling thread (events, Reserve,
Unreserve, Permit); a gang's queue-sort key never changes while the gang has pods, so the queue
heap stays valid; a pod without gang annotations or labels is never affected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.framework.interfaces import Handle, PluginArgsError
from scheduler.plugins.coscheduling.plugin import Coscheduling

__all__ = ["Coscheduling", "new_coscheduling"]


def new_coscheduling(args: Mapping[str, Any], handle: Handle) -> Coscheduling:
    if args:
        unknown = ", ".join(sorted(str(k) for k in args))
        raise PluginArgsError(f"Coscheduling args: unknown field(s) {unknown} (takes no args)")
    return Coscheduling(handle)
