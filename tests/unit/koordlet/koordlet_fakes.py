"""An in-memory ``koordlet.reporting.sync.NodeAPI``: a fake of our port for the sync and agent
tests.

It behaves like the API server where the agent cares: resourceVersions (a stale update is a
409), create of an existing object is a 409, merge patches with ``None`` deleting a key. Every
write is recorded in ``writes``; ``conflicts`` makes the next N updates lose a race against
another writer (who adds a label), ``stale_reads`` makes the next N device reads miss,
``errors`` makes a method raise.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis.device import Device
from koordlet.reporting.reporter import NodePods
from koordlet.reporting.sync import ApiError, ConflictError, NodeState, NotFoundError


@dataclass
class StoredNode:
    uid: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=lambda: {"cpu": "8", "pods": "110"})
    allocatable: dict[str, str] = field(default_factory=lambda: {"cpu": "8", "pods": "110"})


class FakeNodeAPI:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[str, StoredNode] = {}
        self.pods = NodePods()
        self.devices: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []
        self.conflicts = 0
        self.stale_reads = 0  # the next N get_device answer 404 (a lagging cache)
        self.errors: dict[str, ApiError] = {}
        self._rv = 0

    def add_node(self, name: str, uid: str = "node-uid") -> StoredNode:
        node = StoredNode(uid=uid)
        self.nodes[name] = node
        return node

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _raise(self, method: str) -> None:
        if method in self.errors:
            raise self.errors[method]

    def device(self, name: str) -> Device:
        return Device.from_dict(self.devices[name])

    # -- the port -------------------------------------------------------------------------------

    def get_node(self, name: str) -> NodeState:
        with self.lock:
            self._raise("get_node")
            node = self.nodes.get(name)
            if node is None:
                raise NotFoundError(404, f'nodes "{name}" not found')
            return NodeState(
                name=name,
                uid=node.uid,
                labels=dict(node.labels),
                capacity=dict(node.capacity),
                allocatable=dict(node.allocatable),
            )

    def list_node_pods(self, node_name: str) -> NodePods:
        with self.lock:
            self._raise("list_node_pods")
            return self.pods

    def get_device(self, name: str) -> Device:
        with self.lock:
            self._raise("get_device")
            if self.stale_reads > 0:
                self.stale_reads -= 1
                raise NotFoundError(404, f'devices "{name}" not found')
            if name not in self.devices:
                raise NotFoundError(404, f'devices "{name}" not found')
            return Device.from_dict(copy.deepcopy(self.devices[name]))

    def create_device(self, device: Device) -> Device:
        with self.lock:
            self._raise("create_device")
            if device.name in self.devices:
                raise ConflictError(409, f'devices "{device.name}" already exists')
            doc = device.to_dict()
            doc["metadata"].update(resourceVersion=self._next_rv(), uid=f"dev-{device.name}")
            self.devices[device.name] = doc
            self.writes.append("create_device")
            return Device.from_dict(copy.deepcopy(doc))

    def update_device(self, device: Device) -> Device:
        with self.lock:
            self._raise("update_device")
            stored = self.devices.get(device.name)
            if stored is None:
                raise NotFoundError(404, "gone")
            if self.conflicts > 0:  # another writer got there first
                self.conflicts -= 1
                stored["metadata"].setdefault("labels", {})["other-writer"] = str(self.conflicts)
                stored["metadata"]["resourceVersion"] = self._next_rv()
            if device.resource_version != stored["metadata"]["resourceVersion"]:
                raise ConflictError(409, "the object has been modified")
            doc = device.to_dict()
            doc["metadata"]["resourceVersion"] = self._next_rv()
            self.devices[device.name] = doc
            self.writes.append("update_device")
            return Device.from_dict(copy.deepcopy(doc))

    def patch_node_labels(self, name: str, labels: Mapping[str, str]) -> None:
        with self.lock:
            self._raise("patch_node_labels")
            self.nodes[name].labels.update(labels)
            self.writes.append("patch_node_labels")

    def patch_node_status(
        self,
        name: str,
        capacity: Mapping[str, str | None],
        allocatable: Mapping[str, str | None],
    ) -> None:
        with self.lock:
            self._raise("patch_node_status")
            node = self.nodes[name]
            for target, patch in ((node.capacity, capacity), (node.allocatable, allocatable)):
                for k, v in patch.items():
                    if v is None:
                        target.pop(k, None)
                    else:
                        target[k] = v
            self.writes.append("patch_node_status")
