"""apis.core pod requests: the API server's limit-to-request defaulting."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from apis.core import decode_pod, pod_requests


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "resources": resources}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"containers": [container(limits={"aliyun.com/gpu-mem": "3"})]},
            {"aliyun.com/gpu-mem": Fraction(3)},
            id="limit-only",
        ),
        pytest.param(
            {"containers": [container({"cpu": "1"}, {"cpu": "2", "nvidia.com/gpu": "1"})]},
            {"cpu": Fraction(1), "nvidia.com/gpu": Fraction(1)},
            id="request-wins",
        ),
        pytest.param(
            {
                "containers": [container(limits={"aliyun.com/gpu-mem": "2"})] * 2,
                "initContainers": [container(limits={"aliyun.com/gpu-mem": "3"})],
            },
            {"aliyun.com/gpu-mem": Fraction(4)},
            id="init-max",
        ),
    ],
)
def test_limits_stand_in_for_missing_requests(spec: Any, expected: dict[str, Fraction]) -> None:
    assert pod_requests(spec) == expected


def test_bad_limit_names_its_path() -> None:
    with pytest.raises(ValueError, match=r"spec.containers\[0\].resources.limits.cpu"):
        pod_requests({"containers": [container(limits={"cpu": "2x"})]})


def test_pods_share_the_parts_they_repeat() -> None:
    """50,000 pods of a few shapes keep a few request maps and toleration tuples, not 50,000
    (records are never mutated, so sharing is invisible but to memory)."""
    def obj(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                 "effect": "NoExecute", "tolerationSeconds": 300}],
            },
        }

    a, b = decode_pod(obj("a")), decode_pod(obj("b"))
    assert a.tolerations is b.tolerations and a.requests is b.requests
    assert a.requests_exact is b.requests_exact and a.labels is b.labels
    other = obj("c")
    other["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    c = decode_pod(other)
    assert c.requests == {"cpu": 2000} and a.requests == {"cpu": 1000}


def test_app_limits_leave_init_containers_out_as_gpushare_counts_a_pod() -> None:
    """gpushare counts ``aliyun.com/gpu-mem`` over ``spec.containers`` only (issue 27 item 5)."""
    gm = "aliyun.com/gpu-mem"
    pod = decode_pod(
        {
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {gm: "4"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {gm: "1", "cpu": "500m"}}},
                    {"name": "b", "resources": {"limits": {gm: "2"}, "requests": {gm: "2"}}},
                    {"name": "c", "resources": {"requests": {"cpu": "1"}}},
                ],
            },
        }
    )
    assert pod.app_limits == {gm: 3, "cpu": 500}
    assert pod.requests[gm] == 4  # kube's effective request: the init container's


@pytest.mark.parametrize(
    ("status", "capacity"),
    [
        pytest.param({"capacity": {"x": "2"}, "allocatable": {"x": "1"}}, {"x": 2}, id="both"),
        pytest.param({"allocatable": {"x": "1"}}, {"x": 1}, id="allocatable-only"),
        pytest.param({"capacity": {"x": "2"}}, {"x": 2}, id="capacity-only"),
    ],
)
def test_node_capacity_falls_back_to_allocatable(
    status: dict[str, Any], capacity: dict[str, int]
) -> None:
    from apis.core import decode_node

    assert decode_node({"metadata": {"name": "n"}, "status": status}).capacity == capacity


def test_on_node_equals_dataclasses_replace() -> None:
    """``Pod.on_node`` (the scheduling cycle's assumed pod) is ``dataclasses.replace``, raw
    record and every other field included."""
    import dataclasses

    from tests.builders import make_pod

    pods = [
        make_pod("a").req(cpu="1", memory="4Gi").build(),
        make_pod("b").req({"nvidia.com/gpu": "2"}).label("x", "y").annotation("k", "v").build(),
        make_pod("c").node("old").priority(7).toleration("k", "v", "NoSchedule", "Equal").build(),
    ]
    for pod in pods:
        got, want = pod.on_node("n1"), dataclasses.replace(pod, node_name="n1")
        assert got == want and got.raw is want.raw and got.node_name == "n1"
        assert all(
            getattr(got, f.name) is getattr(want, f.name)
            for f in dataclasses.fields(want)
            if f.name != "node_name"
        )
        assert pod.node_name != "n1"  # the original is untouched


def test_drop_managed_fields_from_an_object_and_a_list() -> None:
    from apis.core import drop_managed_fields

    def obj(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "managedFields": [{"fieldsV1": {"f:a": {}}}]},
            "spec": {"managedFields": "kept: not metadata"},
        }

    one = obj("a")
    assert drop_managed_fields(one) is one
    assert one == {"metadata": {"name": "a"}, "spec": {"managedFields": "kept: not metadata"}}
    page = {"metadata": {"resourceVersion": "5"}, "items": [obj("b"), "junk", {"metadata": 1}]}
    drop_managed_fields(page)
    assert page["items"][0]["metadata"] == {"name": "b"}
    assert page["items"][1:] == ["junk", {"metadata": 1}]
    for other in (None, "s", [obj("c")], {"metadata": None}):
        assert drop_managed_fields(other) is other
