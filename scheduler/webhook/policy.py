"""What the admission webhook is configured to do: ``WebhookPolicy``.

Role: one frozen record built by the composition root from the flags (``koord-scheduler
webhook serve``): the scheduler that GPU pods are sent to, which resources make a pod a GPU
pod, the opt-out label, whether ``nvidia.com/gpu`` is translated, the unit of
``aliyun.com/gpu-mem``, and the identities that may write allocations. Pure: no I/O.

Invariants: resource patterns are exact names or a prefix ending in ``*``; a pod's resources
are read from ``requests`` and ``limits`` of every container and init container, and a spec
that is not shaped like one (the API server refuses those anyway) asks for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from apis.gpushare import MemoryUnit
from scheduler.webhook.review import UserInfo

__all__ = [
    "DEFAULT_AGENT",
    "DEFAULT_GPU_RESOURCES",
    "DEFAULT_SCHEDULER_IDENTITY",
    "OPT_OUT_LABEL",
    "OPT_OUT_VALUE",
    "WebhookPolicy",
    "containers",
]

DEFAULT_GPU_RESOURCES: Final = (
    "nvidia.com/gpu",
    "koordinator.sh/gpu",
    "koordinator.sh/gpu-*",
    "koordinator.sh/gpu.shared",
    "aliyun.com/gpu-mem",
)
OPT_OUT_LABEL: Final = "koordinator.sh/webhook"
OPT_OUT_VALUE: Final = "disabled"
"""A pod or namespace labelled ``koordinator.sh/webhook=disabled`` is not mutated (the
namespace label also takes it out of every webhook's namespaceSelector)."""
DEFAULT_SCHEDULER_IDENTITY: Final = "system:serviceaccount:koordinator-system:koord-scheduler"
DEFAULT_AGENT: Final = "system:serviceaccount:koordinator-system:koordlet"


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    scheduler_name: str = "koord-scheduler"
    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    translate_nvidia_gpu: bool = False
    gpushare_unit: MemoryUnit = MemoryUnit.GiB
    allocation_writers: tuple[str, ...] = (DEFAULT_SCHEDULER_IDENTITY, DEFAULT_AGENT)
    """Users that may set or change allocation annotations."""
    allocation_writer_groups: tuple[str, ...] = ()
    """Groups whose members may (none by default: not even system:masters)."""

    def is_gpu_resource(self, name: str) -> bool:
        for pattern in self.gpu_resources:
            if pattern.endswith("*"):
                if name.startswith(pattern[:-1]):
                    return True
            elif name == pattern:
                return True
        return False

    def asks_for_gpu(self, spec: Mapping[str, Any]) -> bool:
        for _, _, container in containers(spec):
            resources = container.get("resources")
            if not isinstance(resources, Mapping):
                continue
            for part in ("requests", "limits"):
                names = resources.get(part)
                if isinstance(names, Mapping) and any(self.is_gpu_resource(str(n)) for n in names):
                    return True
        return False

    def may_write_allocations(self, user: UserInfo) -> bool:
        return user.username in self.allocation_writers or any(
            g in self.allocation_writer_groups for g in user.groups
        )


def containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(``containers`` | ``initContainers``, index, container) of a pod spec, the app
    containers first; entries that are not objects are skipped."""
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        if not isinstance(items, list):
            continue
        for i, c in enumerate(items):
            if isinstance(c, Mapping):
                yield kind, i, c
