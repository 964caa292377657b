"""The kubelet device-plugin checkpoint and the ``devices-checkpoints`` annotation (SPEC §8).

Role: read ``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`` (its text; the file
I/O belongs to the node agent) into typed entries, and encode/decode the Device CR annotation
``node.koordinator.sh/devices-checkpoints`` through which the node agent publishes devices held
by pods that koord-scheduler did not place.

Invariants:

- Both checkpoint shapes parse: ``DeviceIDs`` as a NUMA-keyed map (kubelet >= 1.20; keys are
  int64 strings, ``"-1"`` = no topology) and as a plain list (kubelet <= 1.19).  A device
  listed under several NUMA nodes appears once, at its first position in document order.
- The checksum is Go-specific and treated as opaque (kept, never verified).
- Corrupt, truncated or mistyped input raises ``CheckpointError`` naming the field.
- ``encode_devices_checkpoints`` is deterministic: entries sorted by (podUID, containerName,
  resourceName, then deviceIDs to break ties), fields in the order podUID, containerName,
  resourceName, deviceIDs, Go-style compact JSON; decoding the encoding gives the sorted
  entries back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apis.allocation import (
    GoJSONError,
    JSONObject,
    go_json_dumps,
    go_json_loads,
    read_int,
    read_list,
    read_object,
    read_string,
)
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS

__all__ = [
    "ANNOTATION_DEVICES_CHECKPOINTS",
    "CheckpointError",
    "KubeletCheckpoint",
    "PodDeviceEntry",
    "decode_devices_checkpoints",
    "encode_devices_checkpoints",
    "parse_kubelet_checkpoint",
]

_NUMA_KEY: Final = re.compile(r"[+-]?[0-9]{1,19}")


class CheckpointError(ValueError):
    """A kubelet checkpoint or devices-checkpoints annotation that cannot be decoded."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class PodDeviceEntry:
    """Devices of one resource that the kubelet gave to one container."""

    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: tuple[str, ...] = ()

    def sort_key(self) -> tuple[str, str, str, tuple[str, ...]]:
        """Annotation order: podUID, containerName, resourceName (deviceIDs break ties)."""
        return (self.pod_uid, self.container_name, self.resource_name, self.device_ids)


@dataclass(frozen=True, slots=True)
class KubeletCheckpoint:
    """The decoded checkpoint file."""

    entries: tuple[PodDeviceEntry, ...] = ()
    registered_devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    checksum: int | None = None


def _strings(v: object, path: str) -> list[str]:
    return [read_string(x, f"{path}[{i}]") for i, x in enumerate(read_list(v, path))]


def _device_ids(v: object, path: str) -> tuple[str, ...]:
    """Both shapes of ``DeviceIDs``, deduplicated in first-seen order."""
    if isinstance(v, JSONObject):
        ids: list[str] = []
        for numa, devices in v.as_map().items():
            if not _NUMA_KEY.fullmatch(numa) or not -(2**63) <= int(numa) < 2**63:
                raise GoJSONError(path, f"NUMA node key {numa!r} is not an int64")
            ids.extend(_strings(devices, f"{path}[{numa!r}]"))
    else:
        ids = _strings(v, path)
    return tuple(dict.fromkeys(ids))


def _entry(v: object, path: str) -> PodDeviceEntry:
    obj = read_object(v, path)
    if obj is None:
        raise GoJSONError(path, "expected an object, got null")
    f = obj.fields(("PodUID", "ContainerName", "ResourceName", "DeviceIDs"))
    return PodDeviceEntry(
        pod_uid=read_string(f.get("PodUID"), f"{path}.PodUID"),
        container_name=read_string(f.get("ContainerName"), f"{path}.ContainerName"),
        resource_name=read_string(f.get("ResourceName"), f"{path}.ResourceName"),
        device_ids=_device_ids(f.get("DeviceIDs"), f"{path}.DeviceIDs"),
    )


def parse_kubelet_checkpoint(data: str | bytes) -> KubeletCheckpoint:
    """Decode the kubelet's ``kubelet_internal_checkpoint``; raises ``CheckpointError``."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    try:
        top = read_object(go_json_loads(text), "")
        if top is None:
            raise GoJSONError("", "empty checkpoint (null)")
        f = top.fields(("Data", "Checksum"))
        inner = read_object(f.get("Data"), "Data")
        g: dict[str, Any] = (
            inner.fields(("PodDeviceEntries", "RegisteredDevices")) if inner is not None else {}
        )
        raw_entries = read_list(g.get("PodDeviceEntries"), "Data.PodDeviceEntries")
        registered = read_object(g.get("RegisteredDevices"), "Data.RegisteredDevices")
        checksum = read_int(f.get("Checksum"), "Checksum", bits=65)
        if checksum is not None and checksum < 0:
            raise GoJSONError("Checksum", f"expected an unsigned integer, got {checksum}")
        return KubeletCheckpoint(
            entries=tuple(
                _entry(e, f"Data.PodDeviceEntries[{i}]") for i, e in enumerate(raw_entries)
            ),
            registered_devices={
                name: tuple(_strings(ids, f"Data.RegisteredDevices[{name!r}]"))
                for name, ids in (registered.as_map().items() if registered is not None else ())
            },
            checksum=checksum,
        )
    except GoJSONError as err:
        raise CheckpointError(f"invalid kubelet device checkpoint: {err}") from None


def encode_devices_checkpoints(entries: Iterable[PodDeviceEntry]) -> str:
    """The ``devices-checkpoints`` annotation value (deterministic, compact)."""
    ordered = sorted(entries, key=PodDeviceEntry.sort_key)
    return go_json_dumps(
        [
            JSONObject(
                (
                    ("podUID", e.pod_uid),
                    ("containerName", e.container_name),
                    ("resourceName", e.resource_name),
                    ("deviceIDs", list(e.device_ids)),
                )
            )
            for e in ordered
        ]
    )


def decode_devices_checkpoints(s: str) -> list[PodDeviceEntry]:
    """Parse the ``devices-checkpoints`` annotation; raises ``CheckpointError``."""
    try:
        out: list[PodDeviceEntry] = []
        for i, v in enumerate(read_list(go_json_loads(s), "")):
            path = f"[{i}]"
            obj = read_object(v, path)
            if obj is None:
                raise GoJSONError(path, "expected an object, got null")
            f = obj.fields(("podUID", "containerName", "resourceName", "deviceIDs"))
            out.append(
                PodDeviceEntry(
                    pod_uid=read_string(f.get("podUID"), f"{path}.podUID"),
                    container_name=read_string(f.get("containerName"), f"{path}.containerName"),
                    resource_name=read_string(f.get("resourceName"), f"{path}.resourceName"),
                    device_ids=tuple(_strings(f.get("deviceIDs"), f"{path}.deviceIDs")),
                )
            )
    except GoJSONError as err:
        raise CheckpointError(
            f"invalid {ANNOTATION_DEVICES_CHECKPOINTS} annotation: {err}"
        ) from None
    return out
