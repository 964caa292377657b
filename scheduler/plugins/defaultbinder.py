"""DefaultBinder: binds the pod to the chosen node through the cluster client.

Role: kube-scheduler's DefaultBinder Bind plugin. One API write per pod: the Binding carries
the annotations other plugins collected in ``CycleState.bind_annotations`` (the device
allocation), which the API server merges into the pod together with ``spec.nodeName``.

Invariants: runs in the binding cycle, off the scheduling thread's hot path; touches no plugin
or cache state. A ``BindError`` comes back as an Error status carrying the exception, so the
scheduler can read ``status.error.gone`` (404/409: the pod is gone or bound elsewhere) and
forget the pod instead of retrying; any other exception is left to the runtime.
"""

from __future__ import annotations

from apis.core import Pod
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.interfaces import BindError, Handle
from scheduler.framework.status import Status, error

__all__ = ["DefaultBinder"]


class DefaultBinder:
    """Bind through ``handle.client.bind(pod, node_name, state.bind_annotations)``."""

    name = "DefaultBinder"

    def __init__(self, handle: Handle) -> None:
        self._handle = handle

    def bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        try:
            self._handle.client.bind(pod, node_name, dict(state.bind_annotations))
        except BindError as exc:
            return error(exc)
        return None
