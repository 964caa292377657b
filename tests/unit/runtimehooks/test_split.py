"""runtimehooks.hooks.split: GPU containers and their shares (properties over random pods)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from runtimehooks.hooks.split import container_share, gpu_containers
from runtimehooks.ports import ContainerKind, ContainerSpec, PodSpec

RESOURCES = ["nvidia.com/gpu", "koordinator.sh/gpu", "koordinator.sh/gpu-core",
             "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio",
             "aliyun.com/gpu-mem"]  # fmt: skip

requests = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 400), max_size=3)


@st.composite
def pods(draw: st.DrawFn) -> PodSpec:
    kinds = draw(st.lists(st.sampled_from(list(ContainerKind)), min_size=1, max_size=6))
    containers = [ContainerSpec(f"c{i}", k, draw(requests)) for i, k in enumerate(kinds)]
    containers.sort(key=lambda c: c.kind is ContainerKind.APP)  # init containers first
    return PodSpec("uid", tuple(containers))


card_bytes = st.one_of(st.none(), st.integers(1, 200).map(lambda g: Fraction(g << 30)))


@given(pods(), card_bytes)
def test_containers_running_together_never_exceed_the_pod(
    pod: PodSpec, card: Fraction | None
) -> None:
    gpu = gpu_containers(pod)
    long_running = [c for c in gpu if c.kind is not ContainerKind.INIT]
    shares = [container_share(pod, c, card) for c in long_running]
    if shares:
        assert sum(s.memory for s in shares) == 1
        assert sum(s.core for s in shares) == 1
    for c in gpu:
        share = container_share(pod, c, card)
        assert 0 <= share.memory <= 1 and 0 <= share.core <= 1
        if c.kind is ContainerKind.INIT:  # it and the sidecars before it
            before = pod.containers[: pod.containers.index(c)]
            group = [s for s in before if s.kind is ContainerKind.SIDECAR and s.requests_gpu]
            for dim in ("memory", "core"):
                total = getattr(share, dim) + sum(
                    getattr(container_share(pod, s, card), dim) for s in group
                )
                assert total == (1 if getattr(share, dim) > 0 else total) and total <= 1


@given(pods())
def test_gpu_containers_are_those_with_a_positive_gpu_request(pod: PodSpec) -> None:
    assert [c.name for c in gpu_containers(pod)] == [
        c.name for c in pod.containers if any(v > 0 for v in c.gpu_requests.values())
    ]
