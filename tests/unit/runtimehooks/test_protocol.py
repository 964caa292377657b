"""runtimehooks.protocol: proto <-> context round trips, echo, message presence."""

from __future__ import annotations

import pytest

from runtimehooks import protocol
from runtimehooks.api import api_pb2
from runtimehooks.context import (
    ContainerContext,
    ContainerMeta,
    HugepageLimit,
    PodMeta,
    PodSandboxContext,
    Resources,
)

FULL_RESOURCES = Resources(
    cpu_period=100000,
    cpu_quota=-1,
    cpu_shares=1024,
    memory_limit_in_bytes=1 << 30,
    oom_score_adj=-998,
    cpuset_cpus="0-3",
    cpuset_mems="0",
    hugepage_limits=(HugepageLimit("2MB", 1 << 21), HugepageLimit("1GB", 1 << 63)),
    unified={"memory.high": "max", "io.weight": "default 100"},
    memory_swap_limit_in_bytes=2 << 30,
)

CONTAINERS = [
    pytest.param(ContainerContext(), id="empty"),
    pytest.param(
        ContainerContext(
            pod_meta=PodMeta("p", "uid-1", "ns", 2),
            container_meta=ContainerMeta("c", 1, "abc123"),
            pod_labels={"app": "x"},
            pod_annotations={"a": "1", "é": "ü"},
            container_annotations={"io.kubernetes.container.name": "c"},
            container_envs={"PATH": "/bin", "EMPTY": ""},
            container_resources=FULL_RESOURCES,
            pod_resources=Resources(),
            pod_cgroup_parent="/kubepods/burstable/pod-uid-1",
        ),
        id="full",
    ),
    pytest.param(ContainerContext(pod_resources=Resources(cpu_shares=2)), id="pod-resources-only"),
]

SANDBOXES = [
    pytest.param(PodSandboxContext(), id="empty"),
    pytest.param(
        PodSandboxContext(
            pod_meta=PodMeta("p", "u", "ns", 0),
            runtime_handler="nvidia",
            labels={"l": "1"},
            annotations={"a": "2"},
            cgroup_parent="/kubepods/pod-u",
            overhead=Resources(cpu_shares=10),
            resources=FULL_RESOURCES,
        ),
        id="full",
    ),
]


@pytest.mark.parametrize("ctx", CONTAINERS)
def test_container_round_trip(ctx: ContainerContext) -> None:
    req = protocol.container_request(ctx)
    wire = api_pb2.ContainerResourceHookRequest.FromString(req.SerializeToString())
    assert protocol.container_context(wire) == ctx


@pytest.mark.parametrize("ctx", SANDBOXES)
def test_sandbox_round_trip(ctx: PodSandboxContext) -> None:
    req = protocol.sandbox_request(ctx)
    wire = api_pb2.PodSandboxHookRequest.FromString(req.SerializeToString())
    assert protocol.sandbox_context(wire) == ctx


@pytest.mark.parametrize("ctx", CONTAINERS)
def test_container_response_echoes_request(ctx: ContainerContext) -> None:
    req = protocol.container_request(ctx)
    resp = protocol.container_response(protocol.container_context(req))
    assert dict(resp.container_envs) == dict(req.container_envs)
    assert dict(resp.container_annotations) == dict(req.container_annotations)
    assert resp.pod_cgroup_parent == req.pod_cgroup_parent
    assert resp.HasField("container_resources") == req.HasField("container_resources")
    assert resp.container_resources == req.container_resources


@pytest.mark.parametrize("ctx", SANDBOXES)
def test_sandbox_response_echoes_request(ctx: PodSandboxContext) -> None:
    req = protocol.sandbox_request(ctx)
    resp = protocol.sandbox_response(protocol.sandbox_context(req))
    assert dict(resp.labels) == dict(req.labels)
    assert dict(resp.annotations) == dict(req.annotations)
    assert resp.cgroup_parent == req.cgroup_parent
    assert resp.HasField("resources") == req.HasField("resources")
    assert resp.resources == req.resources


def test_presence_absent_vs_zero() -> None:
    absent = protocol.container_context(api_pb2.ContainerResourceHookRequest())
    assert absent.container_resources is None
    zero = protocol.container_context(
        api_pb2.ContainerResourceHookRequest(container_resources=api_pb2.LinuxContainerResources())
    )
    assert zero.container_resources == Resources()
    assert protocol.container_response(zero).HasField("container_resources")
    assert not protocol.container_response(absent).HasField("container_resources")


def test_response_carries_hook_changes() -> None:
    ctx = ContainerContext(container_envs={"A": "1"}).with_envs({"NVIDIA_VISIBLE_DEVICES": "0"})
    resp = protocol.container_response(ctx)
    assert dict(resp.container_envs) == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "0"}


def test_resources_round_trip() -> None:
    assert protocol.resources_from_proto(protocol.resources_to_proto(FULL_RESOURCES)) == (
        FULL_RESOURCES
    )
