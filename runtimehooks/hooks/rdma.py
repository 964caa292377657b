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
  hook server (Koordinator's ``api.proto``) has no field for them. With a ``CDISpecs``
  (``runtimehooks.cdi``) they reach the runtime through CDI: the hook writes the container's
  spec file and answers ``cdi.k8s.io/koordinator.sh_rdma: koordinator.sh/rdma=<uid>_<name>``
  in ``container_annotations`` (the proxy merges them into the CRI CreateContainer request).
  The annotation is set only after its spec was written; a spec that cannot be written is a
  denial like any other (no annotation, no device).
- Never a foreign device: a ``cdi.k8s.io/*`` annotation of the request that names another
  ``koordinator.sh/rdma`` device is rewritten without it (``runtimehooks.cdi``), whatever the
  pod's allocation; the device name holds the pod uid, so a pod re-created under its name gets
  a fresh entry and can never name its predecessor's.
- Hostile allocations are refused before sysfs is read for them: a bus id that is not a PCI
  address (``dddd:bb:dd.f``), a VF that is not a VF of the entry's NIC on this node, more than
  ``MAX_DEVICE_NODES`` device nodes.
- Node-side admission (``PodAdmission``, when wired): before a container is handed any RDMA
  device, the pod is admitted by the node (a VF another admitted pod holds, or a NIC share
  beyond 100 %, refuses it). A refused or not yet admissible pod's containers get no RDMA
  device (denial ``rdma-unavailable`` naming the admission's reason), like every other
  failure; the pod's own refusal (``Failed``, event) is the admission's to report.
- At PostStopPodSandbox (``stop_sandbox``) the pod's spec files are removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

import structlog

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, AllocationDecodeError, decode_allocations
from apis.resources import DEVICE_RDMA
from runtimehooks.cdi import (
    ANNOTATION_KEY,
    MAX_DEVICE_NODES,
    CDIError,
    CDISpecs,
    foreign_devices_removed,
)
from runtimehooks.context import ContainerContext, HookInputError, LinuxDevice, PodSandboxContext
from runtimehooks.ports import AdmissionRefused, Denial, DenialSink, PodAdmission

__all__ = ["CLEANUP_HOOK_NAME", "HOOK_NAME", "IB_DEV_DIR", "RDMA_CM", "REASON_RDMA_UNAVAILABLE",
           "RDMAHook", "rdma_devices"]

log = structlog.get_logger("koordlet.runtimehooks.rdma")

HOOK_NAME: Final = "rdma device inject"
IB_DEV_DIR: Final = "/dev/infiniband"
RDMA_CM: Final = f"{IB_DEV_DIR}/rdma_cm"
REASON_RDMA_UNAVAILABLE: Final = "rdma-unavailable"
CLEANUP_HOOK_NAME: Final = "rdma cdi cleanup"

_PCI_ADDRESS: Final = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_UVERBS: Final = re.compile(r"^uverbs\d+$")


def _numbers(path: Path) -> tuple[int, int]:
    try:
        major, minor = path.read_text().strip().split(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        raise HookInputError(f"no device numbers in {path}") from None


def _pci(sysfs: Path, bus_id: str) -> Path:
    if not _PCI_ADDRESS.match(bus_id):
        raise HookInputError(f"{bus_id!r} is not a PCI address")
    return sysfs / "bus" / "pci" / "devices" / bus_id


def _check_vf(sysfs: Path, pf: str, vf: str) -> None:
    """``vf`` is a VF of the NIC ``pf`` on this node."""
    _pci(sysfs, pf)
    try:
        parent = os.path.basename(os.path.realpath(_pci(sysfs, vf) / "physfn", strict=True))
    except OSError:
        raise HookInputError(f"{vf} is not a VF on this node") from None
    if parent != pf:
        raise HookInputError(f"{vf} is a VF of {parent}, not of {pf}")


def _uverbs(sysfs: Path, bus_id: str) -> LinuxDevice:
    verbs = _pci(sysfs, bus_id) / "infiniband_verbs"
    try:
        names = sorted(n for n in os.listdir(verbs) if _UVERBS.match(n))
    except OSError:
        names = []
    if not names:
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
        raise UndecodableAllocation(str(err)) from None
    if not entries:
        return ()
    sysfs = Path(sysfs_root)
    functions: list[str] = []
    for entry in entries:
        vfs = [vf.bus_id for vf in entry.extension.vfs] if entry.extension and \
            entry.extension.vfs else []
        if len(functions) + max(len(vfs), 1) >= MAX_DEVICE_NODES:
            raise HookInputError(f"more than {MAX_DEVICE_NODES - 1} RDMA functions allocated")
        for vf in vfs:
            _check_vf(sysfs, entry.id, vf)
        functions.extend(vfs or [entry.id])
    major, minor = _numbers(sysfs / "class" / "misc" / "rdma_cm" / "dev")
    out = [LinuxDevice(RDMA_CM, major, minor)]
    for bus in dict.fromkeys(functions):  # a function named twice is one device
        out.append(_uverbs(sysfs, bus))
    return tuple(dict.fromkeys(out))


class UndecodableAllocation(HookInputError):
    """The pod's ``device-allocated`` annotation does not decode at all: whether it asks for
    RDMA is unknown, so no RDMA device is given, and the denial is the GPU hook's to report
    (``invalid-allocation``, once per cause) — this hook only logs it."""


class RDMAHook:
    """The PreCreateContainer hook: ``ctx`` with the pod's RDMA devices added (and, with
    ``cdi``, their CDI spec written and named in the container's annotations)."""

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys", *,
                 denials: DenialSink | None = None, cdi: CDISpecs | None = None,
                 admission: PodAdmission | None = None) -> None:
        self.sysfs_root = sysfs_root
        self._denials = denials
        self._admission = admission
        self.cdi = cdi

    def __call__(self, ctx: ContainerContext) -> ContainerContext:
        if ANNOTATION_DEVICE_ALLOCATED not in ctx.pod_annotations:
            return self._sanitized(ctx, None)
        try:
            devices = rdma_devices(ctx.pod_annotations, self.sysfs_root)
            if not devices:
                return self._sanitized(ctx, None)
            if self._admission is not None:
                raw = ctx.pod_annotations[ANNOTATION_DEVICE_ALLOCATED]
                self._admission.admit(ctx.pod_meta, raw)
            own = self._deliver(ctx, devices)
        except AdmissionRefused as err:
            return self._deny(ctx, f"refused by the node's admission ({err.reason}): {err}")
        except UndecodableAllocation as err:
            return self._deny(ctx, str(err), report=False)
        except (HookInputError, CDIError) as err:
            return self._deny(ctx, str(err))
        except Exception as err:  # a bug must not hand out a partial set either
            log.error("rdma hook failed", error=repr(err), exc_info=True)
            return self._deny(ctx, repr(err))
        kept = tuple(d for d in ctx.devices if d.path not in {x.path for x in devices})
        out = _with_devices(self._sanitized(ctx, own), kept + devices)
        if own is not None:
            out = out.with_container_annotations({ANNOTATION_KEY: own})
        return out

    def _deliver(self, ctx: ContainerContext, devices: tuple[LinuxDevice, ...]) -> str | None:
        """Write the container's CDI spec; its qualified name (None without CDI)."""
        if self.cdi is None:
            return None
        return self.cdi.write(ctx.pod_meta.uid, ctx.container_meta.name, devices)

    def _sanitized(self, ctx: ContainerContext, own: str | None) -> ContainerContext:
        """``ctx`` without CDI names of RDMA devices other than ``own`` (one warning)."""
        rewritten = foreign_devices_removed(ctx.container_annotations, own)
        if not rewritten:
            return ctx
        pod = ctx.pod_meta
        log.warning("container annotations named foreign RDMA devices: removed",
                    pod=f"{pod.namespace}/{pod.name}", uid=pod.uid,
                    container=ctx.container_meta.name, keys=sorted(rewritten))
        return ctx.with_container_annotations(rewritten)

    def _deny(self, ctx: ContainerContext, message: str, report: bool = True) -> ContainerContext:
        pod, container = ctx.pod_meta, ctx.container_meta.name
        log.warning("rdma allocation not served: container gets no RDMA device",
                    pod=f"{pod.namespace}/{pod.name}", uid=pod.uid, container=container,
                    error=message)
        if report and self._denials is not None:
            try:
                self._denials.denied(Denial(pod, container, REASON_RDMA_UNAVAILABLE, message))
            except Exception as err:
                log.error("reporting an rdma denial failed", error=repr(err))
        if self.cdi is not None:  # an earlier spec of this container is not left behind
            try:
                self.cdi.remove(pod.uid, container)
            except OSError as err:
                log.error("removing a refused container's rdma cdi spec failed", error=repr(err))
        rest = tuple(d for d in ctx.devices if not d.path.startswith(f"{IB_DEV_DIR}/"))
        return _with_devices(self._sanitized(ctx, None), rest)

    def stop_sandbox(self, ctx: PodSandboxContext) -> PodSandboxContext:
        """PostStopPodSandbox: the pod's CDI specs go (its containers are gone)."""
        if self.cdi is not None and ctx.pod_meta.uid:
            removed = self.cdi.remove_pod(ctx.pod_meta.uid)
            if removed:
                log.info("rdma cdi specs removed", uid=ctx.pod_meta.uid, count=removed)
        return ctx


def _with_devices(ctx: ContainerContext, devices: tuple[LinuxDevice, ...]) -> ContainerContext:
    return replace(ctx, devices=devices)
