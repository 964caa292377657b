"""scheduler.webhook.validate: the pods koord-scheduler would refuse are refused at create,
with the scheduler's own message placed on the container (or field) that causes it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from apis.core import decode_pod
from scheduler.devices.request import RequestError, parse_request
from scheduler.webhook.policy import WebhookPolicy
from scheduler.webhook.validate import pod_problem
from tests.unit.webhook.reviews import pod

POLICY = WebhookPolicy()
CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
MEM = "koordinator.sh/gpu-memory"
HINT = "scheduling.koordinator.sh/device-allocate-hint"
GANG = "gang.scheduling.koordinator.sh"


def _c(name: str, limits: dict[str, str], requests: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": limits}
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "image": "x", "resources": res}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (pod(limits={CORE: "50", RATIO: "50"}), None),
        (pod(limits={"nvidia.com/gpu": "2"}), None),
        (pod(limits={"cpu": "500m"}), None),
        (
            pod(limits={CORE: "30"}),
            "spec.containers[0] (main).resources: invalid resource device requests: "
            "[koordinator.sh/gpu-core]",
        ),
        (
            pod(limits={"koordinator.sh/gpu": "150"}),
            "spec.containers[0] (main).resources: invalid resource unit koordinator.sh/gpu: 150",
        ),
        (
            pod(limits={CORE: "150", RATIO: "150"}),
            "spec.containers[0] (main).resources: invalid resource device requests: "
            "[koordinator.sh/gpu-core koordinator.sh/gpu-memory-ratio]",
        ),
        (
            pod(limits={CORE: "0.5", RATIO: "50"}),
            "spec.containers[0] (main).resources.limits[koordinator.sh/gpu-core]: must be a "
            "whole number, got '0.5'",
        ),
        (
            pod(limits={"nvidia.com/gpu": "-1"}),
            "spec.containers[0] (main).resources.limits[nvidia.com/gpu]: must not be negative, "
            "got '-1'",
        ),
        (
            pod(limits={"nvidia.com/gpu": "lots"}),
            'spec.containers[0] (main).resources.limits[nvidia.com/gpu]: invalid quantity "lots"',
        ),
        (
            pod(limits={"nvidia.com/gpu": "2"}, requests={"nvidia.com/gpu": "1"}),
            "spec.containers[0] (main).resources.requests[nvidia.com/gpu]: must equal its limit "
            "(1 != 2)",
        ),
        (
            pod(requests={"nvidia.com/gpu": "1"}),
            "spec.containers[0] (main).resources.limits[nvidia.com/gpu]: required with its request",
        ),
        (
            pod(limits={"aliyun.com/gpu-mem": "4", CORE: "50"}),
            "spec.containers[0] (main).resources: aliyun.com/gpu-mem cannot be combined with "
            "koordinator.sh/gpu-core: ask for GPU memory one way",
        ),
        (
            pod(containers=[_c("a", {CORE: "50", RATIO: "50"}), _c("b", {MEM: "1Gi"})]),
            "spec (the containers' device requests together): invalid resource device requests: "
            "[koordinator.sh/gpu-core koordinator.sh/gpu-memory koordinator.sh/gpu-memory-ratio]",
        ),
        (
            pod(containers=[_c("a", {"cpu": "1"}), _c("b", {CORE: "20"})]),
            "spec.containers[1] (b).resources: invalid resource device requests: "
            "[koordinator.sh/gpu-core]",
        ),
        (
            pod(init=[_c("setup", {RATIO: "150"})]),
            "spec.initContainers[0] (setup).resources: invalid resource device requests: "
            "[koordinator.sh/gpu-memory-ratio]",
        ),
        (
            pod(limits={CORE: "50", RATIO: "50"}, annotations={HINT: "{not json"}),
            "metadata.annotations: ",
        ),
        (
            pod(annotations={f"{GANG}/name": "g"}),
            f"invalid gang spec: {GANG}/min-available: required with {GANG}/name",
        ),
        (
            pod(annotations={f"{GANG}/name": "g", f"{GANG}/min-available": "two"}),
            f"invalid gang spec: {GANG}/min-available",
        ),
        (pod(annotations={f"{GANG}/name": "g", f"{GANG}/min-available": "2"}), None),
        (
            pod(
                labels={
                    "pod-group.scheduling.sigs.k8s.io/min-available": "x",
                    "pod-group.scheduling.sigs.k8s.io": "pg",
                }
            ),
            "invalid gang spec: pod-group.scheduling.sigs.k8s.io/min-available: 'x'",
        ),
        (
            {"metadata": {"name": "x"}, "spec": {"containers": "nope"}},
            "spec.containers: expected a list, got str",
        ),
    ],
    ids=[
        "shared",
        "whole",
        "no-device",
        "core-alone",
        "koord-gpu-150",
        "ratio-150",
        "fraction",
        "negative",
        "garbage",
        "request-ne-limit",
        "request-only",
        "gpushare-mixed",
        "together",
        "second-container",
        "init",
        "hint",
        "gang-no-min",
        "gang-bad-min",
        "gang-ok",
        "pod-group-label",
        "bad-spec",
    ],
)
def test_pod_problem(obj: dict[str, Any], message: str | None) -> None:
    got = pod_problem(obj, POLICY)
    if message is None:
        assert got is None
    else:
        assert got is not None and got.startswith(message), got
        assert "\n" not in got


def test_an_unnamed_pod_is_judged_too() -> None:
    obj = pod(limits={CORE: "30"})
    obj["metadata"] = {"generateName": "web-", "namespace": "team-a"}
    assert pod_problem(obj, POLICY) is not None
    assert pod_problem(pod(limits={CORE: "30", RATIO: "30"}) | {"metadata": {}}, POLICY) is None


NAMES = [
    "nvidia.com/gpu",
    "koordinator.sh/gpu",
    "koordinator.sh/gpu.shared",
    CORE,
    MEM,
    RATIO,
    "aliyun.com/gpu-mem",
    "koordinator.sh/rdma",
]
AMOUNTS = ["1", "50", "100", "150", "200"]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_the_webhook_and_the_prefilter_agree(size: int) -> None:
    """One source of truth: for whole amounts, a pod is refused here exactly when DeviceShare's
    PreFilter (parse_request) refuses it, with the same message."""
    for names in itertools.combinations(NAMES, size):
        for amounts in itertools.product(AMOUNTS, repeat=size):
            limits = dict(zip(names, amounts, strict=True))
            obj = pod(limits=limits)
            try:
                parse_request(decode_pod(obj))
            except RequestError as err:
                want: str | None = err.message
            else:
                want = None
            got = pod_problem(obj, POLICY)
            if want is None:
                assert got is None, (limits, got)
            else:
                assert got is not None and got.endswith(want), (limits, got, want)
