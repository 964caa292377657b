"""Which GPUs the kubelet's device plugins gave one container, as the runtime hook checks them.

Role: ``KubeletGrants`` answers the GPU hook's ``KubeletAllocations`` port from the kubelet's
device checkpoint (``CheckpointReader``, read on every call): the device ids the kubelet
allocated to (pod uid, container) for the GPU resources (``--gpu-resource-names``), in the form
a device plugin writes them into ``NVIDIA_VISIBLE_DEVICES`` — the hook keeps a container's
value only when it names nothing else.

The kubelet allocates a container's devices at pod admission and writes the checkpoint
right then (``ManagerImpl.allocateContainerResources`` -> ``writeCheckpoint``), before the
runtime is asked to create the container, so the checkpoint read at ``PreCreateContainer``
lists it.

Invariants:

- Ids are the checkpoint's, except: a time-slicing replica ``<id>::<n>`` is its ``<id>`` (the
  NVIDIA plugin writes the real id into the variable), and a gpushare memory unit
  ``<GPU-uuid>-_-<j>`` is its card's minor (gpushare's plugin writes the card index); a unit of
  a card the node does not have gives nothing.  No other widening: a MIG device never becomes
  its parent card, an index never becomes a UUID.
- An unreadable checkpoint gives the last good read (``CheckpointReader``); none at all gives
  ``()``: the container then sees no GPU (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

from koordlet.devices.library import GPU
from koordlet.kubelet.checkpoint import CheckpointReader

__all__ = ["KubeletGrants", "env_form"]

_REPLICA = "::"
_GPUSHARE_UNIT = "-_-"


def env_form(device_id: str, minors: dict[str, int]) -> str | None:
    """``device_id`` as its device plugin writes it into ``NVIDIA_VISIBLE_DEVICES``."""
    if _GPUSHARE_UNIT in device_id:
        minor = minors.get(device_id.split(_GPUSHARE_UNIT, 1)[0])
        return None if minor is None else str(minor)
    return device_id.split(_REPLICA, 1)[0]


class KubeletGrants:
    """See the module docstring."""

    def __init__(
        self,
        checkpoint: CheckpointReader,
        gpu_resources: Container[str],
        gpus: Callable[[], Sequence[GPU]],
    ) -> None:
        self._checkpoint = checkpoint
        self._gpu_resources = gpu_resources
        self._gpus = gpus

    def container_gpus(self, pod_uid: str, container: str) -> tuple[str, ...]:
        """The container's GPU ids (see the module docstring); () for none."""
        minors: dict[str, int] | None = None
        ids: dict[str, None] = {}
        for entry in self._checkpoint.read():
            if (entry.pod_uid, entry.container_name) != (pod_uid, container):
                continue
            if entry.resource_name not in self._gpu_resources:
                continue
            for raw in entry.device_ids:
                if minors is None and _GPUSHARE_UNIT in raw:
                    minors = {g.uuid: g.minor for g in self._gpus()}
                form = env_form(raw, minors or {})
                if form:
                    ids[form] = None
        return tuple(ids)
