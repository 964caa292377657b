"""runtimehooks.registry: order, failure policies, stage checks, timing."""

from __future__ import annotations

import pytest

from runtimehooks.context import ContainerContext, HookInputError, PodSandboxContext
from runtimehooks.registry import (
    CONTAINER_STAGES,
    SANDBOX_STAGES,
    ContainerHook,
    FailurePolicy,
    HookFailedError,
    HookRegistry,
    Stage,
)


class RecordingObserver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def observe(self, stage: str, result: str, seconds: float) -> None:
        self.calls.append((stage, result, seconds))


class StepClock:
    """Each reading is one second after the previous one."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def set_env(name: str, value: str) -> ContainerHook:
    def hook(ctx: ContainerContext) -> ContainerContext:
        return ctx.with_envs({name: value})

    return hook


def boom(ctx: ContainerContext) -> ContainerContext:
    raise RuntimeError("boom")


def bad_input(ctx: ContainerContext) -> ContainerContext:
    raise HookInputError("bad annotation")


def new_registry() -> tuple[HookRegistry, RecordingObserver]:
    observer = RecordingObserver()
    return HookRegistry(observer=observer, clock=StepClock()), observer


def test_stage_names_are_the_proxys() -> None:
    assert [s.value for s in Stage] == [
        "PreRunPodSandbox",
        "PostStopPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostStopContainer",
    ]
    assert set(Stage) == SANDBOX_STAGES | CONTAINER_STAGES
    assert not SANDBOX_STAGES & CONTAINER_STAGES


def test_hooks_run_in_registration_order_and_chain() -> None:
    reg, observer = new_registry()
    reg.register_container_hook(Stage.PRE_CREATE_CONTAINER, "a", set_env("X", "a"))
    reg.register_container_hook(Stage.PRE_CREATE_CONTAINER, "b", set_env("X", "b"))
    out = reg.run_container(Stage.PRE_CREATE_CONTAINER, ContainerContext())
    assert out.container_envs == {"X": "b"}
    assert [h.name for h in reg.hooks(Stage.PRE_CREATE_CONTAINER)] == ["a", "b"]
    assert observer.calls == [("PreCreateContainer", "success", 1.0)] * 2


def test_stage_without_hooks_returns_context_unchanged() -> None:
    reg, observer = new_registry()
    ctx = ContainerContext(container_envs={"A": "1"})
    assert reg.run_container(Stage.POST_STOP_CONTAINER, ctx) is ctx
    sandbox = PodSandboxContext(labels={"a": "b"})
    assert reg.run_sandbox(Stage.PRE_RUN_POD_SANDBOX, sandbox) is sandbox
    assert observer.calls == []


def test_ignore_policy_continues_with_unchanged_context() -> None:
    reg, observer = new_registry()
    reg.register_container_hook(Stage.PRE_START_CONTAINER, "a", set_env("A", "1"))
    reg.register_container_hook(Stage.PRE_START_CONTAINER, "boom", boom, FailurePolicy.IGNORE)
    reg.register_container_hook(Stage.PRE_START_CONTAINER, "c", set_env("C", "3"))
    out = reg.run_container(Stage.PRE_START_CONTAINER, ContainerContext())
    assert out.container_envs == {"A": "1", "C": "3"}
    assert [r for _, r, _ in observer.calls] == ["success", "error", "success"]


def test_fail_policy_raises_hook_failed() -> None:
    reg, observer = new_registry()
    reg.register_container_hook(Stage.PRE_START_CONTAINER, "boom", boom, FailurePolicy.FAIL)
    reg.register_container_hook(Stage.PRE_START_CONTAINER, "never", set_env("N", "1"))
    with pytest.raises(HookFailedError, match="'boom' failed at PreStartContainer: boom") as ei:
        reg.run_container(Stage.PRE_START_CONTAINER, ContainerContext())
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert ei.value.hook == "boom"
    assert observer.calls == [("PreStartContainer", "error", 1.0)]


@pytest.mark.parametrize("policy", list(FailurePolicy), ids=[p.value for p in FailurePolicy])
def test_input_errors_propagate_under_every_policy(policy: FailurePolicy) -> None:
    reg, observer = new_registry()
    reg.register_container_hook(Stage.PRE_CREATE_CONTAINER, "bad", bad_input, policy)
    with pytest.raises(HookInputError, match="bad annotation"):
        reg.run_container(Stage.PRE_CREATE_CONTAINER, ContainerContext())
    assert observer.calls == [("PreCreateContainer", "invalid", 1.0)]


def test_hook_returning_wrong_type_is_an_error() -> None:
    reg, _ = new_registry()
    reg.register_container_hook(
        Stage.PRE_CREATE_CONTAINER,
        "none",
        lambda ctx: None,  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(HookFailedError, match="returned NoneType"):
        reg.run_container(Stage.PRE_CREATE_CONTAINER, ContainerContext())


def test_sandbox_hooks() -> None:
    reg, _ = new_registry()
    reg.register_sandbox_hook(
        Stage.PRE_RUN_POD_SANDBOX,
        "label",
        lambda ctx: PodSandboxContext(labels={**ctx.labels, "x": "y"}),
    )
    out = reg.run_sandbox(Stage.PRE_RUN_POD_SANDBOX, PodSandboxContext(labels={"a": "b"}))
    assert out.labels == {"a": "b", "x": "y"}


@pytest.mark.parametrize(
    ("register", "stage"),
    [
        pytest.param("container", Stage.PRE_RUN_POD_SANDBOX, id="container-hook-at-sandbox"),
        pytest.param("sandbox", Stage.PRE_CREATE_CONTAINER, id="sandbox-hook-at-container"),
        pytest.param("container", "PreCreate", id="unknown-stage"),
    ],
)
def test_register_rejects_wrong_stage(register: str, stage: Stage) -> None:
    reg = HookRegistry()
    fn = reg.register_container_hook if register == "container" else reg.register_sandbox_hook
    with pytest.raises(ValueError):
        fn(stage, "h", lambda ctx: ctx)


def test_run_rejects_wrong_stage() -> None:
    reg = HookRegistry()
    with pytest.raises(ValueError):
        reg.run_container(Stage.PRE_RUN_POD_SANDBOX, ContainerContext())
    with pytest.raises(ValueError):
        reg.run_sandbox(Stage.PRE_CREATE_CONTAINER, PodSandboxContext())


def test_duplicate_name_rejected() -> None:
    reg = HookRegistry()
    reg.register_container_hook(Stage.PRE_CREATE_CONTAINER, "h", set_env("A", "1"))
    with pytest.raises(ValueError, match="already registered"):
        reg.register_container_hook(Stage.PRE_CREATE_CONTAINER, "h", set_env("A", "1"))


def test_stages_lists_stages_with_hooks_in_order() -> None:
    reg = HookRegistry()
    assert reg.stages() == []
    reg.register_container_hook(Stage.POST_STOP_CONTAINER, "b", set_env("B", "1"))
    reg.register_container_hook("PreCreateContainer", "a", set_env("A", "1"))  # type: ignore[arg-type]
    assert reg.stages() == [Stage.PRE_CREATE_CONTAINER, Stage.POST_STOP_CONTAINER]


def test_registries_are_independent() -> None:
    a, b = HookRegistry(), HookRegistry()
    a.register_container_hook(Stage.PRE_CREATE_CONTAINER, "h", set_env("A", "1"))
    assert b.hooks(Stage.PRE_CREATE_CONTAINER) == ()
