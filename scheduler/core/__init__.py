"""The scheduler core: the loop that owns the scheduling thread and its three rooms.

``scheduler.py`` (the ``Scheduler`` facade and its loop), ``events.py`` (cluster changes into
the cache, the queue and the plugins), ``scheduling_cycle.py`` (one pod from pop to Permit),
``binding_cycle.py`` (the bind on a worker, and who may touch what) and ``outcomes.py`` (a
bind's outcome applied on the scheduling thread). See docs/architecture.md.
"""

from scheduler.core.scheduler import Scheduler
from scheduler.core.types import Placement, Preemption, QueueStats

__all__ = ["Placement", "Preemption", "QueueStats", "Scheduler"]
