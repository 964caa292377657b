"""An embedded, in-memory cluster implementing the Cluster port (simulator and tests).

It stores objects the way an API server would (the raw mapping plus our decoded record), turns
every write into a ``Change`` for its subscribers, and binds like the API server does: one
write that sets ``spec.nodeName`` and merges the Binding's annotations; a pod that is gone or
already bound answers with ``BindError(gone=True)``.

Invariants: writes are serialised by one lock and each delivers exactly one Change per object
to every subscriber, in write order; stored raw objects are never mutated in place (each write
stores a new mapping), so a record handed out stays valid.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apis.core import Node, Pod, decode_node, decode_pod
from apis.device import Device
from apis.disruption import PodDisruptionBudget, decode_pdb
from apis.gang import PodGroup, decode_pod_group
from apis.gpushare import UnhealthyGPUs, decode_unhealthy
from scheduler.cluster import ChangeHandler
from scheduler.framework.events import PDB_KIND, POD_GROUP_KIND, UNHEALTHY_GPUS_KIND, Change
from scheduler.framework.interfaces import BindError


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    pod_key: str
    type: str
    reason: str
    message: str


class InMemoryCluster:
    """Nodes, pods and Devices in dictionaries, with a bind that behaves like the API server."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}
        self.devices: dict[str, Device] = {}
        self.pdbs: dict[str, PodDisruptionBudget] = {}
        self.pod_groups: dict[str, PodGroup] = {}
        self.unhealthy_gpus: dict[str, UnhealthyGPUs] = {}
        """gpushare's ``kube-system/unhealthy-gpu-<node>`` ConfigMaps, by node."""
        self.events: list[RecordedEvent] = []
        self.binds = 0
        self._handlers: list[ChangeHandler] = []
        self._rv = 0
        self.bind_hook: Callable[[Pod, str], Exception | None] | None = None
        """Tests set this to make a bind fail: return an exception to raise."""

    # -- the Cluster port -------------------------------------------------------------------------

    def subscribe(self, handler: ChangeHandler) -> None:
        with self._lock:
            self._handlers.append(handler)
            for node in self.nodes.values():
                handler(Change("Node", None, node))
            for device in self.devices.values():
                handler(Change("Device", None, device))
            for pod in self.pods.values():
                handler(Change("Pod", None, pod))
            for pdb in self.pdbs.values():
                handler(Change(PDB_KIND, None, pdb))
            for group in self.pod_groups.values():
                handler(Change(POD_GROUP_KIND, None, group))
            for marks in self.unhealthy_gpus.values():
                handler(Change(UNHEALTHY_GPUS_KIND, None, marks))

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return True

    def bind(self, pod: Pod, node_name: str, annotations: Mapping[str, str]) -> None:
        with self._lock:
            if self.bind_hook is not None:
                err = self.bind_hook(pod, node_name)
                if err is not None:
                    raise err
            current = self.pods.get(pod.key)
            if current is None or current.uid != pod.uid:
                raise BindError(f"pods {pod.name!r} not found", gone=True)
            if current.node_name:
                raise BindError(  # the API server's 409: the scheduler reads the pod back
                    f"pod {pod.key} is already assigned to node {current.node_name!r}",
                    uncertain=True,
                )
            # Copy-on-write of the two mappings a Binding changes (stored raws are never
            # mutated), and the record by replacement: a full copy and decode per bind would
            # be most of this "API server"'s cost, on the scheduler's GIL.
            raw = dict(current.raw)
            meta = dict(raw.get("metadata") or {})
            merged = dict(meta.get("annotations") or {})
            merged.update(annotations)
            if merged:
                meta["annotations"] = merged
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            raw["metadata"] = meta
            raw["spec"] = {**(raw.get("spec") or {}), "nodeName": node_name}
            pod = dataclasses.replace(
                current,
                node_name=node_name,
                annotations=merged,
                resource_version=meta["resourceVersion"],
                raw=raw,
            )
            self.binds += 1
            self.pods[pod.key] = pod
            self._emit(Change("Pod", current, pod))

    def lookup_pod(self, pod: Pod) -> Pod | None:
        with self._lock:
            return self.pods.get(pod.key)

    def record_event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        with self._lock:
            self.events.append(RecordedEvent(pod.key, event_type, reason, message))

    def set_pod_scheduled_condition(self, pod: Pod, status: str, reason: str, message: str) -> None:
        with self._lock:
            current = self.pods.get(pod.key)
            if current is None or current.uid != pod.uid or current.node_name:
                return  # gone, re-created or bound meanwhile: like the API server's 409
            raw = copy.deepcopy(dict(current.raw))
            st = raw.setdefault("status", {})
            conditions = [c for c in st.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conditions.append(
                {"type": "PodScheduled", "status": status, "reason": reason, "message": message}
            )
            st["conditions"] = conditions
            self._store_pod(raw)

    def set_nominated_node(self, pod: Pod, node_name: str) -> None:
        with self._lock:
            current = self.pods.get(pod.key)
            if current is None or current.uid != pod.uid:
                return
            if current.nominated_node_name == node_name:
                return
            raw = copy.deepcopy(dict(current.raw))
            st = raw.setdefault("status", {})
            if node_name:
                st["nominatedNodeName"] = node_name
            else:
                st.pop("nominatedNodeName", None)
            self._store_pod(raw)

    def annotate_pod(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into exactly this incarnation (gone or re-created: nothing)."""
        with self._lock:
            current = self.pods.get(pod.key)
            if current is None or current.uid != pod.uid:
                return
            if all(current.annotations.get(k) == v for k, v in annotations.items()):
                return
            raw = copy.deepcopy(dict(current.raw))
            meta = raw.setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
            self._store_pod(raw)

    # -- writes (the "API") ---------------------------------------------------------------------

    def apply_node(self, obj: Mapping[str, Any]) -> Node:
        with self._lock:
            node = decode_node(self._stamp(obj))
            old = self.nodes.get(node.name)
            self.nodes[node.name] = node
            self._emit(Change("Node", old, node))
            return node

    def delete_node(self, name: str) -> None:
        with self._lock:
            old = self.nodes.pop(name, None)
            if old is not None:
                self._emit(Change("Node", old, None))

    def apply_device(self, obj: Mapping[str, Any]) -> Device:
        with self._lock:
            device = Device.from_dict(self._stamp(obj))
            old = self.devices.get(device.name)
            self.devices[device.name] = device
            self._emit(Change("Device", old, device))
            return device

    def delete_device(self, name: str) -> None:
        with self._lock:
            old = self.devices.pop(name, None)
            if old is not None:
                self._emit(Change("Device", old, None))

    def apply_pod(self, obj: Mapping[str, Any]) -> Pod:
        with self._lock:
            return self._store_pod(self._stamp(obj))

    def delete_pod(self, pod: str | Pod, *, preemptor: Pod | None = None) -> None:
        """Delete a pod by key, or exactly the incarnation ``pod`` (its UID as a precondition:
        another pod of that name now stays, as the API server's 409 leaves it). A deleted
        pod leaves no record here, so a preemption's mark (``preemptor``) would show nowhere."""
        with self._lock:
            key = pod if isinstance(pod, str) else pod.key
            current = self.pods.get(key)
            if current is None:
                return
            if not isinstance(pod, str) and current.uid != pod.uid:
                return
            del self.pods[key]
            self._emit(Change("Pod", current, None))

    def apply_pdb(self, obj: Mapping[str, Any]) -> PodDisruptionBudget:
        with self._lock:
            pdb = decode_pdb(self._stamp(obj))
            old = self.pdbs.get(pdb.key)
            self.pdbs[pdb.key] = pdb
            self._emit(Change(PDB_KIND, old, pdb))
            return pdb

    def delete_pdb(self, key: str) -> None:
        with self._lock:
            old = self.pdbs.pop(key, None)
            if old is not None:
                self._emit(Change(PDB_KIND, old, None))

    def apply_pod_group(self, obj: Mapping[str, Any]) -> PodGroup:
        with self._lock:
            group = decode_pod_group(self._stamp(obj))
            old = self.pod_groups.get(group.id)
            self.pod_groups[group.id] = group
            self._emit(Change(POD_GROUP_KIND, old, group))
            return group

    def delete_pod_group(self, key: str) -> None:
        with self._lock:
            old = self.pod_groups.pop(key, None)
            if old is not None:
                self._emit(Change(POD_GROUP_KIND, old, None))

    def apply_unhealthy_gpus(self, obj: Mapping[str, Any]) -> UnhealthyGPUs:
        """A ``kube-system/unhealthy-gpu-<node>`` ConfigMap (raises for any other object)."""
        with self._lock:
            marks = decode_unhealthy(self._stamp(obj))
            old = self.unhealthy_gpus.get(marks.node)
            self.unhealthy_gpus[marks.node] = marks
            self._emit(Change(UNHEALTHY_GPUS_KIND, old, marks))
            return marks

    def delete_unhealthy_gpus(self, node: str) -> None:
        with self._lock:
            old = self.unhealthy_gpus.pop(node, None)
            if old is not None:
                self._emit(Change(UNHEALTHY_GPUS_KIND, old, None))

    # -- internals --------------------------------------------------------------------------------

    def _stamp(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        raw = copy.deepcopy(dict(obj))
        self._rv += 1
        meta = raw.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        return raw

    def _store_pod(self, raw: dict[str, Any]) -> Pod:
        if "resourceVersion" not in raw.get("metadata", {}):
            raw = self._stamp(raw)
        else:
            self._rv += 1
            raw["metadata"]["resourceVersion"] = str(self._rv)
        pod = decode_pod(raw)
        old = self.pods.get(pod.key)
        self.pods[pod.key] = pod
        self._emit(Change("Pod", old, pod))
        return pod

    def _emit(self, change: Change) -> None:
        for handler in self._handlers:
            handler(change)
