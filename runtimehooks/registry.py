"""An explicit registry of runtime hooks: stage -> ordered hooks, failure policy, timing.

Role: the runtime of the hooks.  The composition root builds one ``HookRegistry``, registers
hooks on it (``runtimehooks.hooks.new_default_registry``), and hands it to the server; the
server calls ``run_container``/``run_sandbox`` once per RPC.

Invariants:

- No globals: every registry is an instance; importing this module registers nothing.
- Hooks of a stage run in registration order; each gets the context the previous one returned.
- Failure policy, per hook: ``Ignore`` logs the error and continues with the context the
  failed hook was given (contexts are immutable, so nothing it did leaks); ``Fail`` stops the
  stage and raises ``HookFailedError`` (the server answers INTERNAL).  A ``HookInputError``
  always propagates unchanged, whatever the policy: the request was wrong, the caller is told
  (INVALID_ARGUMENT).
- Every hook run is timed with the injected clock and reported to the injected observer as
  ``observe(stage, result, seconds)`` with result ``success``, ``invalid`` (HookInputError) or
  ``error`` (any other exception, ignored or not).
- Registration happens before serving; running only reads the registry, so concurrent RPCs
  need no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol, TypeVar

import structlog

from runtimehooks.context import ContainerContext, HookInputError, PodSandboxContext

__all__ = [
    "CONTAINER_STAGES",
    "SANDBOX_STAGES",
    "ContainerHook",
    "FailurePolicy",
    "HookFailedError",
    "HookObserver",
    "HookRegistry",
    "HookSpec",
    "NullObserver",
    "SandboxHook",
    "Stage",
]

log = structlog.get_logger("koordlet.runtimehooks")


class Stage(StrEnum):
    """Hook stages, spelled as koord-runtime-proxy's ``RuntimeHookType``."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"


SANDBOX_STAGES: Final = frozenset({Stage.PRE_RUN_POD_SANDBOX, Stage.POST_STOP_POD_SANDBOX})
CONTAINER_STAGES: Final = frozenset(Stage) - SANDBOX_STAGES


class FailurePolicy(StrEnum):
    """What a hook's failure does to the RPC (koord-runtime-proxy's spelling)."""

    IGNORE = "Ignore"
    FAIL = "Fail"


ContainerHook = Callable[[ContainerContext], ContainerContext]
SandboxHook = Callable[[PodSandboxContext], PodSandboxContext]

_C = TypeVar("_C", ContainerContext, PodSandboxContext)


class HookObserver(Protocol):
    """Receives one timing per hook run; the metrics module implements it."""

    def observe(self, stage: str, result: str, seconds: float) -> None: ...


class NullObserver:
    """Discards timings."""

    def observe(self, stage: str, result: str, seconds: float) -> None:
        pass


class HookFailedError(RuntimeError):
    """A hook under the Fail policy raised; ``__cause__`` is the hook's exception."""

    def __init__(self, stage: Stage, hook: str, error: BaseException) -> None:
        self.stage = stage
        self.hook = hook
        super().__init__(f"runtime hook {hook!r} failed at {stage}: {error}")


@dataclass(frozen=True, slots=True)
class HookSpec:
    """A registered hook."""

    stage: Stage
    name: str
    fn: Callable[[Any], Any]
    policy: FailurePolicy


class HookRegistry:
    """Stage -> ordered hooks; runs them with their failure policy and times each."""

    def __init__(
        self,
        observer: HookObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._observer: HookObserver = observer if observer is not None else NullObserver()
        self._clock = clock
        self._hooks: dict[Stage, list[HookSpec]] = {stage: [] for stage in Stage}

    def register_container_hook(
        self,
        stage: Stage,
        name: str,
        fn: ContainerHook,
        policy: FailurePolicy = FailurePolicy.FAIL,
    ) -> None:
        """Append a hook to a container stage."""
        stage = Stage(stage)
        if stage not in CONTAINER_STAGES:
            raise ValueError(f"{stage} is not a container stage")
        self._add(HookSpec(stage, name, fn, FailurePolicy(policy)))

    def register_sandbox_hook(
        self,
        stage: Stage,
        name: str,
        fn: SandboxHook,
        policy: FailurePolicy = FailurePolicy.FAIL,
    ) -> None:
        """Append a hook to a pod-sandbox stage."""
        stage = Stage(stage)
        if stage not in SANDBOX_STAGES:
            raise ValueError(f"{stage} is not a pod sandbox stage")
        self._add(HookSpec(stage, name, fn, FailurePolicy(policy)))

    def _add(self, spec: HookSpec) -> None:
        hooks = self._hooks[spec.stage]
        if any(h.name == spec.name for h in hooks):
            raise ValueError(f"hook {spec.name!r} is already registered at {spec.stage}")
        hooks.append(spec)

    def hooks(self, stage: Stage) -> tuple[HookSpec, ...]:
        """The hooks of a stage, in run order."""
        return tuple(self._hooks[stage])

    def stages(self) -> list[Stage]:
        """The stages that have at least one hook, in ``Stage`` order (for the registration)."""
        return [stage for stage in Stage if self._hooks[stage]]

    def run_container(self, stage: Stage, ctx: ContainerContext) -> ContainerContext:
        """Run a container stage's hooks over ``ctx``; returns the final context."""
        if stage not in CONTAINER_STAGES:
            raise ValueError(f"{stage} is not a container stage")
        return self._run(stage, ctx, ContainerContext)

    def run_sandbox(self, stage: Stage, ctx: PodSandboxContext) -> PodSandboxContext:
        """Run a pod-sandbox stage's hooks over ``ctx``; returns the final context."""
        if stage not in SANDBOX_STAGES:
            raise ValueError(f"{stage} is not a pod sandbox stage")
        return self._run(stage, ctx, PodSandboxContext)

    def _run(self, stage: Stage, ctx: _C, kind: type[_C]) -> _C:
        for spec in self._hooks[stage]:
            start = self._clock()
            try:
                out = spec.fn(ctx)
                if not isinstance(out, kind):
                    raise TypeError(f"returned {type(out).__name__}, not {kind.__name__}")
            except HookInputError:
                self._observer.observe(stage, "invalid", self._clock() - start)
                raise
            except Exception as err:
                self._observer.observe(stage, "error", self._clock() - start)
                if spec.policy is FailurePolicy.FAIL:
                    raise HookFailedError(stage, spec.name, err) from err
                log.warning(
                    "runtime hook failed, ignored",
                    hook=spec.name,
                    stage=str(stage),
                    error=str(err),
                    exc_info=True,
                )
                continue
            self._observer.observe(stage, "success", self._clock() - start)
            ctx = out
        return ctx
