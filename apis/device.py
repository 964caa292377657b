"""The Device custom resource (``scheduling.koordinator.sh/v1alpha1``, SPEC section 4).

Role: decode a Device CR (a JSON-shaped mapping from the API server or a YAML file) once into
frozen records, and encode it back; plus the label/annotation names the node agent writes on
the Device and the Node.

Invariants:

- Decoding follows Koordinator's Go types (``apis/scheduling/v1alpha1/device_types.go``):
  ``null`` means "absent", integers must be JSON integers within int32, quantities are parsed
  with Kubernetes' rules (strings, or bare numbers, surrounding blanks trimmed).
- Every decode error is a ``DeviceDecodeError`` whose message starts with the field path, e.g.
  ``spec.devices[2].resources["koordinator.sh/gpu-memory"]: invalid quantity "12Zi"``.
- Round trip: ``Device.from_dict(d.to_dict()) == d``; ``to_dict`` of a decoded CR keeps every
  field the CR had: modelled fields are re-emitted the way Go's ``json.Marshal`` would
  (``omitempty`` honoured, quantities canonical), unknown fields are carried in ``extra``
  mappings at each level and written back untouched.
- Records are immutable; the mappings they hold are the decoder's own copies and must be
  treated as read-only.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apis.jsonshow import MAX_KEPT_DEPTH, too_deep
from apis.partition import ANNOTATION_GPU_PARTITIONS, PartitionTable, partition_policy
from apis.quantity import Quantity, QuantityError, int_value
from apis.topology import ANNOTATION_GPU_TOPOLOGY, GPUTopology
from apis.topology import json_kind as _kind

__all__ = [
    "ANNOTATION_DEVICES_CHECKPOINTS",
    "ANNOTATION_GPU_TOPOLOGY",
    "API_VERSION",
    "CONDITION_HEALTHY",
    "GPU_ISOLATION_PROVIDER_HAMI_CORE",
    "GPU_VENDOR_NVIDIA",
    "GROUP",
    "KIND",
    "LABEL_GPU_DRIVER_VERSION",
    "LABEL_GPU_ISOLATION_PROVIDER",
    "LABEL_GPU_MODEL",
    "LABEL_GPU_VENDOR",
    "LABEL_SKIP_HOOKSERVER",
    "PLURAL",
    "VERSION",
    "Condition",
    "Device",
    "DeviceDecodeError",
    "DeviceInfo",
    "DeviceTopology",
    "VirtualFunction",
    "VirtualFunctionGroup",
    "gpu_model_name",
]

GROUP: Final = "scheduling.koordinator.sh"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "Device"
PLURAL: Final = "devices"

LABEL_GPU_VENDOR: Final = "node.koordinator.sh/gpu-vendor"
LABEL_GPU_MODEL: Final = "node.koordinator.sh/gpu-model"
LABEL_GPU_DRIVER_VERSION: Final = "node.koordinator.sh/gpu-driver-version"
ANNOTATION_DEVICES_CHECKPOINTS: Final = "node.koordinator.sh/devices-checkpoints"
GPU_VENDOR_NVIDIA: Final = "nvidia"
LABEL_GPU_ISOLATION_PROVIDER: Final = "koordinator.sh/gpu-isolation-provider"
LABEL_SKIP_HOOKSERVER: Final = "runtimeproxy.koordinator.sh/skip-hookserver"
"""koord-runtime-proxy's default ``--runtime-hook-server-key``: a pod labelled ``"true"`` is
never sent to a hook server, so none of koordlet's hooks (the GPU hook included) sees it."""
GPU_ISOLATION_PROVIDER_HAMI_CORE: Final = "HAMi-core"
CONDITION_HEALTHY: Final = "Healthy"

_INT32: Final = (-(2**31), 2**31 - 1)


def gpu_model_name(nvml_name: str) -> str:
    """Node label value of a GPU model: NVML name without ``NVIDIA ``, spaces -> ``-``."""
    return nvml_name.removeprefix("NVIDIA ").replace(" ", "-")


class DeviceDecodeError(ValueError):
    """A Device CR that cannot be decoded; the message is ``<field path>: <reason>``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


# -- small typed readers (each raises DeviceDecodeError naming the path) ------------------------


def _obj(v: object, path: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise DeviceDecodeError(path, f"expected an object, got {_kind(v)}")
    return v


def _opt_obj(v: object, path: str) -> Mapping[str, Any]:
    return {} if v is None else _obj(v, path)


def _list(v: object, path: str) -> Sequence[Any]:
    if v is None:
        return ()
    if isinstance(v, str | bytes) or not isinstance(v, Sequence):
        raise DeviceDecodeError(path, f"expected an array, got {_kind(v)}")
    return v


def _str(v: object, path: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DeviceDecodeError(path, f"expected a string, got {_kind(v)}")
    return v


def _bool(v: object, path: str) -> bool:
    if v is None:
        return False
    if not isinstance(v, bool):
        raise DeviceDecodeError(path, f"expected a boolean, got {_kind(v)}")
    return v


def _int32(v: object, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise DeviceDecodeError(path, f"expected an integer, got {_kind(v)}")
    if not _INT32[0] <= v <= _INT32[1]:
        raise DeviceDecodeError(path, f"integer {v} out of int32 range")
    return v


def _opt_int32(v: object, path: str) -> int | None:
    return None if v is None else _int32(v, path)


def _str_map(v: object, path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, val in _opt_obj(v, path).items():
        if not isinstance(val, str):
            raise DeviceDecodeError(
                f"{path}[{json.dumps(k)}]", f"expected a string, got {_kind(val)}"
            )
        out[k] = val
    return out


_QUANTITIES: dict[str, Quantity] = {}
"""Quantity text -> its parsed (immutable) ``Quantity``: a cluster's Device CRs repeat a few
texts ("100", "80Gi") and the parse was about half of a CR's decode (0.28 s of CPU per 1,000
eight-GPU CRs at start-up). Only valid texts are kept; cleared when it reaches
``_QUANTITIES_MAX``."""
_QUANTITIES_MAX = 4096


def _quantity(v: object, path: str) -> Quantity:
    if type(v) is str:
        cached = _QUANTITIES.get(v)
        if cached is not None:
            return cached
    try:
        if isinstance(v, str):
            parsed = Quantity.parse(v.strip())
            if len(_QUANTITIES) >= _QUANTITIES_MAX:
                _QUANTITIES.clear()
            _QUANTITIES[v] = parsed
            return parsed
        if isinstance(v, int | float) and not isinstance(v, bool):
            return Quantity.parse(v)
    except QuantityError as err:
        raise DeviceDecodeError(path, str(err)) from None
    raise DeviceDecodeError(path, f"expected a quantity, got {_kind(v)}")


def _extra(obj: Mapping[str, Any], known: frozenset[str], path: str) -> dict[str, Any]:
    """The fields not read, kept (copied) to be written back; one nested past
    ``MAX_KEPT_DEPTH`` is refused (copying or dumping it would recurse past the limit)."""
    for k, v in obj.items():
        if k not in known and too_deep(v):
            where = f"{path}.{k}" if path else k
            raise DeviceDecodeError(where, f"nested deeper than {MAX_KEPT_DEPTH} levels")
    return {k: copy.deepcopy(v) for k, v in obj.items() if k not in known}


def _put(out: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        out.setdefault(k, copy.deepcopy(v))
    return out


# -- records --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceTopology:
    """Where a device sits: CPU socket, NUMA node, PCIe switch, PCI bus address."""

    socket_id: int = 0
    node_id: int = 0
    pcie_id: str = ""
    bus_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset({"socketID", "nodeID", "pcieID", "busID"})

    @classmethod
    def from_dict(cls, obj: object, path: str = "topology") -> DeviceTopology:
        o = _obj(obj, path)
        return cls(
            socket_id=_opt_int32(o.get("socketID"), f"{path}.socketID") or 0,
            node_id=_opt_int32(o.get("nodeID"), f"{path}.nodeID") or 0,
            pcie_id=_str(o.get("pcieID"), f"{path}.pcieID"),
            bus_id=_str(o.get("busID"), f"{path}.busID"),
            extra=_extra(o, cls._KNOWN, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "socketID": self.socket_id,
            "nodeID": self.node_id,
            "pcieID": self.pcie_id,
        }
        if self.bus_id:
            out["busID"] = self.bus_id
        return _put(out, self.extra)


@dataclass(frozen=True, slots=True)
class VirtualFunction:
    """One SR-IOV virtual function of an RDMA device."""

    minor: int = 0
    bus_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset({"minor", "busID"})

    @classmethod
    def from_dict(cls, obj: object, path: str) -> VirtualFunction:
        o = _obj(obj, path)
        return cls(
            minor=_opt_int32(o.get("minor"), f"{path}.minor") or 0,
            bus_id=_str(o.get("busID"), f"{path}.busID"),
            extra=_extra(o, cls._KNOWN, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minor": self.minor}
        if self.bus_id:
            out["busID"] = self.bus_id
        return _put(out, self.extra)


@dataclass(frozen=True, slots=True)
class VirtualFunctionGroup:
    """A labelled group of virtual functions."""

    labels: Mapping[str, str] = field(default_factory=dict)
    vfs: tuple[VirtualFunction, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset({"labels", "vfs"})

    @classmethod
    def from_dict(cls, obj: object, path: str) -> VirtualFunctionGroup:
        o = _obj(obj, path)
        vfs = _list(o.get("vfs"), f"{path}.vfs")
        return cls(
            labels=_str_map(o.get("labels"), f"{path}.labels"),
            vfs=tuple(VirtualFunction.from_dict(v, f"{path}.vfs[{i}]") for i, v in enumerate(vfs)),
            extra=_extra(o, cls._KNOWN, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.vfs:
            out["vfs"] = [vf.to_dict() for vf in self.vfs]
        return _put(out, self.extra)


@dataclass(frozen=True, slots=True)
class Condition:
    """A ``metav1.Condition`` (the node agent writes a ``Healthy`` one per device)."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset(
        {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
    )

    @classmethod
    def from_dict(cls, obj: object, path: str) -> Condition:
        o = _obj(obj, path)
        generation = o.get("observedGeneration")
        if generation is not None and (
            isinstance(generation, bool) or not isinstance(generation, int)
        ):
            raise DeviceDecodeError(
                f"{path}.observedGeneration", f"expected an integer, got {_kind(generation)}"
            )
        return cls(
            type=_str(o.get("type"), f"{path}.type"),
            status=_str(o.get("status"), f"{path}.status"),
            reason=_str(o.get("reason"), f"{path}.reason"),
            message=_str(o.get("message"), f"{path}.message"),
            last_transition_time=_str(o.get("lastTransitionTime"), f"{path}.lastTransitionTime"),
            observed_generation=generation,
            extra=_extra(o, cls._KNOWN, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status}
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        if self.last_transition_time:
            out["lastTransitionTime"] = self.last_transition_time
        out["reason"] = self.reason
        out["message"] = self.message
        return _put(out, self.extra)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device of a node: a GPU card, an RDMA NIC or an FPGA."""

    type: str
    id: str = ""
    minor: int | None = None
    health: bool = False
    resources: Mapping[str, Quantity] = field(default_factory=dict)
    topology: DeviceTopology | None = None
    module_id: int | None = None
    vf_groups: tuple[VirtualFunctionGroup, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset(
        {"type", "labels", "id", "minor", "moduleID", "health", "resources", "topology"}
        | {"vfGroups", "conditions"}
    )

    def resource_value(self, name: str) -> int:
        """The named resource as an integer (``Value()`` semantics), 0 when absent."""
        q = self.resources.get(name)
        return 0 if q is None else int_value(q)

    @classmethod
    def from_dict(cls, obj: object, path: str = "device") -> DeviceInfo:
        o = _obj(obj, path)
        resources = {
            name: _quantity(v, f"{path}.resources[{json.dumps(name)}]")
            for name, v in _opt_obj(o.get("resources"), f"{path}.resources").items()
        }
        topology = o.get("topology")
        groups = _list(o.get("vfGroups"), f"{path}.vfGroups")
        conditions = _list(o.get("conditions"), f"{path}.conditions")
        return cls(
            type=_str(o.get("type"), f"{path}.type"),
            id=_str(o.get("id"), f"{path}.id"),
            minor=_opt_int32(o.get("minor"), f"{path}.minor"),
            health=_bool(o.get("health"), f"{path}.health"),
            resources=resources,
            topology=None
            if topology is None
            else DeviceTopology.from_dict(topology, f"{path}.topology"),
            module_id=_opt_int32(o.get("moduleID"), f"{path}.moduleID"),
            vf_groups=tuple(
                VirtualFunctionGroup.from_dict(g, f"{path}.vfGroups[{i}]")
                for i, g in enumerate(groups)
            ),
            labels=_str_map(o.get("labels"), f"{path}.labels"),
            conditions=tuple(
                Condition.from_dict(c, f"{path}.conditions[{i}]") for i, c in enumerate(conditions)
            ),
            extra=_extra(o, cls._KNOWN, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.type:
            out["type"] = self.type
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.id:
            out["id"] = self.id
        if self.minor is not None:
            out["minor"] = self.minor
        if self.module_id is not None:
            out["moduleID"] = self.module_id
        out["health"] = self.health
        if self.resources:
            out["resources"] = {k: self.resources[k].canonical() for k in sorted(self.resources)}
        if self.topology is not None:
            out["topology"] = self.topology.to_dict()
        if self.vf_groups:
            out["vfGroups"] = [g.to_dict() for g in self.vf_groups]
        if self.conditions:
            out["conditions"] = [c.to_dict() for c in self.conditions]
        return _put(out, self.extra)


@dataclass(frozen=True, slots=True)
class Device:
    """A node's device inventory; ``name`` is the node's name (the CR is cluster-scoped)."""

    name: str
    devices: tuple[DeviceInfo, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    uid: str = ""
    owner_references: tuple[Mapping[str, Any], ...] = ()
    status: Mapping[str, Any] | None = None
    api_version: str = API_VERSION
    kind: str = KIND
    metadata_extra: Mapping[str, Any] = field(default_factory=dict)
    spec_extra: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
    _KNOWN_META = frozenset(
        {"name", "labels", "annotations", "resourceVersion", "uid", "ownerReferences"}
    )
    _KNOWN_SPEC = frozenset({"devices"})

    def devices_of_type(self, device_type: str) -> tuple[DeviceInfo, ...]:
        """The devices of one type (``gpu``, ``rdma``, ``fpga``), in CR order."""
        return tuple(d for d in self.devices if d.type == device_type)

    def gpu_topology(self) -> GPUTopology:
        """The node's GPU interconnect (annotation ``scheduling.koordinator.sh/gpu-topology``,
        ``apis.topology``); empty when absent. Raises ``TopologyDecodeError`` when malformed."""
        text = self.annotations.get(ANNOTATION_GPU_TOPOLOGY)
        return GPUTopology() if text is None else GPUTopology.decode(text)

    def gpu_partitions(self) -> PartitionTable | None:
        """The node's GPU partition table (annotation ``scheduling.koordinator.sh/gpu-partitions``,
        ``apis.partition``); None when absent or empty. Raises ``PartitionDecodeError`` when
        malformed."""
        text = self.annotations.get(ANNOTATION_GPU_PARTITIONS)
        return None if not text else PartitionTable.decode(text)

    @property
    def gpu_partition_policy(self) -> str:
        """``Honor`` or ``Prefer`` (label ``node.koordinator.sh/gpu-partition-policy``)."""
        return partition_policy(self.labels)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Device:
        """Decode a Device CR; raises ``DeviceDecodeError`` naming the offending field."""
        o = _obj(obj, "<root>")
        kind = _str(o.get("kind"), "kind") or KIND
        if kind != KIND:
            raise DeviceDecodeError("kind", f"expected {json.dumps(KIND)}, got {json.dumps(kind)}")
        api_version = _str(o.get("apiVersion"), "apiVersion") or API_VERSION
        meta = _opt_obj(o.get("metadata"), "metadata")
        name = _str(meta.get("name"), "metadata.name")
        if not name:
            raise DeviceDecodeError("metadata.name", "required")
        owners = _list(meta.get("ownerReferences"), "metadata.ownerReferences")
        spec = _opt_obj(o.get("spec"), "spec")
        devices = _list(spec.get("devices"), "spec.devices")
        status = o.get("status")
        return cls(
            name=name,
            devices=tuple(
                DeviceInfo.from_dict(d, f"spec.devices[{i}]") for i, d in enumerate(devices)
            ),
            labels=_str_map(meta.get("labels"), "metadata.labels"),
            annotations=_str_map(meta.get("annotations"), "metadata.annotations"),
            resource_version=_str(meta.get("resourceVersion"), "metadata.resourceVersion"),
            uid=_str(meta.get("uid"), "metadata.uid"),
            owner_references=tuple(
                copy.deepcopy(dict(_obj(r, f"metadata.ownerReferences[{i}]")))
                for i, r in enumerate(owners)
            ),
            status=None if status is None else copy.deepcopy(dict(_obj(status, "status"))),
            api_version=api_version,
            kind=kind,
            metadata_extra=_extra(meta, cls._KNOWN_META, "metadata"),
            spec_extra=_extra(spec, cls._KNOWN_SPEC, "spec"),
            extra=_extra(o, cls._KNOWN, ""),
        )

    def to_dict(self) -> dict[str, Any]:
        """Encode as a JSON-shaped dict (fresh objects; safe to mutate)."""
        meta: dict[str, Any] = {"name": self.name}
        if self.uid:
            meta["uid"] = self.uid
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if self.owner_references:
            meta["ownerReferences"] = [copy.deepcopy(dict(r)) for r in self.owner_references]
        spec: dict[str, Any] = {}
        if self.devices:
            spec["devices"] = [d.to_dict() for d in self.devices]
        out: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": _put(meta, self.metadata_extra),
            "spec": _put(spec, self.spec_extra),
        }
        if self.status is not None:
            out["status"] = copy.deepcopy(dict(self.status))
        return _put(out, self.extra)
