"""runtimehooks.context: immutable contexts and their copy-on-write helpers."""

from __future__ import annotations

import dataclasses

import pytest

from runtimehooks.context import (
    ContainerContext,
    HugepageLimit,
    PodSandboxContext,
    Resources,
)


def test_mappings_are_read_only_copies() -> None:
    envs = {"A": "1"}
    ctx = ContainerContext(container_envs=envs, pod_labels={"l": "v"})
    envs["B"] = "2"
    assert dict(ctx.container_envs) == {"A": "1"}
    with pytest.raises(TypeError):
        ctx.container_envs["C"] = "3"  # type: ignore[index]
    with pytest.raises(TypeError):
        ctx.pod_labels["x"] = "y"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.pod_cgroup_parent = "x"  # type: ignore[misc]


def test_with_envs_returns_a_new_context() -> None:
    ctx = ContainerContext(container_envs={"A": "1", "B": "2"})
    out = ctx.with_envs({"B": "x", "C": "3"})
    assert dict(out.container_envs) == {"A": "1", "B": "x", "C": "3"}
    assert dict(ctx.container_envs) == {"A": "1", "B": "2"}
    assert ctx.with_envs({}) is ctx


def test_without_envs() -> None:
    ctx = ContainerContext(container_envs={"A": "1", "B": "2"})
    assert dict(ctx.without_envs(["A", "Z"]).container_envs) == {"B": "2"}


def test_with_container_annotations() -> None:
    ctx = ContainerContext(container_annotations={"a": "1"})
    out = ctx.with_container_annotations({"b": "2"})
    assert dict(out.container_annotations) == {"a": "1", "b": "2"}
    assert ctx.with_container_annotations({}) is ctx


def test_equality_by_content() -> None:
    assert ContainerContext(container_envs={"A": "1"}) == ContainerContext(
        container_envs={"A": "1"}
    )
    assert Resources(unified={"k": "v"}, hugepage_limits=[HugepageLimit("2MB", 1)]) == Resources(  # type: ignore[arg-type]
        unified={"k": "v"}, hugepage_limits=(HugepageLimit("2MB", 1),)
    )


def test_sandbox_mappings_are_read_only() -> None:
    ctx = PodSandboxContext(labels={"a": "1"}, annotations={"b": "2"})
    with pytest.raises(TypeError):
        ctx.annotations["c"] = "3"  # type: ignore[index]
