"""The hook contract: what a runtime hook sees and returns, in plain Python.

Role: the neutral records that ``protocol.py`` builds from the gRPC requests and turns back
into responses, so that hooks (``runtimehooks/hooks/``) and the registry never touch protobuf;
and ``HookInputError``, the one exception a hook raises for a bad request.

Invariants:

- Stdlib only: importing this module imports neither protobuf nor grpc.
- Records are frozen and their mappings are read-only views of private copies, so a hook can
  change a context only by returning a new one (``with_envs``, ``with_container_annotations``,
  ``dataclasses.replace``), and the context a failed hook was given is still intact — that is
  what lets the registry continue "with the unchanged context" under the Ignore policy.
- ``None`` resources mean "absent in the request" (proto3 message presence), which the
  response echoes as absent; ``Resources()`` is a present, all-zero message.
- A hook that returns the context it was given changes nothing: the response is then an exact
  echo of the request (the proxy replaces the container's environment with the response's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

__all__ = [
    "ContainerContext",
    "ContainerMeta",
    "HookInputError",
    "HugepageLimit",
    "LinuxDevice",
    "PodMeta",
    "PodSandboxContext",
    "Resources",
]


def _frozen(m: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(m))


class HookInputError(ValueError):
    """The request cannot be served as sent (e.g. a malformed pod annotation).

    The server answers it with ``INVALID_ARGUMENT`` and the message, whatever the hook's
    failure policy: the caller sent something wrong and should be told so.
    """


@dataclass(frozen=True, slots=True)
class PodMeta:
    """The pod sandbox's metadata (``PodSandboxMetadata``)."""

    name: str = ""
    uid: str = ""
    namespace: str = ""
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class ContainerMeta:
    """The container's metadata (``ContainerMetadata``)."""

    name: str = ""
    attempt: int = 0
    id: str = ""


@dataclass(frozen=True, slots=True)
class HugepageLimit:
    """A HugeTLB limit: ``page_size`` such as ``2MB``, ``limit`` in bytes."""

    page_size: str = ""
    limit: int = 0


@dataclass(frozen=True, slots=True)
class Resources:
    """Linux container resources (``LinuxContainerResources``); 0 / "" mean "not specified"."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    hugepage_limits: tuple[HugepageLimit, ...] = ()
    unified: Mapping[str, str] = field(default_factory=dict)
    memory_swap_limit_in_bytes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "hugepage_limits", tuple(self.hugepage_limits))
        object.__setattr__(self, "unified", _frozen(self.unified))


@dataclass(frozen=True, slots=True)
class LinuxDevice:
    """A device node to add to a container (OCI ``LinuxDevice``: path, type, numbers, mode)."""

    path: str
    major: int
    minor: int
    type: str = "c"
    file_mode: int = 0o666


@dataclass(frozen=True, slots=True)
class ContainerContext:
    """One container RPC's request, as hooks see it; the response is built from it."""

    pod_meta: PodMeta = field(default_factory=PodMeta)
    container_meta: ContainerMeta = field(default_factory=ContainerMeta)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    container_annotations: Mapping[str, str] = field(default_factory=dict)
    container_envs: Mapping[str, str] = field(default_factory=dict)
    container_resources: Resources | None = None
    pod_resources: Resources | None = None
    pod_cgroup_parent: str = ""
    devices: tuple[LinuxDevice, ...] = ()
    """Device nodes the hooks add to the container (the RDMA hook's)."""

    def __post_init__(self) -> None:
        for name in ("pod_labels", "pod_annotations", "container_annotations", "container_envs"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def with_envs(self, updates: Mapping[str, str]) -> ContainerContext:
        """A copy whose environment is this one's with ``updates`` set (added or replaced)."""
        if not updates:
            return self
        return replace(self, container_envs={**self.container_envs, **updates})

    def without_envs(self, names: Iterable[str]) -> ContainerContext:
        """A copy whose environment lacks ``names``."""
        drop = set(names)
        kept = {k: v for k, v in self.container_envs.items() if k not in drop}
        return replace(self, container_envs=kept)

    def with_container_annotations(self, updates: Mapping[str, str]) -> ContainerContext:
        """A copy whose container annotations are this one's with ``updates`` set."""
        if not updates:
            return self
        merged = {**self.container_annotations, **updates}
        return replace(self, container_annotations=merged)


@dataclass(frozen=True, slots=True)
class PodSandboxContext:
    """One pod-sandbox RPC's request, as hooks see it; the response is built from it."""

    pod_meta: PodMeta = field(default_factory=PodMeta)
    runtime_handler: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    overhead: Resources | None = None
    resources: Resources | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels))
        object.__setattr__(self, "annotations", _frozen(self.annotations))
