"""The RDMA hook: the pod's RDMA allocation -> the container's ``/dev/infiniband`` nodes.

Role: Koordinator's koordlet ``rdma device inject`` hook
(``pkg/koordlet/runtimehooks/hooks/rdma``) at PreCreateContainer: a pod whose
``device-allocated`` annotation has ``rdma`` entries gets ``/dev/infiniband/rdma_cm`` and, per
entry, the verbs device (``uverbs<N>``) of each VF it names in ``extension.vfs`` or, for an
entry without VFs, of the NIC itself (its ``id``, the PF's bus id). The verbs device of a PCI
function is the entry of ``<sysfs>/bus/pci/devices/<bus id>/infiniband_verbs`` (the first, by
name); its numbers are read from ``<sysfs>/class/infiniband_verbs/<name>/dev`` (and
``<sysfs>/class/misc/rdma_cm/dev``), so no device node is opened; mode ``0666``, type ``c``.

Invariants:

- Every container of such a pod gets the same devices (Koordinator injects per container with
  no container filter); a pod without an ``rdma`` entry is returned unchanged.
- Fails closed: an annotation that does not decode, a function sysfs does not know, or any
  other failure gives the container no RDMA device at all (never a partial or foreign set),
  logs one warning naming the pod and the reason, and reports a ``Denial``. (Koordinator's
  hook returns an error there, which its proxy's Ignore policy turns into an unchanged
  container: the same outcome, no RDMA device.)
- The devices travel on ``ContainerContext.devices``; the runtime-proxy protocol of this
  hook server (Koordinator's ``api.proto``) has no field for them, so delivering them to the
  runtime takes an NRI adapter, as in Koordinator.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

import structlog

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationDecodeError, decode_allocations
from apis.resources import DEVICE_RDMA
from runtimehooks.context import ContainerContext, HookInputError, LinuxDevice
from runtimehooks.ports import Denial, DenialSink

__all__ = ["HOOK_NAME", "IB_DEV_DIR", "RDMA_CM", "REASON_RDMA_UNAVAILABLE", "RDMAHook",
           "rdma_devices"]

log = structlog.get_logger("koordlet.runtimehooks.rdma")

HOOK_NAME: Final = "rdma device inject"
IB_DEV_DIR: Final = "/dev/infiniband"
RDMA_CM: Final = f"{IB_DEV_DIR}/rdma_cm"
REASON_RDMA_UNAVAILABLE: Final = "rdma-unavailable"


def _numbers(path: Path) -> tuple[int, int]:
    try:
        major, minor = path.read_text().strip().split(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        raise HookInputError(f"no device numbers in {path}") from None


def _uverbs(sysfs: Path, bus_id: str) -> LinuxDevice:
    verbs = sysfs / "bus" / "pci" / "devices" / bus_id / "infiniband_verbs"
    try:
        names = sorted(os.listdir(verbs))
    except OSError:
        names = []
    if not bus_id or "/" in bus_id or not names:
        raise HookInputError(f"no verbs device for PCI function {bus_id!r}")
    major, minor = _numbers(sysfs / "class" / "infiniband_verbs" / names[0] / "dev")
    return LinuxDevice(f"{IB_DEV_DIR}/{names[0]}", major, minor)


def rdma_devices(
    pod_annotations: Mapping[str, str], sysfs_root: str | os.PathLike[str]
) -> tuple[LinuxDevice, ...]:
    """The devices of a pod's RDMA allocation (none without one); raises ``HookInputError``."""
    raw = pod_annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw is None:
        return ()
    try:
        entries = decode_allocations(raw).get(DEVICE_RDMA) or []
    except AllocationDecodeError as err:
        raise HookInputError(str(err)) from None
    if not entries:
        return ()
    sysfs = Path(sysfs_root)
    major, minor = _numbers(sysfs / "class" / "misc" / "rdma_cm" / "dev")
    out = [LinuxDevice(RDMA_CM, major, minor)]
    for entry in entries:
        functions = [vf.bus_id for vf in entry.extension.vfs] if entry.extension and \
            entry.extension.vfs else [entry.id]
        out.extend(_uverbs(sysfs, bus) for bus in functions)
    return tuple(out)


class RDMAHook:
    """The PreCreateContainer hook: ``ctx`` with the pod's RDMA devices added."""

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys", *,
                 denials: DenialSink | None = None) -> None:
        self.sysfs_root = sysfs_root
        self._denials = denials

    def __call__(self, ctx: ContainerContext) -> ContainerContext:
        if ANNOTATION_DEVICE_ALLOCATED not in ctx.pod_annotations:
            return ctx
        try:
            devices = rdma_devices(ctx.pod_annotations, self.sysfs_root)
        except HookInputError as err:
            return self._deny(ctx, str(err))
        except Exception as err:  # a bug must not hand out a partial set either
            log.error("rdma hook failed", error=repr(err), exc_info=True)
            return self._deny(ctx, repr(err))
        if not devices:
            return ctx
        kept = tuple(d for d in ctx.devices if d.path not in {x.path for x in devices})
        return _with_devices(ctx, kept + devices)

    def _deny(self, ctx: ContainerContext, message: str) -> ContainerContext:
        pod, container = ctx.pod_meta, ctx.container_meta.name
        log.warning("rdma allocation not served: container gets no RDMA device",
                    pod=f"{pod.namespace}/{pod.name}", uid=pod.uid, container=container,
                    error=message)
        if self._denials is not None:
            try:
                self._denials.denied(Denial(pod, container, REASON_RDMA_UNAVAILABLE, message))
            except Exception as err:
                log.error("reporting an rdma denial failed", error=repr(err))
        rest = tuple(d for d in ctx.devices if not d.path.startswith(f"{IB_DEV_DIR}/"))
        return _with_devices(ctx, rest)


def _with_devices(ctx: ContainerContext, devices: tuple[LinuxDevice, ...]) -> ContainerContext:
    return replace(ctx, devices=devices)
