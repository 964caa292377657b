"""Protobuf <-> the neutral hook contexts (``runtimehooks.context``).

Role: the only module besides ``server.py`` that reads or builds the generated protobuf
messages.  ``*_context`` decodes a request once into a frozen context; ``*_response`` builds
the response from the (possibly hook-modified) context; ``*_request`` builds a request from a
context (for clients and tests).

Invariants:

- Echo: ``container_response(container_context(req))`` carries exactly the request's
  ``container_envs``, ``container_annotations``, ``container_resources`` and
  ``pod_cgroup_parent`` (and ``sandbox_response(sandbox_context(req))`` the request's labels,
  annotations, cgroup parent and resources).  koord-runtime-proxy REPLACES the container's
  environment with the response's ``container_envs`` and merges the rest, so a response that
  dropped a field would silently strip it from the container.
- Message presence survives: an absent resources message stays absent (``None``), a present
  all-zero one stays present (``Resources()``), in both directions.
- Round trip: ``container_context(container_request(ctx)) == ctx`` and likewise for sandboxes.
"""

from __future__ import annotations

from runtimehooks.api import api_pb2
from runtimehooks.context import (
    ContainerContext,
    ContainerMeta,
    HugepageLimit,
    PodMeta,
    PodSandboxContext,
    Resources,
)

__all__ = [
    "container_context",
    "container_request",
    "container_response",
    "resources_from_proto",
    "resources_to_proto",
    "sandbox_context",
    "sandbox_request",
    "sandbox_response",
]


def resources_from_proto(msg: api_pb2.LinuxContainerResources) -> Resources:
    """``LinuxContainerResources`` -> ``Resources``."""
    return Resources(
        cpu_period=msg.cpu_period,
        cpu_quota=msg.cpu_quota,
        cpu_shares=msg.cpu_shares,
        memory_limit_in_bytes=msg.memory_limit_in_bytes,
        oom_score_adj=msg.oom_score_adj,
        cpuset_cpus=msg.cpuset_cpus,
        cpuset_mems=msg.cpuset_mems,
        hugepage_limits=tuple(
            HugepageLimit(page_size=h.page_size, limit=h.limit) for h in msg.hugepage_limits
        ),
        unified=dict(msg.unified),
        memory_swap_limit_in_bytes=msg.memory_swap_limit_in_bytes,
    )


def resources_to_proto(res: Resources) -> api_pb2.LinuxContainerResources:
    """``Resources`` -> ``LinuxContainerResources``."""
    return api_pb2.LinuxContainerResources(
        cpu_period=res.cpu_period,
        cpu_quota=res.cpu_quota,
        cpu_shares=res.cpu_shares,
        memory_limit_in_bytes=res.memory_limit_in_bytes,
        oom_score_adj=res.oom_score_adj,
        cpuset_cpus=res.cpuset_cpus,
        cpuset_mems=res.cpuset_mems,
        hugepage_limits=[
            api_pb2.HugepageLimit(page_size=h.page_size, limit=h.limit) for h in res.hugepage_limits
        ],
        unified=dict(res.unified),
        memory_swap_limit_in_bytes=res.memory_swap_limit_in_bytes,
    )


def _opt_resources(present: bool, msg: api_pb2.LinuxContainerResources) -> Resources | None:
    return resources_from_proto(msg) if present else None


def _opt_proto(res: Resources | None) -> api_pb2.LinuxContainerResources | None:
    return None if res is None else resources_to_proto(res)


def _pod_meta(msg: api_pb2.PodSandboxMetadata) -> PodMeta:
    return PodMeta(name=msg.name, uid=msg.uid, namespace=msg.namespace, attempt=msg.attempt)


def _pod_meta_proto(meta: PodMeta) -> api_pb2.PodSandboxMetadata:
    return api_pb2.PodSandboxMetadata(
        name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt
    )


# -- containers -----------------------------------------------------------------------------------


def container_context(req: api_pb2.ContainerResourceHookRequest) -> ContainerContext:
    """Decode a container hook request."""
    cm = req.container_meta
    return ContainerContext(
        pod_meta=_pod_meta(req.pod_meta),
        container_meta=ContainerMeta(name=cm.name, attempt=cm.attempt, id=cm.id),
        pod_labels=dict(req.pod_labels),
        pod_annotations=dict(req.pod_annotations),
        container_annotations=dict(req.container_annotations),
        container_envs=dict(req.container_envs),
        container_resources=_opt_resources(
            req.HasField("container_resources"), req.container_resources
        ),
        pod_resources=_opt_resources(req.HasField("pod_resources"), req.pod_resources),
        pod_cgroup_parent=req.pod_cgroup_parent,
    )


def container_response(ctx: ContainerContext) -> api_pb2.ContainerResourceHookResponse:
    """The response for a context: the request's echo plus whatever the hooks changed."""
    return api_pb2.ContainerResourceHookResponse(
        container_annotations=dict(ctx.container_annotations),
        container_resources=_opt_proto(ctx.container_resources),
        pod_cgroup_parent=ctx.pod_cgroup_parent,
        container_envs=dict(ctx.container_envs),
    )


def container_request(ctx: ContainerContext) -> api_pb2.ContainerResourceHookRequest:
    """Encode a context as a request (what the proxy would send)."""
    cm = ctx.container_meta
    return api_pb2.ContainerResourceHookRequest(
        pod_meta=_pod_meta_proto(ctx.pod_meta),
        container_meta=api_pb2.ContainerMetadata(name=cm.name, attempt=cm.attempt, id=cm.id),
        container_annotations=dict(ctx.container_annotations),
        container_resources=_opt_proto(ctx.container_resources),
        pod_resources=_opt_proto(ctx.pod_resources),
        pod_annotations=dict(ctx.pod_annotations),
        pod_labels=dict(ctx.pod_labels),
        pod_cgroup_parent=ctx.pod_cgroup_parent,
        container_envs=dict(ctx.container_envs),
    )


# -- pod sandboxes --------------------------------------------------------------------------------


def sandbox_context(req: api_pb2.PodSandboxHookRequest) -> PodSandboxContext:
    """Decode a pod-sandbox hook request."""
    return PodSandboxContext(
        pod_meta=_pod_meta(req.pod_meta),
        runtime_handler=req.runtime_handler,
        labels=dict(req.labels),
        annotations=dict(req.annotations),
        cgroup_parent=req.cgroup_parent,
        overhead=_opt_resources(req.HasField("overhead"), req.overhead),
        resources=_opt_resources(req.HasField("resources"), req.resources),
    )


def sandbox_response(ctx: PodSandboxContext) -> api_pb2.PodSandboxHookResponse:
    """The response for a sandbox context (labels, annotations, cgroup parent, resources)."""
    return api_pb2.PodSandboxHookResponse(
        labels=dict(ctx.labels),
        annotations=dict(ctx.annotations),
        cgroup_parent=ctx.cgroup_parent,
        resources=_opt_proto(ctx.resources),
    )


def sandbox_request(ctx: PodSandboxContext) -> api_pb2.PodSandboxHookRequest:
    """Encode a sandbox context as a request (what the proxy would send)."""
    return api_pb2.PodSandboxHookRequest(
        pod_meta=_pod_meta_proto(ctx.pod_meta),
        runtime_handler=ctx.runtime_handler,
        labels=dict(ctx.labels),
        annotations=dict(ctx.annotations),
        cgroup_parent=ctx.cgroup_parent,
        overhead=_opt_proto(ctx.overhead),
        resources=_opt_proto(ctx.resources),
    )
