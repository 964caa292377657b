"""The fair-share hook: opted-in containers get Gemini's hook library and its addresses.

Role: at PreCreateContainer, for a pod that opted in to Gemini isolation
(``koordinator.sh/gpu-isolation-provider: Gemini``, see ``apis.fairshare``) and shares one
card, ask the node's fair-share server (through the injected ``resolve``) to serve the pod,
and set the environment Gemini's hook library reads: ``LD_PRELOAD`` (the library, a node
setting), ``POD_NAME`` (the client name the server knows the pod by: its UID),
``POD_MANAGER_IP``/``POD_MANAGER_PORT`` (the pod's relay) and ``SCHEDULER_IP``/
``SCHEDULER_PORT`` (its card's scheduler).

Invariants:

- No I/O here; ``resolve`` is the only effect and is injected (the agent's server, or a fake).
- A pod that did not opt in, has no shared ``gpu`` allocation, or holds whole cards: the
  context is returned unchanged.
- Fail closed, without raising: an opted-in pod whose input is bad, or that the server
  cannot serve (``resolve`` raises), or any other failure, gets
  ``NVIDIA_VISIBLE_DEVICES=void`` (no GPU) as the GPU hook answers a failed allocation, one
  warning line and a ``Denial`` (event and metric in the agent). An error reply would not
  do: koordlet registers with koord-runtime-proxy under failure policy Ignore, so the proxy
  would start the container unchanged, with every GPU and no throttle.
- ``LD_PRELOAD`` is replaced, like the GPU hook does for HAMi-core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from apis.fairshare import (
    DEFAULT_GEMINI_LIBRARY,
    DefaultLimit,
    FairShareInputError,
    FairShareSpec,
    fairshare_spec,
)
from runtimehooks.context import ContainerContext, HookInputError
from runtimehooks.hooks.gpu import ENV_NVIDIA_VISIBLE_DEVICES, NO_GPU
from runtimehooks.ports import Denial, DenialSink

__all__ = [
    "DEFAULT_GEMINI_LIBRARY",
    "HOOK_NAME",
    "REASON_FAIRSHARE_INVALID",
    "REASON_FAIRSHARE_REFUSED",
    "FairShareEndpoint",
    "FairShareHook",
    "FairShareHookOptions",
    "FairShareTarget",
    "Resolve",
    "fairshare_env",
]

log = structlog.get_logger("koordlet.runtimehooks.fairshare")

HOOK_NAME: Final = "gemini-fairshare"
REASON_FAIRSHARE_INVALID: Final = "fairshare-invalid-input"
"""Denial reason: the pod's fair-share input cannot be read (limit, allocation, uid)."""
REASON_FAIRSHARE_REFUSED: Final = "fairshare-refused"
"""Denial reason: the node's fair-share server does not serve the pod (off, no listener,
a share it cannot take, or any other failure)."""
ENV_LD_PRELOAD: Final = "LD_PRELOAD"
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_MANAGER_IP: Final = "POD_MANAGER_IP"
ENV_POD_MANAGER_PORT: Final = "POD_MANAGER_PORT"
ENV_SCHEDULER_IP: Final = "SCHEDULER_IP"
ENV_SCHEDULER_PORT: Final = "SCHEDULER_PORT"


@dataclass(frozen=True, slots=True)
class FairShareTarget:
    """The pod the server is asked to serve."""

    uid: str
    namespace: str
    name: str
    spec: FairShareSpec


@dataclass(frozen=True, slots=True)
class FairShareEndpoint:
    """Where the pod's hook library connects, and the name it must use."""

    client_name: str
    scheduler_ip: str
    scheduler_port: int
    manager_ip: str
    manager_port: int


Resolve = Callable[[FairShareTarget], FairShareEndpoint]


@dataclass(frozen=True, slots=True)
class FairShareHookOptions:
    """Node-level settings of the fair-share hook."""

    library: str = DEFAULT_GEMINI_LIBRARY
    default_limit: DefaultLimit = DefaultLimit.FULL

    def __post_init__(self) -> None:
        object.__setattr__(self, "default_limit", DefaultLimit(self.default_limit))
        if not self.library:
            raise ValueError("the Gemini hook library path must not be empty")


def fairshare_env(
    ctx: ContainerContext, resolve: Resolve, options: FairShareHookOptions
) -> dict[str, str]:
    """The environment for ``ctx``'s container ({} when its pod is not fair-shared)."""
    try:
        spec = fairshare_spec(ctx.pod_labels, ctx.pod_annotations, options.default_limit)
    except FairShareInputError as err:
        raise HookInputError(str(err)) from None
    if spec is None:
        return {}
    meta = ctx.pod_meta
    if not meta.uid:
        raise HookInputError("a Gemini-isolated pod needs its uid in the pod sandbox metadata")
    ep = resolve(FairShareTarget(meta.uid, meta.namespace, meta.name, spec))
    return {
        ENV_LD_PRELOAD: options.library,
        ENV_POD_NAME: ep.client_name,
        ENV_POD_MANAGER_IP: ep.manager_ip,
        ENV_POD_MANAGER_PORT: str(ep.manager_port),
        ENV_SCHEDULER_IP: ep.scheduler_ip,
        ENV_SCHEDULER_PORT: str(ep.scheduler_port),
    }


class FairShareHook:
    """The PreCreateContainer hook: ``ctx`` with Gemini's environment set, or with no GPU
    when the pod opted in and cannot be served (see the module docstring)."""

    def __init__(
        self,
        resolve: Resolve,
        options: FairShareHookOptions | None = None,
        *,
        denials: DenialSink | None = None,
    ) -> None:
        self.resolve = resolve
        self.options = options if options is not None else FairShareHookOptions()
        self.denials = denials

    def __call__(self, ctx: ContainerContext) -> ContainerContext:
        try:
            return ctx.with_envs(fairshare_env(ctx, self.resolve, self.options))
        except HookInputError as err:
            return self._deny(ctx, REASON_FAIRSHARE_INVALID, str(err))
        except Exception as err:  # the server's refusal, or a bug: never every GPU
            return self._deny(ctx, REASON_FAIRSHARE_REFUSED, str(err) or repr(err))

    def _deny(self, ctx: ContainerContext, reason: str, message: str) -> ContainerContext:
        pod, container = ctx.pod_meta, ctx.container_meta.name
        log.warning(
            "fair share not served: container gets no GPU",
            pod=f"{pod.namespace}/{pod.name}",
            uid=pod.uid,
            container=container,
            reason=reason,
            error=message,
        )
        if self.denials is not None:
            try:
                self.denials.denied(Denial(pod, container, reason, f"fair share: {message}"))
            except Exception as err:
                log.error("reporting a fair-share denial failed", error=repr(err))
        return ctx.with_envs({ENV_NVIDIA_VISIBLE_DEVICES: NO_GPU})
