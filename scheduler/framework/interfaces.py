"""The plugin contract: one protocol per extension point, the Handle plugins are built with.

A plugin is any object with a ``name`` that implements one or more of the protocols below; the
runtime finds out which by ``isinstance`` once, when it builds a profile. Methods return
``None`` for success or a ``Status``. Filter and Score come in two forms:

- per node (``filter`` / ``score``): simple, the default, and the reference semantics;
- whole cluster (``filter_nodes`` / ``score_nodes``): a boolean mask or an int64 score array over
  the snapshot's slots in one numpy pass. The runtime prefers it when a plugin provides it; both
  forms must agree (tests check them against each other on random clusters).

Invariants: plugins never import each other or the runtime; they reach the cluster only through
``Handle.client`` (a narrow port) and learn about cluster changes only through the handlers they
register with ``Handle.add_event_handler``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from apis.core import Pod
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import Change, ClusterEvent
from scheduler.framework.nominator import Nominator
from scheduler.framework.status import Status
from scheduler.framework.types import BoolArray, IntArray, NodeInfo, Snapshot
from scheduler.framework.waiting import WaitingPods

MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic."""
        ...


@dataclass(slots=True)
class QueuedPodInfo:
    """A pod in the scheduling queue, with its attempt history."""

    pod: Pod
    timestamp: float
    initial_attempt_timestamp: float | None = None
    attempts: int = 0
    unschedulable_plugins: set[str] = field(default_factory=set)
    pending_plugins: set[str] = field(default_factory=set)
    last_failure: str = ""

    @property
    def key(self) -> str:
        return self.pod.key


class ClusterClient(Protocol):
    """The actions a scheduler takes on the cluster (the outbound half of the Cluster port)."""

    def bind(self, pod: Pod, node_name: str, annotations: Mapping[str, str]) -> None:
        """Bind in one write, annotations included; raise BindError on failure."""
        ...

    def record_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None: ...

    def set_pod_scheduled_condition(
        self, pod: Pod, status: str, reason: str, message: str
    ) -> None: ...

    def set_nominated_node(self, pod: Pod, node_name: str) -> None:
        """Write ``status.nominatedNodeName`` (an empty name clears it). A leader-only write
        (the next leader keeps room for a nominated pod): a replica that lost its lease sends
        nothing, without an error."""
        ...

    def delete_pod(self, pod: Pod, *, preemptor: Pod | None = None) -> None:
        """Delete exactly this incarnation (its UID as a precondition): a preemption's victim
        (``preemptor``: the pod it makes room for; the victim is marked as kube-scheduler
        marks it first, where the backend keeps conditions). A pod already gone is not an
        error; raise on any other failure (a write a replica that lost its lease must not
        send raises ``BindError(fenced=True)``)."""
        ...

    def annotate_pod(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into exactly this incarnation's metadata (its UID as a
        precondition): e.g. a timed-out gang's mark. A pod gone or re-created is not an error;
        a leader-only write, fenced like ``delete_pod`` (``BindError(fenced=True)``)."""
        ...


class BindError(Exception):
    """A bind failed, or may have. Exactly one of the flags may be set:

    - ``gone``: the pod certainly no longer exists (404): forgotten without a retry;
    - ``uncertain``: the write may have been applied (the answer was lost: timeout, reset
      connection, 5xx; or 409, which is "already bound" or "re-created"): the scheduler reads
      the pod back before it releases anything;
    - ``fenced``: nothing was sent, because this replica no longer holds the leader lease;
    - none: the write certainly was not applied (e.g. 403): reported, retried with backoff.
    """

    def __init__(
        self, message: str, *, gone: bool = False, uncertain: bool = False, fenced: bool = False
    ) -> None:
        super().__init__(message)
        self.gone = gone
        self.uncertain = uncertain
        self.fenced = fenced


class PluginsRunner(Protocol):
    """The profile's own extension points, for plugins that run other plugins (preemption's
    dry runs, as kube-scheduler's ``framework.Handle`` embeds ``PluginsRunner``)."""

    def run_pre_filter_add_pod(
        self, state: CycleState, pod: Pod, pod_to_add: Pod, node: NodeInfo
    ) -> Status | None: ...

    def run_pre_filter_remove_pod(
        self, state: CycleState, pod: Pod, pod_to_remove: Pod, node: NodeInfo
    ) -> Status | None: ...

    def run_filter_with_nominated_pods(
        self, state: CycleState, pod: Pod, node: NodeInfo
    ) -> Status | None: ...

    def with_nominated_pods(
        self, state: CycleState, pod: Pod, node: NodeInfo
    ) -> tuple[CycleState, NodeInfo] | Status | None: ...


class Handle:
    """What a plugin may use: the snapshot, the cluster client, the clock, shared state,
    the waiting pods, the nominated pods, and (once the profile is built) its runner."""

    def __init__(
        self,
        snapshot: Snapshot,
        client: ClusterClient,
        clock: Clock,
        profile_name: str = "",
        shared: dict[str, Any] | None = None,
        event_handlers: list[Callable[[Change], None]] | None = None,
        waiting_pods: WaitingPods | None = None,
        nominator: Nominator | None = None,
        write_soon: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.nominator = nominator if nominator is not None else Nominator()
        """Pods nominated to nodes by preemption (shared by the scheduler's profiles)."""
        self.runner: PluginsRunner | None = None
        """The profile's framework; set when it is built."""
        self.waiting_pods = waiting_pods if waiting_pods is not None else WaitingPods()
        """Pods parked by Permit; a plugin allows or rejects them here."""
        self.client = client
        self.clock = clock
        self.profile_name = profile_name
        self._shared = shared if shared is not None else {}
        self._event_handlers = event_handlers if event_handlers is not None else []
        self._write_soon = write_soon

    def write_soon(self, write: Callable[[], None]) -> None:
        """Run a cluster write beside the scheduling thread (the scheduler's worker pool: never
        on the hot path; a failure is logged, never raised). Without a scheduler, at once."""
        if self._write_soon is not None:
            self._write_soon(write)
        else:
            write()

    def shared_state(self, key: str, factory: Callable[[], T]) -> T:
        """One object per scheduler under ``key`` (e.g. a device ledger shared by profiles).

        The factory runs once; later calls return the same object.
        """
        if key not in self._shared:
            self._shared[key] = factory()
        value: T = self._shared[key]
        return value

    def component(self, kind: type[T], factory: Callable[[], T]) -> T:
        """The one ``kind`` object of this scheduler (typed shared state, keyed by class).

        A component is a scheduler-wide object below the plugins (e.g. the device ledger of
        ``scheduler.devices``); its package provides the typed accessor that calls this with
        its factory. The factory runs once; later calls return the same object.
        """
        key = f"component:{kind.__module__}.{kind.__qualname__}"
        value = self.shared_state(key, factory)
        if not isinstance(value, kind):
            raise TypeError(f"shared component {key} is a {type(value).__name__}")
        return value

    def add_event_handler(self, handler: Callable[[Change], None]) -> None:
        """``handler`` receives every cluster change, on the scheduling thread, after the cache."""
        self._event_handlers.append(handler)


class Plugin(Protocol):
    name: str


@runtime_checkable
class QueueSortPlugin(Protocol):
    name: str

    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool: ...


@runtime_checkable
class PreFilterExtensions(Protocol):
    def add_pod(
        self, state: CycleState, pod: Pod, pod_to_add: Pod, node: NodeInfo
    ) -> Status | None: ...

    def remove_pod(
        self, state: CycleState, pod: Pod, pod_to_remove: Pod, node: NodeInfo
    ) -> Status | None: ...


@runtime_checkable
class PreFilterPlugin(Protocol):
    name: str

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None: ...

    def pre_filter_extensions(self) -> PreFilterExtensions | None: ...


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None: ...


@runtime_checkable
class BatchFilterPlugin(Protocol):
    name: str

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None: ...

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> BoolArray:
        """Feasibility of every slot in ``[:snapshot.size]`` (dead slots may be anything)."""
        ...


@runtime_checkable
class FilterReasonsPlugin(Protocol):
    """A whole-cluster filter that can also say, in one pass, why its mask rejected nodes.

    Optional: the runtime asks it only to diagnose a pod that fits nowhere, so that the
    FitError message costs a numpy pass rather than one ``filter`` call per node.
    """

    name: str

    def filter_reasons(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> tuple[IntArray, Sequence[Status]]:
        """``(codes, statuses)``: ``statuses[codes[i]]`` is what ``filter`` returns for the node
        in ``slots[i]`` (which this plugin's mask rejected); a code of -1 means "ask ``filter``
        for that node". Equivalent to calling ``filter`` on each node (a tested invariant)."""
        ...


@dataclass(frozen=True, slots=True)
class PostFilterResult:
    nominated_node: str = ""
    victims: tuple[Pod, ...] = ()
    """The pods a preemption evicted for ``nominated_node`` (metrics, the simulator's report)."""


@runtime_checkable
class PostFilterPlugin(Protocol):
    name: str

    def post_filter(
        self, state: CycleState, pod: Pod, node_to_status: Mapping[str, Status]
    ) -> tuple[PostFilterResult | None, Status | None]: ...


@runtime_checkable
class PreScorePlugin(Protocol):
    name: str

    def pre_score(
        self, state: CycleState, pod: Pod, nodes: Sequence[NodeInfo]
    ) -> Status | None: ...


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int: ...


@runtime_checkable
class BatchScorePlugin(Protocol):
    name: str

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int: ...

    def score_nodes(
        self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: IntArray
    ) -> IntArray:
        """Scores for ``slots`` (in that order), each in [0, 100] unless normalized after."""
        ...


@runtime_checkable
class ScoreNormalizer(Protocol):
    def normalize_score(self, state: CycleState, pod: Pod, scores: IntArray) -> Status | None:
        """Rewrite ``scores`` in place into [0, 100]."""
        ...


@runtime_checkable
class ReservePlugin(Protocol):
    name: str

    def reserve(self, state: CycleState, pod: Pod, node_name: str) -> Status | None: ...

    def unreserve(self, state: CycleState, pod: Pod, node_name: str) -> None: ...


@runtime_checkable
class PermitPlugin(Protocol):
    name: str

    def permit(self, state: CycleState, pod: Pod, node_name: str) -> tuple[Status | None, float]:
        """(status, timeout seconds); a Wait status parks the pod until allowed or timed out."""
        ...


@runtime_checkable
class PreBindPlugin(Protocol):
    name: str

    def pre_bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None: ...


@runtime_checkable
class BindPlugin(Protocol):
    name: str

    def bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        """Skip passes the pod to the next bind plugin."""
        ...


@runtime_checkable
class PostBindPlugin(Protocol):
    name: str

    def post_bind(self, state: CycleState, pod: Pod, node_name: str) -> None: ...


@runtime_checkable
class EnqueueExtensions(Protocol):
    def events_to_register(self) -> Sequence[ClusterEvent]:
        """The cluster events that may make a pod this plugin rejected schedulable."""
        ...


PluginFactory = Callable[[Mapping[str, Any], Handle], Any]
"""Builds a plugin from its (validated by the factory) args and the Handle."""


class PluginArgsError(ValueError):
    """A plugin's args are invalid; the message names the field and the problem."""
