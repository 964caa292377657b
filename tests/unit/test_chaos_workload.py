"""The chaos tier's workload pods (tests/e2e/chaos/workload.py): which of them name the
scheduler themselves and which are left to koord-webhook.

The tier's check is "every pod carries the scheduler's name". The webhook's mutate names only
pods that ask for a GPU (by design), so a CPU-only pod created without a name is admitted with
``default-scheduler`` and never scheduled: that was the 207 (217 on replay) unnamed pods of
seed 371751008, every one of them CPU-only. Here: a B1 pod that asks for a GPU names no
scheduler, a CPU-only one names it, and after the API server's defaulting and the real
``mutate`` every B1 pod carries the scheduler's name.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from scheduler.webhook.mutate import DEFAULT_SCHEDULER, mutate
from scheduler.webhook.policy import WebhookPolicy
from scheduler.webhook.review import Review
from tests.e2e.chaos.workload import asks_for_gpu, b1_limits, b1_pod

SCHEDULER = "koord-chaos"
SELECTOR = {"chaos": "yes"}
BASE = {"cpu": "1", "memory": "4Gi"}

MIX = [
    pytest.param(BASE | {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"},
                 True, id="shared-ratio"),
    pytest.param(BASE | {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory": "4Gi"},
                 True, id="shared-memory"),
    pytest.param(BASE | {"nvidia.com/gpu": "1"}, True, id="one-gpu"),
    pytest.param(BASE | {"nvidia.com/gpu": "2"}, True, id="two-gpus"),
    pytest.param(dict(BASE), False, id="cpu-only"),
]  # fmt: skip


def admitted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it: schedulerName defaulted, then the mutate patch
    (only add/replace of /spec/schedulerName: the tier's webhook does not translate)."""
    out = copy.deepcopy(pod)
    out["spec"].setdefault("schedulerName", DEFAULT_SCHEDULER)
    review = Review(
        api_version="admission.k8s.io/v1",
        uid="u",
        operation="CREATE",
        resource="/v1/pods",
        namespace="chaos",
        name=out["metadata"]["name"],
        object=out,
    )
    for op in mutate(review, WebhookPolicy(scheduler_name=SCHEDULER)):
        assert op["op"] in ("add", "replace") and op["path"] == "/spec/schedulerName", op
        out["spec"]["schedulerName"] = op["value"]
    return out


@pytest.mark.parametrize(("limits", "gpu"), MIX)
def test_only_cpu_only_pods_name_the_scheduler_themselves(
    limits: dict[str, str], gpu: bool
) -> None:
    pod = b1_pod("p-00001", SCHEDULER, limits, SELECTOR)
    assert asks_for_gpu(limits) is gpu
    assert ("schedulerName" in pod["spec"]) is not gpu
    if not gpu:
        assert pod["spec"]["schedulerName"] == SCHEDULER
    assert pod["spec"]["nodeSelector"] == SELECTOR


@pytest.mark.parametrize(("limits", "gpu"), MIX)
def test_every_pod_of_the_mix_is_admitted_with_the_schedulers_name(
    limits: dict[str, str], gpu: bool
) -> None:
    assert admitted(b1_pod("p-00001", SCHEDULER, limits, SELECTOR))["spec"]["schedulerName"] == (
        SCHEDULER
    )


def test_the_drawn_mix_has_both_kinds_and_all_end_named() -> None:
    rng = random.Random(371751008)
    pods = [b1_pod(f"p-{i:05d}", SCHEDULER, b1_limits(rng), SELECTOR) for i in range(500)]
    unnamed = [p for p in pods if "schedulerName" not in p["spec"]]
    assert 0 < len(unnamed) < len(pods)
    assert all(admitted(p)["spec"]["schedulerName"] == SCHEDULER for p in pods)
