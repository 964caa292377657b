"""The Cluster port: cluster changes in, scheduling actions out.

The scheduling core talks to "a cluster" only through this protocol. Two implementations exist:
the in-memory cluster of the simulator (``scheduler.simulator.cluster``) and the Kubernetes API
adapter (``scheduler.kube``). Neither is imported here: this module is the contract.

Invariants: ``subscribe`` handlers receive every change as a ``Change`` of decoded records
(``apis.core.Pod``/``Node``, ``apis.device.Device``), possibly from another thread (the
scheduler hands them to its own thread); ``bind`` is one write carrying the annotations and
raises ``BindError`` on failure (see its flags); ``lookup_pod`` reads the source of truth, not
a cache, so the scheduler can learn what an uncertain bind did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from apis.core import Pod
from scheduler.framework.events import Change
from scheduler.framework.interfaces import BindError, ClusterClient

__all__ = ["BindError", "ChangeHandler", "Cluster", "ClusterClient"]

ChangeHandler = Callable[[Change], None]


class Cluster(ClusterClient, Protocol):
    """A cluster the scheduler can watch and act on."""

    def subscribe(self, handler: ChangeHandler) -> None:
        """Deliver the current state as Add changes, then every later change, to ``handler``."""
        ...

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        """True once the initial state has been delivered to every subscriber."""
        ...

    def lookup_pod(self, pod: Pod) -> Pod | None:
        """The pod named like ``pod`` as the cluster holds it now (any UID), None when there
        is none; raises ``Exception`` when the cluster cannot be read."""
        ...
