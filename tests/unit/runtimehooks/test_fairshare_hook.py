"""The fair-share (Gemini) hook: env for opted-in containers, fail closed, registry wiring."""

from __future__ import annotations

import pytest

from apis.fairshare import DefaultLimit, FairShareSpec
from runtimehooks.context import ContainerContext, ContainerMeta, PodMeta
from runtimehooks.hooks import new_default_registry
from runtimehooks.hooks.fairshare import (
    REASON_FAIRSHARE_INVALID,
    REASON_FAIRSHARE_REFUSED,
    FairShareEndpoint,
    FairShareHook,
    FairShareHookOptions,
    FairShareTarget,
)
from runtimehooks.ports import Denial
from runtimehooks.registry import FailurePolicy, Stage

ALLOC = "scheduling.koordinator.sh/device-allocated"
PROVIDER = "koordinator.sh/gpu-isolation-provider"
SHARED = (
    '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"25",'
    '"koordinator.sh/gpu-memory":"4Gi","koordinator.sh/gpu-memory-ratio":"5"}}]}'
)
WHOLE = '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
META = PodMeta(name="infer-0", uid="0b1c2d3e-aaaa-bbbb-cccc-000000000001", namespace="team")


class FakeServer:
    """Records what it was asked to serve; answers fixed ports or fails."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.asked: list[FairShareTarget] = []
        self.fail = fail

    def __call__(self, target: FairShareTarget) -> FairShareEndpoint:
        self.asked.append(target)
        if self.fail is not None:
            raise self.fail
        return FairShareEndpoint(target.uid, "10.0.0.5", 40001, "10.0.0.5", 40123)


def ctx(labels: dict[str, str], annotations: dict[str, str], **kw: object) -> ContainerContext:
    return ContainerContext(
        pod_meta=META,
        pod_labels=labels,
        pod_annotations=annotations,
        container_envs={"LD_PRELOAD": "/user/lib.so", "KEEP": "1"},
        **kw,  # type: ignore[arg-type]
    )


def test_opted_in_container_gets_gemini_env() -> None:
    server = FakeServer()
    hook = FairShareHook(server, FairShareHookOptions("/opt/gem/libgemhook.so.1"))
    out = hook(ctx({PROVIDER: "Gemini"}, {ALLOC: SHARED}))
    assert dict(out.container_envs) == {
        "KEEP": "1",
        "LD_PRELOAD": "/opt/gem/libgemhook.so.1",
        "POD_NAME": META.uid,
        "POD_MANAGER_IP": "10.0.0.5",
        "POD_MANAGER_PORT": "40123",
        "SCHEDULER_IP": "10.0.0.5",
        "SCHEDULER_PORT": "40001",
    }
    assert server.asked == [
        FairShareTarget(META.uid, "team", "infer-0", FairShareSpec(3, 0.25, 1.0, 4 * 2**30))
    ]


def test_default_limit_is_a_node_setting() -> None:
    server = FakeServer()
    FairShareHook(server, FairShareHookOptions(default_limit=DefaultLimit.REQUEST))(
        ctx({PROVIDER: "Gemini"}, {ALLOC: SHARED})
    )
    assert server.asked[0].spec.limit == 0.25


UNCHANGED = [
    pytest.param({}, {ALLOC: SHARED}, id="not-opted-in"),
    pytest.param({PROVIDER: "HAMi-core"}, {ALLOC: SHARED}, id="hami-core"),
    pytest.param({PROVIDER: "Gemini"}, {}, id="no-allocation"),
    pytest.param({PROVIDER: "Gemini"}, {ALLOC: WHOLE}, id="whole-card"),
]


@pytest.mark.parametrize(("labels", "annotations"), UNCHANGED)
def test_other_containers_unchanged(labels: dict[str, str], annotations: dict[str, str]) -> None:
    server = FakeServer()
    c = ctx(labels, annotations)
    assert FairShareHook(server)(c) is c
    assert server.asked == []


class Denials:
    def __init__(self) -> None:
        self.seen: list[Denial] = []

    def denied(self, denial: Denial) -> None:
        self.seen.append(denial)


FAIL_CLOSED = [
    pytest.param(
        {ALLOC: SHARED, "koordinator.sh/gpu-core-limit": "10"},
        META,
        None,
        REASON_FAIRSHARE_INVALID,
        id="limit-below-request",
    ),
    pytest.param({ALLOC: "{"}, META, None, REASON_FAIRSHARE_INVALID, id="malformed-allocation"),
    pytest.param({ALLOC: SHARED}, PodMeta(name="x"), None, REASON_FAIRSHARE_INVALID, id="no-uid"),
    pytest.param(
        {ALLOC: SHARED}, META, OSError("no port"), REASON_FAIRSHARE_REFUSED, id="cannot-serve"
    ),
    pytest.param(
        {ALLOC: SHARED}, META, ValueError("bad share"), REASON_FAIRSHARE_REFUSED, id="refused"
    ),
]


@pytest.mark.parametrize(("annotations", "meta", "fail", "reason"), FAIL_CLOSED)
def test_fail_closed(
    annotations: dict[str, str], meta: PodMeta, fail: Exception | None, reason: str
) -> None:
    """Issue 25.4: an error answer is ignored by the proxy (the container starts with every
    GPU, unthrottled); a refused container is answered with no GPU instead."""
    denials = Denials()
    hook = FairShareHook(FakeServer(fail), denials=denials)
    c = ContainerContext(
        pod_meta=meta,
        container_meta=ContainerMeta(name="cuda"),
        pod_labels={PROVIDER: "Gemini"},
        pod_annotations=annotations,
        container_envs={"NVIDIA_VISIBLE_DEVICES": "all", "KEEP": "1"},
    )
    out = hook(c)
    assert dict(out.container_envs) == {"NVIDIA_VISIBLE_DEVICES": "void", "KEEP": "1"}
    assert [(d.pod, d.container, d.reason) for d in denials.seen] == [(meta, "cuda", reason)]


def test_registered_after_the_gpu_hook_and_failing_closed() -> None:
    registry = new_default_registry(fairshare=FairShareHook(FakeServer(OSError("down"))))
    names = [s.name for s in registry.hooks(Stage.PRE_CREATE_CONTAINER)]
    assert names == ["gpu-env-inject", "gemini-fairshare"]
    assert registry.hooks(Stage.PRE_CREATE_CONTAINER)[1].policy is FailurePolicy.FAIL
    out = registry.run_container(
        Stage.PRE_CREATE_CONTAINER, ctx({PROVIDER: "Gemini"}, {ALLOC: SHARED})
    )
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == "void"  # not the GPU hook's "3"


def test_registry_sets_both_hooks_envs() -> None:
    registry = new_default_registry(fairshare=FairShareHook(FakeServer()))
    out = registry.run_container(
        Stage.PRE_CREATE_CONTAINER, ctx({PROVIDER: "Gemini"}, {ALLOC: SHARED})
    )
    assert out.container_envs["NVIDIA_VISIBLE_DEVICES"] == "3"
    assert out.container_envs["POD_MANAGER_PORT"] == "40123"


def test_empty_library_rejected() -> None:
    with pytest.raises(ValueError, match="library"):
        FairShareHookOptions(library="")
