"""The kubelet device-plugin checkpoint and the ``devices-checkpoints`` annotation (SPEC §8).

Role: read ``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`` (its text; the file
I/O belongs to the node agent) into typed entries, and encode/decode the Device CR annotation
``node.koordinator.sh/devices-checkpoints`` through which the node agent publishes devices held
by pods that koord-scheduler did not place.

Invariants:

- Both checkpoint shapes parse: ``DeviceIDs`` as a NUMA-keyed map (kubelet >= 1.20; keys are
  int64 strings, ``"-1"`` = no topology) and as a plain list (kubelet <= 1.19).  A device
  listed under several NUMA nodes appears once, at its first position in document order.
- The checksum is verified as the kubelet verifies it (``checkpointmanager/checksum``: FNV-32a
  over ``hashutil.DeepHashObject`` of ``Data``, i.e. go-spew's ``%#v`` with sorted map keys and
  methods disabled), for both shapes: ``kubelet_checksum_ok`` is true when ``Checksum``
  matches the data in the shape the file uses (NUMA-keyed: the 1.20+ types; a plain list: the
  1.19 types). The rendering is ``spew_checkpoint_data``; its format was taken from Kubernetes
  v1.20.2's own types and vendored go-spew (golden files in ``tests/unit/apis/fixtures``).
- Corrupt, truncated or mistyped input raises ``CheckpointError`` naming the field.
- ``encode_devices_checkpoints`` is deterministic: entries sorted by (podUID, containerName,
  resourceName, then deviceIDs to break ties), fields in the order podUID, containerName,
  resourceName, deviceIDs, Go-style compact JSON; decoding the encoding gives the sorted
  entries back.
"""

from __future__ import annotations

import base64
import binascii
import json
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
    "fnv32a",
    "kubelet_checkpoint_json",
    "kubelet_checksum",
    "parse_kubelet_checkpoint",
    "spew_checkpoint_data",
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
    checksum_ok: bool = field(default=True, compare=False)
    """``checksum`` is the kubelet's checksum of the data (a file without one is not ok)."""
    expected_checksum: int | None = field(default=None, compare=False)
    """What the data hashes to, in the file's shape (None: the shape cannot be hashed)."""


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


def fnv32a(data: bytes) -> int:
    """Go's ``hash/fnv`` New32a sum."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


_NUMA_FORM: Final = "numa"
_LIST_FORM: Final = "list"


def _spew_strings(v: object) -> str:
    # []string: nil -> <nil>; elements raw (spew writes strings unquoted), space separated
    if v is None:
        return "<nil>"
    return "[" + " ".join(read_string(x, "") for x in read_list(v, "")) + "]"


def _spew_bytes(v: object, path: str) -> str:
    # []byte from JSON: null -> nil; a base64 string (Go's StdEncoding, \r and \n ignored)
    if v is None:
        return "<nil>"
    raw = read_string(v, path)
    try:
        decoded = base64.b64decode(raw.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise GoJSONError(path, "not base64") from None
    return "[" + " ".join(str(b) for b in decoded) + "]"


def _spew_device_ids(v: object, form: str, path: str) -> str:
    if form == _LIST_FORM:
        if isinstance(v, JSONObject):
            raise GoJSONError(path, "a NUMA-keyed map in a list-shaped checkpoint")
        return "([]string)" + _spew_strings(v)
    if v is None:
        return "(checkpoint.DevicesPerNUMA)<nil>"
    if not isinstance(v, JSONObject):
        raise GoJSONError(path, "a list in a NUMA-keyed checkpoint")
    numa: dict[int, object] = {}
    for key, ids in v.pairs:  # Go parses each key as int64; a later duplicate wins
        if not _NUMA_KEY.fullmatch(key):
            raise GoJSONError(path, f"NUMA node key {key!r} is not an int64")
        numa[int(key)] = ids
    items = " ".join(f"{k}:{_spew_strings(numa[k])}" for k in sorted(numa))
    return f"(checkpoint.DevicesPerNUMA)map[{items}]"


def _spew_entry(v: object, form: str, path: str) -> str:
    obj = read_object(v, path)
    f = (
        obj.fields(("PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp"))
        if obj
        else {}
    )
    return (
        f"{{PodUID:(string){read_string(f.get('PodUID'), path)}"
        f" ContainerName:(string){read_string(f.get('ContainerName'), path)}"
        f" ResourceName:(string){read_string(f.get('ResourceName'), path)}"
        f" DeviceIDs:{_spew_device_ids(f.get('DeviceIDs'), form, path)}"
        f" AllocResp:([]uint8){_spew_bytes(f.get('AllocResp'), path)}}}"
    )


def spew_checkpoint_data(data: object, form: str = _NUMA_FORM) -> str:
    """go-spew's ``%#v`` of the kubelet's ``checkpointData`` decoded from the JSON value of
    ``Data`` (``form``: ``"numa"``, kubelet >= 1.20 types, or ``"list"``, kubelet <= 1.19);
    raises ``GoJSONError`` when the value does not decode into that form."""
    obj = read_object(data, "Data")
    g = obj.fields(("PodDeviceEntries", "RegisteredDevices")) if obj is not None else {}
    raw_entries = g.get("PodDeviceEntries")
    if raw_entries is None:
        entries = "<nil>"
    else:
        entries = (
            "["
            + " ".join(
                _spew_entry(e, form, f"Data.PodDeviceEntries[{i}]")
                for i, e in enumerate(read_list(raw_entries, "Data.PodDeviceEntries"))
            )
            + "]"
        )
    registered = read_object(g.get("RegisteredDevices"), "Data.RegisteredDevices")
    if registered is None:
        devices = "<nil>"
    else:
        by_name = registered.as_map()
        devices = (
            "map[" + " ".join(f"{k}:{_spew_strings(by_name[k])}" for k in sorted(by_name)) + "]"
        )
    return (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
        f"{entries} RegisteredDevices:(map[string][]string){devices}}}"
    )


def _form_of(data: object) -> tuple[str, ...]:
    """The shapes the file's ``Data`` may have been written in (both when nothing says)."""
    obj = read_object(data, "Data")
    g = obj.fields(("PodDeviceEntries",)) if obj is not None else {}
    for e in read_list(g.get("PodDeviceEntries"), "Data.PodDeviceEntries"):
        entry = read_object(e, "Data.PodDeviceEntries[]")
        ids = entry.fields(("DeviceIDs",)).get("DeviceIDs") if entry is not None else None
        if isinstance(ids, JSONObject):
            return (_NUMA_FORM,)
        if isinstance(ids, list):
            return (_LIST_FORM,)
    return (_NUMA_FORM, _LIST_FORM)


def kubelet_checksum(data: object, form: str | None = None) -> int:
    """The kubelet's checksum of a checkpoint's ``Data`` (its decoded JSON value), in
    ``form`` (default: the shape the data has; NUMA-keyed when nothing says)."""
    text = spew_checkpoint_data(data, form or _form_of(data)[0])
    return fnv32a(text.encode("utf-8", errors="surrogateescape"))


def kubelet_checkpoint_json(data: Any) -> str:
    """A checkpoint file for ``data`` (the ``Data`` value as plain JSON types) with the
    kubelet's checksum, as the kubelet writes it (for tests and fake nodes)."""
    text = json.dumps(data)
    checksum = kubelet_checksum(go_json_loads(text))
    return f'{{"Data":{text},"Checksum":{checksum}}}'


def _checksum_verdict(data: object, checksum: int | None) -> tuple[bool, int | None]:
    expected: int | None = None
    for form in _form_of(data):
        try:
            got = kubelet_checksum(data, form)
        except GoJSONError:
            continue
        if expected is None:
            expected = got
        if checksum is not None and got == checksum:
            return True, got
    return False, expected


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
        ok, expected = _checksum_verdict(f.get("Data"), checksum)
        return KubeletCheckpoint(
            checksum_ok=ok,
            expected_checksum=expected,
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
