"""PrioritySort: kube-scheduler's default QueueSort plugin.

Role: orders the active queue. A pod with a higher ``spec.priority`` comes first; among equal
priorities the one queued earlier (``QueuedPodInfo.timestamp``) comes first.

Invariants: ``less`` is a strict weak ordering (irreflexive, transitive), so the queue's heap
stays valid; it reads only the two queued pod infos and keeps no state.
"""

from __future__ import annotations

from scheduler.framework.interfaces import QueuedPodInfo

__all__ = ["PrioritySort"]


class PrioritySort:
    """``less(a, b)`` is True when ``a`` must be popped before ``b``."""

    name = "PrioritySort"

    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        pa = a.pod.priority
        pb = b.pod.priority
        return pa > pb or (pa == pb and a.timestamp < b.timestamp)

    def sort_key(self, qpi: QueuedPodInfo) -> tuple[int, float]:
        """``less`` as a key: ``less(a, b)`` iff ``sort_key(a) < sort_key(b)``."""
        return (-qpi.pod.priority, qpi.timestamp)
