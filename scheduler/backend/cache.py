"""The scheduler cache: nodes and assigned pods, including pods *assumed* onto a node.

The cache owns the ``Snapshot`` the plugins read and keeps it equal to "every node, and every
pod that is bound, binding or assumed, on its node". After a scheduling cycle picks a node the
scheduler *assumes* the pod (its resources count on the node at once, so the next cycle sees
them) and binds it in the background; the pod's add event later *confirms* the assumption. A
bind that certainly failed *forgets* the pod (its resources are released).

An assumed pod leaves the cache only through its bind outcome (``forget_pod``) or an event
from the informer (confirmed, or deleted) — never by a timer. kube-scheduler dropped its
assumed-pod expiry in kubernetes#106361: a pod whose bind succeeded but whose watch event is
late (API server under load, relist after a 410) is bound and running, and releasing its
resources would hand the same card share to the next pod.

Identity is the pod's UID (``pod_id``): a pod deleted and re-created under the same name is
another pod, so an old assumed copy never hides the new one, and the old bind's outcome never
forgets the new one.

Semantics follow kube-scheduler's cache, made tolerant: events are facts about the cluster, so
an event the cache did not expect (a delete of an unknown pod, a second add) is applied as
well as it can be and never raises. Only the scheduler's own calls (``assume_pod``) raise.

Invariants:
- Single-threaded by design: every method runs on the scheduling thread, between scheduling
  cycles (binding workers hand their results back to that thread). So the snapshot is the
  cache's live state — nothing is copied or rebuilt per cycle, and the cost of a cycle does
  not grow with the number of pods placed.
- Each known pod (by UID) is counted exactly once, on the node named by its cached record;
  the snapshot is mutated only through its own methods.
- Unassigned pods never enter the cache, except as assumed copies carrying a node name;
  terminal pods (Succeeded/Failed) leave it.
- A node deleted while pods still reference it stays in the snapshot as an "imaginary" node
  (not live, its slot kept) until its last pod goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apis.core import Node, Pod
from scheduler.framework.events import Change
from scheduler.framework.interfaces import Clock
from scheduler.framework.types import Snapshot


class CacheError(Exception):
    """The scheduler asked the cache for something inconsistent (e.g. assume a known pod)."""


def pod_id(pod: Pod) -> str:
    """A pod's identity for the cache: its UID (its key only for records without one)."""
    return pod.uid or pod.key


@dataclass(slots=True)
class _PodState:
    pod: Pod
    assumed: bool = False
    binding_finished: bool = False


class Cache:
    """Nodes and assigned pods, kept in ``snapshot`` (see module doc)."""

    def __init__(self, clock: Clock, *, snapshot: Snapshot | None = None) -> None:
        """``snapshot`` must be empty."""
        self.snapshot = snapshot if snapshot is not None else Snapshot()
        if self.snapshot.size:
            raise ValueError("the cache must start from an empty snapshot")
        self._clock = clock
        self._pods: dict[str, _PodState] = {}
        self._assumed: dict[str, _PodState] = {}
        self._assumed_names: dict[str, set[str]] = {}  # pod key -> its assumed incarnations

    # -- nodes ----------------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        self.snapshot.set_node(node)

    def update_node(self, old: Node, new: Node) -> None:
        if old.name != new.name:
            self.snapshot.remove_node(old.name)
        self.snapshot.set_node(new)

    def remove_node(self, node: Node) -> None:
        """The node leaves the live set; its slot stays while pods still reference it."""
        self.snapshot.remove_node(node.name)

    # -- pods from events -----------------------------------------------------------------------

    def add_pod(self, pod: Pod) -> None:
        """An assigned pod was observed: count it, or confirm it when it was assumed (moving it
        when it landed on another node than assumed). Unassigned pods are ignored; a terminal
        pod is removed."""
        if not pod.assigned:
            return
        ident = pod_id(pod)
        if pod.terminal:
            self._remove(ident)
            return
        state = self._pods.get(ident)
        if state is None:
            self._pods[ident] = _PodState(pod)
            self.snapshot.add_pod(pod.node_name, pod)
            return
        self._replace(state, pod)
        if state.assumed:
            state.assumed = False
            state.binding_finished = False
            del self._assumed[ident]
            self._forget_name(state.pod.key, ident)

    def update_pod(self, old: Pod, new: Pod) -> None:
        """Apply a pod update. A new UID is a delete plus an add; an update that shows the pod
        assigned confirms an assumed pod; a terminal pod is removed. An update whose new
        record is unassigned removes a confirmed pod and leaves an assumed one alone (the
        binding is still in flight)."""
        if old.uid != new.uid:
            self.remove_pod(old)
            self.add_pod(new)
            return
        if new.assigned:
            self.add_pod(new)
            return
        state = self._pods.get(pod_id(new))
        if state is not None and not state.assumed:
            self._remove(pod_id(new))

    def remove_pod(self, pod: Pod) -> None:
        """The pod is gone: release it from wherever it is counted (assumed pods too)."""
        self._remove(pod_id(pod))

    def apply(self, change: Change) -> None:
        """Dispatch one observed change: "Node" and "Pod" changes; other kinds are ignored."""
        if change.kind == "Node":
            if change.new is None:
                self.remove_node(change.old)
            elif change.old is None:
                self.add_node(change.new)
            else:
                self.update_node(change.old, change.new)
        elif change.kind == "Pod":
            if change.new is None:
                self.remove_pod(change.old)
            elif change.old is None:
                self.add_pod(change.new)
            else:
                self.update_pod(change.old, change.new)

    # -- the scheduler's own calls ----------------------------------------------------------------

    def assume_pod(self, pod: Pod) -> None:
        """Count ``pod`` (which carries the chosen ``node_name``) on its node before binding."""
        if not pod.assigned:
            raise CacheError(f"pod {pod.key} has no node name and cannot be assumed")
        ident = pod_id(pod)
        if ident in self._pods:
            raise CacheError(f"pod {pod.key} is in the cache already and cannot be assumed")
        state = _PodState(pod, assumed=True)
        self._pods[ident] = state
        self._assumed[ident] = state
        self._assumed_names.setdefault(pod.key, set()).add(ident)
        self.snapshot.add_pod(pod.node_name, pod)

    def finish_binding(self, pod: Pod) -> None:
        """The bind of an assumed pod succeeded: it stays counted until its add event (or its
        delete) arrives, however late — there is no expiry."""
        state = self._assumed.get(pod_id(pod))
        if state is not None:
            state.binding_finished = True

    def forget_pod(self, pod: Pod) -> bool:
        """Undo an assume (bind failed): release the pod's resources. False, and nothing
        changes, when this pod (this UID) is not assumed (confirmed by its add event, gone, or
        a re-created pod of the same name)."""
        ident = pod_id(pod)
        if ident not in self._assumed:
            return False
        self._remove(ident)
        return True

    def is_assumed(self, pod: Pod) -> bool:
        return pod_id(pod) in self._assumed

    def assumed_named(self, key: str) -> list[Pod]:
        """The assumed pods of that namespace/name (incarnations: one, or more when an
        extender bind assumed one the informer has not seen deleted)."""
        return [self._assumed[ident].pod for ident in self._assumed_names.get(key, ())]

    def assumed_pods(self) -> list[Pod]:
        """The pods assumed and not yet confirmed or forgotten."""
        return [state.pod for state in self._assumed.values()]

    # -- reading --------------------------------------------------------------------------------

    def node_count(self) -> int:
        """Live nodes (imaginary nodes kept for their pods are not counted)."""
        return self.snapshot.num_nodes

    def pod_count(self) -> int:
        """Pods counted on nodes: bound, binding and assumed."""
        return len(self._pods)

    def get_pod(self, pod: Pod) -> Pod | None:
        """The cached record of this pod (same UID), or None."""
        state = self._pods.get(pod_id(pod))
        return None if state is None else state.pod

    def pods_on(self, node_name: str) -> list[Pod]:
        """The pods counted on ``node_name``, imaginary nodes included."""
        slot = self.snapshot.index.get(node_name)
        if slot is None:
            return []
        return list(self.snapshot.info(slot).pods.values())

    def dump(self) -> dict[str, Any]:
        """A JSON-friendly picture of the cache, for debugging and ``inspect``."""
        nodes = []
        for info in self.snapshot.infos:
            if info is None:
                continue
            nodes.append(
                {
                    "name": info.name,
                    "slot": info.slot,
                    "live": info.node is not None,
                    "allocatable": info.allocatable,
                    "requested": dict(info.requested),
                    "pods": sorted(p.key for p in info.pods.values()),
                }
            )
        assumed = {
            state.pod.key: {
                "uid": state.pod.uid,
                "node": state.pod.node_name,
                "binding_finished": state.binding_finished,
            }
            for _, state in sorted(self._assumed.items())
        }
        return {"nodes": nodes, "pods": len(self._pods), "assumed": assumed}

    # -- internals -------------------------------------------------------------------------------

    def _replace(self, state: _PodState, pod: Pod) -> None:
        """Count ``pod`` instead of ``state.pod``, on ``pod``'s node."""
        old_node = state.pod.node_name
        if old_node != pod.node_name:
            self.snapshot.remove_pod(old_node, pod_id(pod))
        self.snapshot.add_pod(pod.node_name, pod)
        state.pod = pod

    def _remove(self, ident: str) -> None:
        state = self._pods.pop(ident, None)
        if state is None:
            return
        self._assumed.pop(ident, None)
        self._forget_name(state.pod.key, ident)
        self.snapshot.remove_pod(state.pod.node_name, ident)

    def _forget_name(self, key: str, ident: str) -> None:
        idents = self._assumed_names.get(key)
        if idents is not None:
            idents.discard(ident)
            if not idents:
                del self._assumed_names[key]
