"""scheduler.webhook.mutate: GPU pods get spec.schedulerName, minimally and idempotently;
optional translation of nvidia.com/gpu into Koordinator's resources."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.webhook.mutate import mutate, pointer
from scheduler.webhook.policy import WebhookPolicy
from tests.unit.webhook.reviews import apply_patch, pod, review

POLICY = WebhookPolicy()
SET = [{"op": "replace", "path": "/spec/schedulerName", "value": "koord-scheduler"}]
ADD = [{"op": "add", "path": "/spec/schedulerName", "value": "koord-scheduler"}]


@pytest.mark.parametrize(
    ("obj", "kw", "want"),
    [
        (pod(limits={"nvidia.com/gpu": "1"}), {}, SET),
        (
            pod(limits={"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
            {},
            SET,
        ),
        (pod(limits={"koordinator.sh/gpu": "100"}), {}, SET),
        (pod(limits={"koordinator.sh/gpu-memory": "8Gi"}), {}, SET),
        (pod(limits={"aliyun.com/gpu-mem": "4"}), {}, SET),
        (pod(requests={"nvidia.com/gpu": "1"}), {}, SET),
        (pod(limits={"nvidia.com/gpu": "1"}, scheduler=None), {}, ADD),
        (pod(limits={"nvidia.com/gpu": "1"}, scheduler=""), {}, SET),
        (pod(init=[{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]), {}, SET),
        (pod(limits={"nvidia.com/gpu": "1"}, scheduler="volcano"), {}, []),
        (pod(limits={"nvidia.com/gpu": "1"}, scheduler="koord-scheduler"), {}, []),
        (pod(limits={"cpu": "1", "koordinator.sh/rdma": "100"}), {}, []),
        (
            pod(limits={"nvidia.com/gpu": "1"}, labels={"koordinator.sh/webhook": "disabled"}),
            {},
            [],
        ),
        (pod(limits={"nvidia.com/gpu": "1"}, node="n1"), {}, []),
        (pod(limits={"nvidia.com/gpu": "1"}), {"operation": "UPDATE", "old": pod()}, []),
        (pod(limits={"nvidia.com/gpu": "1"}), {"sub_resource": "status"}, []),
        (pod(limits={"nvidia.com/gpu": "1"}), {"resource": ("apps", "v1", "deployments")}, []),
        ({"metadata": {"name": "x"}, "spec": "garbage"}, {}, []),
        (pod(containers=["garbage", {"resources": "x"}]), {}, []),
    ],
    ids=[
        "nvidia",
        "shared",
        "koord-gpu",
        "memory",
        "gpushare",
        "requests-only",
        "absent",
        "empty",
        "init",
        "other-scheduler",
        "ours",
        "not-gpu",
        "opt-out",
        "node-name",
        "update",
        "subresource",
        "not-a-pod",
        "bad-spec",
        "bad-containers",
    ],
)
def test_mutation(obj: dict[str, Any], kw: dict[str, Any], want: list[dict[str, Any]]) -> None:
    assert mutate(review(obj, **kw), POLICY) == want


def test_resources_and_scheduler_are_configurable() -> None:
    policy = WebhookPolicy(scheduler_name="gpu-sched", gpu_resources=("example.com/*",))
    got = mutate(review(pod(limits={"example.com/npu": "1"})), policy)
    assert got == [{"op": "replace", "path": "/spec/schedulerName", "value": "gpu-sched"}]
    assert mutate(review(pod(limits={"nvidia.com/gpu": "1"})), policy) == []


TRANSLATE = WebhookPolicy(translate_nvidia_gpu=True)


def test_translation_rewrites_whole_gpus_and_is_idempotent() -> None:
    before = pod(limits={"nvidia.com/gpu": "2", "cpu": "1"}, requests={"nvidia.com/gpu": "2"})
    patch = mutate(review(before), TRANSLATE)
    after = apply_patch(before, patch)
    res = after["spec"]["containers"][0]["resources"]
    want = {"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}
    assert res["limits"] == {"cpu": "1", **want} and res["requests"] == want
    assert after["spec"]["schedulerName"] == "koord-scheduler"
    assert mutate(review(after), TRANSLATE) == []  # reinvocation changes nothing
    assert mutate(review(after), POLICY) == []


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": "0.5"},
        {"nvidia.com/gpu": "-1"},
        {"nvidia.com/gpu": "two"},
        {"nvidia.com/gpu": "1", "koordinator.sh/gpu-core": "100"},
    ],
    ids=["fraction", "negative", "garbage", "mixed"],
)
def test_translation_leaves_what_it_cannot_translate(limits: dict[str, str]) -> None:
    assert mutate(review(pod(limits=limits)), TRANSLATE) == SET


def test_pointers_escape_slash_and_tilde() -> None:
    assert pointer("spec", "containers", 0, "nvidia.com/gpu", "a~b") == (
        "/spec/containers/0/nvidia.com~1gpu/a~0b"
    )
