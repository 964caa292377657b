"""scheduler.webhook.guard: allocation annotations are written by the scheduler and the agent
only; every other change of them is refused, unchanged ones always pass."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.webhook.guard import PROTECTED_ANNOTATIONS, guard_problem
from scheduler.webhook.policy import DEFAULT_AGENT, DEFAULT_SCHEDULER_IDENTITY, WebhookPolicy
from tests.unit.webhook.reviews import pod, review

ALLOCATED = "scheduling.koordinator.sh/device-allocated"
NEGATIVE = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"-100"}}]}'
POLICY = WebhookPolicy()
HELD = pod(annotations={ALLOCATED: NEGATIVE}, node="n1")


@pytest.mark.parametrize(
    ("obj", "kw", "refused"),
    [
        (HELD, {}, True),
        (HELD, {"user": DEFAULT_SCHEDULER_IDENTITY}, False),
        (HELD, {"user": DEFAULT_AGENT}, False),
        (HELD, {"user": "admin", "groups": ["system:masters"]}, True),
        (pod(annotations={"ALIYUN_COM_GPU_MEM_IDX": "0"}), {}, True),
        (pod(annotations={"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}), {}, True),
        (pod(annotations={"other": "x"}), {}, False),
        (pod(), {}, False),
        (HELD, {"operation": "UPDATE", "old": pod(node="n1")}, True),
        (pod(node="n1"), {"operation": "UPDATE", "old": HELD}, True),
        (
            pod(annotations={ALLOCATED: "{}"}),
            {"operation": "UPDATE", "old": pod(annotations={ALLOCATED: "{}"})},
            False,
        ),
        (
            pod(annotations={ALLOCATED: "{}"}, labels={"x": "y"}),
            {"operation": "UPDATE", "old": pod(annotations={ALLOCATED: "{}"})},
            False,
        ),
        (HELD, {"operation": "UPDATE", "old": pod(), "sub_resource": "status"}, True),
        (HELD, {"sub_resource": "binding"}, False),
        (HELD, {"operation": "DELETE"}, False),
        (HELD, {"resource": ("scheduling.koordinator.sh", "v1alpha1", "devices")}, False),
    ],
    ids=[
        "create",
        "scheduler",
        "agent",
        "masters-not-by-default",
        "gpushare-idx",
        "gpushare-assigned",
        "other-annotation",
        "none",
        "update-sets",
        "update-removes",
        "update-unchanged",
        "update-label",
        "status-sets",
        "binding",
        "delete",
        "not-a-pod",
    ],
)
def test_guard(obj: dict[str, Any], kw: dict[str, Any], refused: bool) -> None:
    problem = guard_problem(review(obj, **kw), POLICY)
    assert (problem is not None) == refused, problem


def test_the_message_names_the_annotation_and_the_user() -> None:
    problem = guard_problem(review(HELD, user="alice"), POLICY)
    assert problem == (
        f'metadata.annotations[{ALLOCATED}]: user "alice" sets a device allocation; only '
        "koord-scheduler (through pods/binding) and the node agent write allocations"
    )


def test_writers_are_configurable_by_user_and_group() -> None:
    policy = WebhookPolicy(allocation_writers=("sched",), allocation_writer_groups=("ops",))
    assert guard_problem(review(HELD, user="sched"), policy) is None
    assert guard_problem(review(HELD, user="bob", groups=["ops"]), policy) is None
    assert guard_problem(review(HELD, user=DEFAULT_SCHEDULER_IDENTITY), policy) is not None


def test_every_gpushare_allocation_annotation_is_protected() -> None:
    for key in PROTECTED_ANNOTATIONS:
        assert guard_problem(review(pod(annotations={key: "1"})), POLICY) is not None, key


SKIP = "runtimeproxy.koordinator.sh/skip-hookserver"


@pytest.mark.parametrize(
    ("obj", "kw", "refused"),
    [
        (pod(labels={SKIP: "true"}), {}, True),
        (pod(labels={SKIP: "True"}), {}, True),
        (pod(labels={SKIP: "true"}), {"user": DEFAULT_AGENT}, True),
        (pod(labels={SKIP: "true"}), {"user": "admin", "groups": ["system:masters"]}, True),
        (pod(labels={SKIP: "true"}), {"operation": "UPDATE", "old": pod()}, True),
        (pod(), {"operation": "UPDATE", "old": pod(labels={SKIP: "true"})}, False),
        (
            pod(labels={SKIP: "true", "x": "y"}),
            {"operation": "UPDATE", "old": pod(labels={SKIP: "true"})},
            False,
        ),
        (pod(labels={"other": "true"}), {}, False),
    ],
    ids=[
        "create",
        "create-other-case",
        "not-even-the-agent",
        "not-even-masters",
        "update-sets",
        "update-removes",
        "update-unchanged",
        "other-label",
    ],
)
def test_a_tenant_pod_cannot_skip_the_runtime_hooks(
    obj: dict[str, Any], kw: dict[str, Any], refused: bool
) -> None:
    # koord-runtime-proxy never sends a pod with this label to a hook server: a tenant's pod
    # labelled so would skip the GPU hook and see what its image asks for (every card).
    problem = guard_problem(review(obj, **kw), POLICY)
    assert (problem is not None) == refused, problem
    if refused:
        assert problem is not None and problem.startswith(f"metadata.labels[{SKIP}]: ")
