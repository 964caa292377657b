"""PURE: inventory + kubelet checkpoint + pods -> the node's Device CR, extended resources, labels.

Role: everything the agent decides, with no I/O: which Device CR the node should have (SPEC
section 4), which devices-checkpoints entries it publishes (section 8), which totals the Node
advertises, which labels the Node and the Device carry, and what to write given what the API
server holds (``merge_device``, ``node_label_patch``, ``node_resource_patch``).

Invariants (Koordinator's ``koordlet/statesinformer/impl/states_device_linux.go``):

- ``spec.devices`` is sorted by type, then minor. A GPU has ``gpu-core: "100"``,
  ``gpu-memory``: its total memory as a BinarySI quantity, ``gpu-memory-ratio: "100"``; a
  topology ``{socketID: -1, nodeID, pcieID, busID}`` only when all three are known; one
  ``Healthy`` condition whose ``lastTransitionTime`` is kept from the previous CR while the
  status stays the same, and is ``now`` otherwise.
- Labels ``gpu-vendor`` (``nvidia``), ``gpu-model`` (only when every card has the same model)
  and ``gpu-driver-version`` are set when the node has GPUs.
- The ``devices-checkpoints`` annotation lists the checkpoint entries of GPU resources
  (``GPUResourceNames``: every resource the node's GPU device plugins serve, configurable) of
  pods the scheduler does not account otherwise (``NodePods.allocated``: a
  ``device-allocated`` annotation, or gpushare's ``ALIYUN_COM_GPU_MEM_IDX``/``_POD``); when
  the node's pods are known, entries of pods that are gone are dropped; when they are not
  known (``pods=None``), every GPU entry is kept. No entries, no annotation.
- The ``scheduling.koordinator.sh/gpu-topology`` annotation (``apis.topology``) carries the
  discovered GPU interconnect, encoded deterministically so an unchanged topology never
  causes a write; no known pair, no annotation.
- The ``scheduling.koordinator.sh/gpu-partitions`` annotation (``apis.partition``) is the
  table ``koordlet.reporting.partitions.derive_partitions`` derives from that interconnect (NVSwitch
  boxes, NVLink bridges and meshes); PCIe-only nodes get none. The partition policy label
  ``node.koordinator.sh/gpu-partition-policy`` is the operator's (never written here, kept by
  ``merge_device``).
- Node totals: per device type present on the node, the sum of its *healthy* devices'
  resources (100 x healthy GPUs for gpu-core and gpu-memory-ratio, their memory for
  gpu-memory; rdma and fpga likewise); a type without devices is not advertised.
- ``merge_device`` touches only what the agent owns (spec.devices, its labels and annotation,
  the Node owner reference) and returns None when nothing would change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, Final

from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.device import (
    ANNOTATION_DEVICES_CHECKPOINTS,
    CONDITION_HEALTHY,
    GPU_VENDOR_NVIDIA,
    LABEL_GPU_DRIVER_VERSION,
    LABEL_GPU_MODEL,
    LABEL_GPU_VENDOR,
    Condition,
    Device,
    DeviceInfo,
    DeviceTopology,
)
from apis.partition import ANNOTATION_GPU_PARTITIONS
from apis.quantity import BINARY_SI, DECIMAL_SI, Quantity, QuantityError
from apis.resources import (
    DEVICE_FPGA,
    DEVICE_GPU,
    DEVICE_RDMA,
    DEVICE_RESOURCE_NAMES,
    FPGA,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    RDMA,
)
from apis.topology import ANNOTATION_GPU_TOPOLOGY, GPUTopology
from koordlet.devices.library import GPU, HEALTHY, Health
from koordlet.devices.rdma import NIC, rdma_device_info
from koordlet.pods.record import PodRecord
from koordlet.reporting.partitions import derive_partitions

__all__ = [
    "DEFAULT_GPU_RESOURCES",
    "DEFAULT_GPU_RESOURCE_NAMES",
    "GPU_CHECKPOINT_RESOURCES",
    "MANAGED_NODE_RESOURCES",
    "OWNED_ANNOTATIONS",
    "OWNED_LABELS",
    "GPUResourceNames",
    "Inventory",
    "NodePods",
    "desired_device",
    "device_labels",
    "gpu_device_info",
    "merge_device",
    "node_extended_resources",
    "node_label_patch",
    "node_owner_reference",
    "node_resource_patch",
    "published_entries",
    "rfc3339",
]

GPU_CHECKPOINT_RESOURCES: Final = frozenset(DEVICE_RESOURCE_NAMES[DEVICE_GPU])
"""Koordinator's GPU resource names (``nvidia.com/gpu`` and ours)."""

DEFAULT_GPU_RESOURCE_NAMES: Final[tuple[str, ...]] = (
    *DEVICE_RESOURCE_NAMES[DEVICE_GPU],
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-*",
    "aliyun.com/gpu-mem",
)
"""The device-plugin resources whose devices are GPUs, by default: ours and ``nvidia.com/gpu``,
NVIDIA time-slicing with renamed resources (``nvidia.com/gpu.shared``), the MIG mixed strategy
(``nvidia.com/mig-<profile>``) and gpushare's plugin (``aliyun.com/gpu-mem``). ``*`` is a
wildcard (``fnmatch``)."""


@dataclass(frozen=True, slots=True)
class GPUResourceNames:
    """Which checkpoint resource names hold GPUs (exact names or ``fnmatch`` patterns)."""

    patterns: tuple[str, ...] = DEFAULT_GPU_RESOURCE_NAMES

    @classmethod
    def parse(cls, text: str) -> GPUResourceNames:
        """A comma list; raises ``ValueError`` when it names nothing."""
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        if not names:
            raise ValueError("no GPU resource name given")
        return cls(names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(fnmatchcase(name, p) for p in self.patterns)


DEFAULT_GPU_RESOURCES: Final = GPUResourceNames()

_TYPE_RESOURCES: Final[Mapping[str, tuple[str, ...]]] = {
    DEVICE_GPU: (GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO),
    DEVICE_RDMA: (RDMA,),
    DEVICE_FPGA: (FPGA,),
}
MANAGED_NODE_RESOURCES: Final = tuple(n for ns in _TYPE_RESOURCES.values() for n in ns)
OWNED_LABELS: Final = (LABEL_GPU_VENDOR, LABEL_GPU_MODEL, LABEL_GPU_DRIVER_VERSION)
OWNED_ANNOTATIONS: Final = (
    ANNOTATION_DEVICES_CHECKPOINTS,
    ANNOTATION_GPU_TOPOLOGY,
    ANNOTATION_GPU_PARTITIONS,
)
_BINARY_RESOURCES: Final = frozenset({GPU_MEMORY})
_STATUS_TRUE: Final = "True"
_STATUS_FALSE: Final = "False"


@dataclass(frozen=True, slots=True)
class Inventory:
    """The node's cards, their current health (uuid -> Health; absent = healthy) and how
    they are connected."""

    gpus: tuple[GPU, ...] = ()
    health: Mapping[str, Health] = field(default_factory=dict)
    driver_version: str = ""
    topology: GPUTopology = field(default_factory=GPUTopology)
    nics: tuple[NIC, ...] = ()
    """RDMA NICs and their SR-IOV VFs (``koordlet.devices.rdma``)."""

    def health_of(self, uuid: str) -> Health:
        return self.health.get(uuid, HEALTHY)


@dataclass(frozen=True, slots=True)
class NodePods:
    """The pods bound to the node: every uid, and those the scheduler accounts from their own
    annotations (``device-allocated``, or a gpushare placement ``ALIYUN_COM_GPU_MEM_IDX``/``_POD``,
    which it counts as that memory on that card: publishing them would count the whole card).

    ``records`` (uid -> ``PodRecord``) feeds the runtime hook's pod cache.
    """

    uids: frozenset[str] = frozenset()
    allocated: frozenset[str] = frozenset()
    records: Mapping[str, PodRecord] = field(default_factory=dict)


def rfc3339(t: datetime) -> str:
    """A ``metav1.Time`` string: UTC, whole seconds, ``Z``."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(health: Health, previous: DeviceInfo | None, now: str) -> Condition:
    status = _STATUS_TRUE if health.healthy else _STATUS_FALSE
    since = now
    if previous is not None:
        for old in previous.conditions:
            if old.type == CONDITION_HEALTHY and old.status == status and old.last_transition_time:
                since = old.last_transition_time
    return Condition(
        type=CONDITION_HEALTHY,
        status=status,
        reason=health.reason,
        message=health.message,
        last_transition_time=since,
    )


def gpu_device_info(gpu: GPU, health: Health, previous: DeviceInfo | None, now: str) -> DeviceInfo:
    """The CR entry of one GPU."""
    topology = None
    if gpu.numa_node is not None and gpu.pcie_root and gpu.bus_id:
        topology = DeviceTopology(
            socket_id=-1, node_id=gpu.numa_node, pcie_id=gpu.pcie_root, bus_id=gpu.bus_id
        )
    return DeviceInfo(
        type=DEVICE_GPU,
        id=gpu.uuid,
        minor=gpu.minor,
        health=health.healthy,
        resources={
            GPU_CORE: Quantity.of(100, DECIMAL_SI),
            GPU_MEMORY: Quantity.of(gpu.memory_total, BINARY_SI),
            GPU_MEMORY_RATIO: Quantity.of(100, DECIMAL_SI),
        },
        topology=topology,
        conditions=(_condition(health, previous, now),),
    )


def device_labels(inventory: Inventory) -> dict[str, str]:
    """Labels of the Device and the Node: vendor, model, driver version (none without GPUs)."""
    if not inventory.gpus:
        return {}
    labels = {LABEL_GPU_VENDOR: GPU_VENDOR_NVIDIA}
    models = {g.model for g in inventory.gpus}
    if len(models) == 1 and "" not in models:
        labels[LABEL_GPU_MODEL] = models.pop()
    if inventory.driver_version:
        labels[LABEL_GPU_DRIVER_VERSION] = inventory.driver_version
    return labels


def published_entries(
    entries: Iterable[PodDeviceEntry],
    pods: NodePods | None,
    gpu_resources: GPUResourceNames = DEFAULT_GPU_RESOURCES,
) -> list[PodDeviceEntry]:
    """The checkpoint entries the Device CR publishes (see the module docstring)."""
    out = []
    for e in entries:
        if e.resource_name not in gpu_resources or not e.device_ids:
            continue
        if pods is not None and (e.pod_uid not in pods.uids or e.pod_uid in pods.allocated):
            continue
        out.append(e)
    return out


def node_owner_reference(node_name: str, node_uid: str) -> dict[str, Any]:
    """The Device's owner reference to its Node (Koordinator sets controller and blocker)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _device_sort_key(d: DeviceInfo) -> tuple[str, int, str]:
    return (d.type, d.minor if d.minor is not None else -1, d.id)


def desired_device(
    node_name: str,
    inventory: Inventory,
    entries: Iterable[PodDeviceEntry] = (),
    pods: NodePods | None = None,
    *,
    previous: Device | None = None,
    now: str = "",
    node_uid: str = "",
    gpu_resources: GPUResourceNames = DEFAULT_GPU_RESOURCES,
) -> Device:
    """The Device CR the node should have; ``previous`` keeps condition transition times."""
    old = {d.id: d for d in previous.devices} if previous is not None else {}
    devices = sorted(
        (
            gpu_device_info(g, inventory.health_of(g.uuid), old.get(g.uuid), now)
            for g in inventory.gpus
        ),
        key=_device_sort_key,
    ) + sorted((rdma_device_info(n) for n in inventory.nics), key=_device_sort_key)
    published = published_entries(entries, pods, gpu_resources)
    annotations = (
        {ANNOTATION_DEVICES_CHECKPOINTS: encode_devices_checkpoints(published)} if published else {}
    )
    if inventory.topology:
        annotations[ANNOTATION_GPU_TOPOLOGY] = inventory.topology.encode()
        table = derive_partitions(inventory.topology, (g.minor for g in inventory.gpus))
        if table:
            annotations[ANNOTATION_GPU_PARTITIONS] = table.encode()
    owners = (node_owner_reference(node_name, node_uid),) if node_uid else ()
    return Device(
        name=node_name,
        devices=tuple(devices),
        labels=device_labels(inventory),
        annotations=annotations,
        owner_references=owners,
    )


def merge_device(current: Device, desired: Device) -> Device | None:
    """``current`` with the agent's parts replaced by ``desired``'s; None when unchanged."""
    labels = {k: v for k, v in current.labels.items() if k not in OWNED_LABELS}
    labels.update(desired.labels)
    annotations = {k: v for k, v in current.annotations.items() if k not in OWNED_ANNOTATIONS}
    annotations.update(desired.annotations)
    owners = tuple(current.owner_references)
    have = {_ref_key(r) for r in owners}
    if any(_ref_key(r) not in have for r in desired.owner_references):
        owners = tuple(r for r in owners if r.get("kind") != "Node") + tuple(
            desired.owner_references
        )
    merged = dataclasses.replace(
        current,
        devices=desired.devices,
        labels=labels,
        annotations=annotations,
        owner_references=owners,
    )
    return None if merged.to_dict() == current.to_dict() else merged


def _ref_key(ref: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(ref.get("apiVersion", "")),
        str(ref.get("kind", "")),
        str(ref.get("name", "")),
        str(ref.get("uid", "")),
    )


def node_extended_resources(device: Device) -> dict[str, Quantity]:
    """The Node's extended-resource totals implied by a Device CR (healthy devices only)."""
    out: dict[str, Quantity] = {}
    for device_type, names in _TYPE_RESOURCES.items():
        of_type = device.devices_of_type(device_type)
        if not of_type:
            continue
        for name in names:
            total = sum(d.resource_value(name) for d in of_type if d.health)
            out[name] = Quantity.of(total, BINARY_SI if name in _BINARY_RESOURCES else DECIMAL_SI)
    return out


def node_label_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str]:
    """The labels to set on the Node (a merge patch of ``metadata.labels``); {} = none."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _same_quantity(have: str | None, want: Quantity) -> bool:
    if have is None:
        return False
    try:
        return Quantity.parse(have.strip()) == want
    except QuantityError:
        return False


def _resource_patch(
    current: Mapping[str, str], desired: Mapping[str, Quantity]
) -> dict[str, str | None]:
    patch: dict[str, str | None] = {}
    for name in MANAGED_NODE_RESOURCES:
        want = desired.get(name)
        have = current.get(name)
        if want is None:
            if have is not None:
                patch[name] = None
        elif not _same_quantity(have, want):
            patch[name] = want.canonical()
    return patch


def node_resource_patch(
    capacity: Mapping[str, str],
    allocatable: Mapping[str, str],
    desired: Mapping[str, Quantity],
) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """What to merge-patch into ``status.capacity`` and ``status.allocatable`` (None deletes).

    Only the resources the agent manages are ever touched; ({}, {}) means nothing to write.
    """
    return _resource_patch(capacity, desired), _resource_patch(allocatable, desired)
