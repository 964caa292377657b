"""CDI (Container Device Interface) spec files: how the RDMA hook's devices reach the container.

Role: the runtime-proxy protocol (SPEC section 7) has no device field, but CDI-aware runtimes
(containerd >= 1.7 with ``enable_cdi``, CRI-O) add the devices a CDI spec file describes to a
container whose CRI annotations name them: ``cdi.k8s.io/<key>: <vendor>/<class>=<name>``.
``CDISpecs`` writes one spec file per (pod uid, container) into the CDI directory, with one
device named ``<pod uid>_<container>`` of kind ``koordinator.sh/rdma`` whose container edits are
the device nodes (path, type, major, minor, permissions); the hook then answers the annotation
``cdi.k8s.io/koordinator.sh_rdma: koordinator.sh/rdma=<pod uid>_<container>``.

The format is the CDI spec's (``cncf-tags/container-device-interface``, ``specs-go/config.go``):
``cdiVersion``, ``kind``, ``devices: [{name, containerEdits: {deviceNodes: [...]}}]``; version
0.5.0 because device names start with the uid, which may start with a digit (0.5.0 is the
first version that allows it; containerd 1.7 reads up to it). The runtime does not stat the
host node when ``type`` and ``major`` are given.

Invariants:

- Only names this module builds are ever written or removed: a pod uid must match ``_UID``, a
  container name a DNS label (no ``/``, ``.``, ``_``), so ``<uid>_<container>`` is injective
  and every file stays directly in the CDI directory; anything else is ``CDIError``.
- A write is atomic (a temporary ``.*.tmp`` file, which CDI ignores: it reads ``*.json`` and
  ``*.yaml`` only; then ``rename``), mode 0644. A failed write leaves no file for the entry
  (a previous one of the same name is removed), so the annotation never names stale content.
- A pod's entries go with ``remove_pod`` (its sandbox stopped) or ``retain`` (the node's pod
  list no longer has it); ``retain`` keeps entries written after the list started. A refused
  container's goes with ``remove``.
- Thread-safe (one lock); nothing happens at construction.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Final

from runtimehooks.context import LinuxDevice
from runtimehooks.files import write_atomically

__all__ = [
    "ANNOTATION_KEY",
    "ANNOTATION_PREFIX",
    "CDI_VERSION",
    "DEFAULT_CDI_DIR",
    "KIND",
    "MAX_DEVICE_NODES",
    "REFUSED_DEVICE",
    "CDIError",
    "CDISpecs",
    "device_name",
    "foreign_devices_removed",
    "qualified_name",
    "spec_json",
]

CDI_VERSION: Final = "0.5.0"
KIND: Final = "koordinator.sh/rdma"
ANNOTATION_PREFIX: Final = "cdi.k8s.io/"
ANNOTATION_KEY: Final = f"{ANNOTATION_PREFIX}koordinator.sh_rdma"
"""As CDI's ``AnnotationKey("koordinator.sh", "rdma")`` builds it (``<plugin>_<device id>``)."""
DEFAULT_CDI_DIR: Final = "/var/run/cdi"
MAX_DEVICE_NODES: Final = 128
"""More device nodes for one container than this is a hostile or broken allocation."""
REFUSED_DEVICE: Final = f"{KIND}=refused"
"""A name no spec defines: a CDI runtime refuses to create a container that names it."""

_FILE_PREFIX: Final = "koordinator.sh-rdma_"
_UID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
_CONTAINER: Final = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_DEV_PATH: Final = re.compile(r"^/dev/[A-Za-z0-9_][A-Za-z0-9_./-]*$")


class CDIError(Exception):
    """A spec cannot be written for this container (a bad name, bad devices, an I/O error)."""


def device_name(pod_uid: str, container: str) -> str:
    """``<pod uid>_<container>``; raises ``CDIError`` for a uid or name that does not qualify."""
    if not _UID.match(pod_uid):
        raise CDIError(f"pod uid {pod_uid!r} is not usable in a CDI device name")
    if not _CONTAINER.match(container):
        raise CDIError(f"container name {container!r} is not a DNS label")
    return f"{pod_uid}_{container}"


def qualified_name(pod_uid: str, container: str) -> str:
    """``koordinator.sh/rdma=<pod uid>_<container>``."""
    return f"{KIND}={device_name(pod_uid, container)}"


def _node(dev: LinuxDevice) -> dict[str, object]:
    if not _DEV_PATH.match(dev.path) or ".." in dev.path.split("/"):
        raise CDIError(f"device path {dev.path!r} is not under /dev")
    if dev.type not in ("c", "b") or dev.major <= 0 or dev.minor < 0:
        raise CDIError(f"device {dev.path!r}: bad type or numbers {dev.type} {dev.major}:"
                       f"{dev.minor}")
    return {"path": dev.path, "type": dev.type, "major": dev.major, "minor": dev.minor,
            "fileMode": dev.file_mode, "permissions": "rw"}


def spec_json(pod_uid: str, container: str, devices: Sequence[LinuxDevice]) -> str:
    """The spec file's content for one container; raises ``CDIError``."""
    if not devices:
        raise CDIError("no devices")
    if len(devices) > MAX_DEVICE_NODES:
        raise CDIError(f"{len(devices)} device nodes, more than {MAX_DEVICE_NODES}")
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{
            "name": device_name(pod_uid, container),
            "containerEdits": {"deviceNodes": [_node(d) for d in devices]},
        }],
    }
    return json.dumps(spec, indent=2) + "\n"


def _file_name(pod_uid: str, container: str) -> str:
    return f"{_FILE_PREFIX}{device_name(pod_uid, container)}.json"


def _uid_of(file_name: str) -> str | None:
    """The pod uid of one of our spec files (None: not ours)."""
    if not (file_name.startswith(_FILE_PREFIX) and file_name.endswith(".json")):
        return None
    uid, sep, _ = file_name[len(_FILE_PREFIX):-len(".json")].partition("_")
    return uid if sep and _UID.match(uid) else None


def foreign_devices_removed(
    annotations: Mapping[str, str], own: str | None
) -> dict[str, str]:
    """The CDI annotations of ``annotations`` that name a ``koordinator.sh/rdma`` device other
    than ``own``, rewritten without it (``REFUSED_DEVICE`` when nothing is left: the proxy
    merges a response's annotations into the request's and cannot delete a key)."""
    out: dict[str, str] = {}
    for key, value in annotations.items():
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        names = value.split(",")
        kept = [n for n in names if not n.strip().startswith(f"{KIND}=") or n.strip() == own]
        if len(kept) != len(names):
            out[key] = ",".join(kept) if kept else REFUSED_DEVICE
    return out


class CDISpecs:
    """The ``koordinator.sh/rdma`` spec files in one CDI directory; see the module docstring."""

    def __init__(self, directory: str | os.PathLike[str] = DEFAULT_CDI_DIR, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(directory)
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._written: dict[str, float] = {}  # file name -> when written (monotonic)

    def path(self, pod_uid: str, container: str) -> Path:
        return self.directory / _file_name(pod_uid, container)

    def write(self, pod_uid: str, container: str, devices: Sequence[LinuxDevice]) -> str:
        """Write the container's spec; returns its qualified device name; raises ``CDIError``
        (and then no spec of that name is left behind)."""
        name = _file_name(pod_uid, container)
        content = spec_json(pod_uid, container, devices).encode()
        with self._lock:
            try:
                self._write(name, content)
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.unlink(self.directory / name)
                self._written.pop(name, None)
                raise CDIError(f"cannot write {self.directory / name}: {err}") from None
            self._written[name] = self._monotonic()
        return qualified_name(pod_uid, container)

    def _write(self, name: str, content: bytes) -> None:
        self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomically(self.directory, name, content)

    def _names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.directory))
        except OSError:
            return []

    def pods(self) -> dict[str, list[str]]:
        """pod uid -> its spec file names, as on disk."""
        out: dict[str, list[str]] = {}
        for name in self._names():
            uid = _uid_of(name)
            if uid is not None:
                out.setdefault(uid, []).append(name)
        return out

    def _remove(self, name: str) -> bool:
        self._written.pop(name, None)
        try:
            os.unlink(self.directory / name)
        except FileNotFoundError:
            return False
        return True

    def remove(self, pod_uid: str, container: str) -> bool:
        """Remove the container's spec (a refused re-creation); False: none, or not a name
        this module writes."""
        try:
            name = _file_name(pod_uid, container)
        except CDIError:
            return False
        with self._lock:
            return self._remove(name)

    def remove_pod(self, pod_uid: str) -> int:
        """Remove every spec of the pod (its sandbox stopped); returns how many went."""
        with self._lock:
            return sum(self._remove(n) for n in self.pods().get(pod_uid, []))

    def retain(self, pod_uids: Collection[str], listed_at: float) -> int:
        """Remove the specs of pods not in ``pod_uids`` (the node's pods, listed from
        ``listed_at``, monotonic) unless written after the list started; returns how many."""
        removed = 0
        with self._lock:
            for uid, names in self.pods().items():
                if uid in pod_uids:
                    continue
                for name in names:
                    if self._written.get(name, float("-inf")) < listed_at:
                        removed += self._remove(name)
        return removed
