"""A pod's requests as kube-scheduler v1.37 counts them (component-helpers' PodRequests with
the defaults of 1.37's feature gates): native sidecars, pod-level resources, in-place resize.

Each expected figure is worked out by hand from kube's rules, written beside the case; on a
1.20 server none of these fields exist, and the spec's sum is what counts (the first cases).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis.core import decode_pod, pod_level_requests, pod_requests, status_changes_requests


def c(name: str, cpu: str | None = None, gpu: str | None = None, **extra: Any) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if gpu is not None:
        requests["nvidia.com/gpu"] = gpu
    return {"name": name, "resources": {"requests": requests}, **extra}


SIDECAR = {"restartPolicy": "Always"}


def cs(name: str, allocated: str | None = None, actuated: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if allocated is not None:
        out["allocatedResources"] = {"cpu": allocated}
    if actuated is not None:
        out["resources"] = {"requests": {"cpu": actuated}}
    return out


INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
DEFERRED = {"type": "PodResizePending", "status": "True", "reason": "Deferred"}


@pytest.mark.parametrize(
    ("spec", "status", "cpu"),
    [
        pytest.param({"containers": [c("a", "1"), c("b", "2")]}, None, "3", id="sum"),
        pytest.param(
            {"containers": [c("a", "1")], "initContainers": [c("i", "4")]},
            None,
            "4",
            id="init-max",
        ),
        # Sidecars run beside the app: 1 + sidecar 2 = 3; the init container after the sidecar
        # runs beside it: 2 + 2 = 4 > 3.
        pytest.param(
            {"containers": [c("a", "1")], "initContainers": [c("s", "2", **SIDECAR), c("i", "2")]},
            None,
            "4",
            id="sidecar-then-init",
        ),
        # An init container before the sidecar runs alone: max(3, 1 + 2) = 3.
        pytest.param(
            {"containers": [c("a", "1")], "initContainers": [c("i", "3"), c("s", "2", **SIDECAR)]},
            None,
            "3",
            id="init-then-sidecar",
        ),
        # Pod-level cpu replaces the containers' sum (1 + 2), whatever it is.
        pytest.param(
            {"containers": [c("a", "1"), c("b", "2")], "resources": {"requests": {"cpu": "5"}}},
            None,
            "5",
            id="pod-level-replaces",
        ),
        pytest.param(
            {"containers": [c("a", "4")], "resources": {"requests": {"cpu": "2"}}},
            None,
            "2",
            id="pod-level-below-containers",
        ),
        # Resize up in flight: the kubelet allocated 3, runs with 1, the spec says 3 -> 3.
        pytest.param(
            {"containers": [c("a", "3")]},
            {"containerStatuses": [cs("a", allocated="3", actuated="1")]},
            "3",
            id="resize-up-in-flight",
        ),
        # Resize down asked for: spec 1, still allocated and running with 4 -> 4.
        pytest.param(
            {"containers": [c("a", "1")]},
            {"containerStatuses": [cs("a", allocated="4", actuated="4")]},
            "4",
            id="resize-down-not-actuated",
        ),
        # Infeasible: the spec no longer counts, what the kubelet allocated does -> 2.
        pytest.param(
            {"containers": [c("a", "8")]},
            {"conditions": [INFEASIBLE], "containerStatuses": [cs("a", allocated="2")]},
            "2",
            id="resize-infeasible",
        ),
        # Deferred: the spec still counts -> 8.
        pytest.param(
            {"containers": [c("a", "8")]},
            {"conditions": [DEFERRED], "containerStatuses": [cs("a", allocated="2")]},
            "8",
            id="resize-deferred",
        ),
        # Sums are taken per source, then compared: spec 2+1=3, allocated 1+2=3 -> 3, not 4.
        pytest.param(
            {"containers": [c("a", "2"), c("b", "1")]},
            {"containerStatuses": [cs("a", allocated="1"), cs("b", allocated="2")]},
            "3",
            id="max-of-sums-not-sum-of-maxes",
        ),
        # Pod-level status (both set) stands in for the containers': max(2, 6, 5) = 6.
        pytest.param(
            {"containers": [c("a", "2")]},
            {
                "containerStatuses": [cs("a", allocated="2", actuated="2")],
                "allocatedResources": {"cpu": "6"},
                "resources": {"requests": {"cpu": "5"}},
            },
            "6",
            id="pod-status-aggregates",
        ),
        # Pod-level request resized: spec 2, the pod's status says 3 actuated -> 3.
        pytest.param(
            {"containers": [c("a", "1")], "resources": {"requests": {"cpu": "2"}}},
            {"resources": {"requests": {"cpu": "3"}}},
            "3",
            id="pod-level-resize",
        ),
    ],
)
def test_cpu_request(spec: dict[str, Any], status: dict[str, Any] | None, cpu: str) -> None:
    assert pod_requests(spec, status=status)["cpu"] == Fraction(cpu)


def test_pod_level_leaves_devices_to_the_containers() -> None:
    """Only cpu, memory and hugepages-* can be pod-level; a GPU there is not one (the API
    server rejects it; a file may carry it) and the containers' GPUs count."""
    spec = {
        "containers": [c("a", "1", gpu="1"), c("b", "1", gpu="2")],
        "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1", "hugepages-2Mi": "2Mi"}},
    }
    reqs = pod_requests(spec)
    assert reqs["nvidia.com/gpu"] == 3
    assert reqs["cpu"] == 4
    assert reqs["hugepages-2Mi"] == 2 * 1024 * 1024
    assert pod_level_requests(spec) == {"cpu": 4, "hugepages-2Mi": 2 * 1024 * 1024}


def test_sidecar_gpu_counts_beside_the_app() -> None:
    """A GPU asked by a native sidecar is held for the pod's life beside the app's GPUs."""
    spec = {"containers": [c("a", gpu="1")], "initContainers": [c("s", gpu="1", **SIDECAR)]}
    assert pod_requests(spec)["nvidia.com/gpu"] == 2


def test_non_zero_defaults_with_pod_level_requests() -> None:
    """kube's non-zero requests for scoring: without pod-level requests each container missing
    cpu counts 100m; with a pod-level cpu request the pod's cpu is that request, and memory,
    set nowhere, is defaulted per container (200 MB each)."""
    plain = decode_pod({"metadata": {"name": "p"}, "spec": {"containers": [c("a"), c("b")]}})
    assert (plain.non_zero_cpu, plain.non_zero_memory) == (200, 2 * 200 * 1024 * 1024)
    pod_level = decode_pod(
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [c("a"), c("b")], "resources": {"requests": {"cpu": "3"}}},
        }
    )
    assert pod_level.requests["cpu"] == 3000
    assert (pod_level.non_zero_cpu, pod_level.non_zero_memory) == (3000, 2 * 200 * 1024 * 1024)


def test_a_bound_pods_requests_follow_its_resize() -> None:
    """decode_pod reads the status: a bound pod resized up holds the new size in the cache."""
    obj = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n", "containers": [c("a", "1")]},
        "status": {"containerStatuses": [cs("a", allocated="3", actuated="3")]},
    }
    assert decode_pod(obj).requests["cpu"] == 3000


@pytest.mark.parametrize(
    ("status", "where"),
    [
        ({"containerStatuses": [{"name": "a", "allocatedResources": {"cpu": "x"}}]}, "allocated"),
        ({"containerStatuses": "nope"}, "status.containerStatuses"),
        (
            {"allocatedResources": {"cpu": -1}, "resources": {"requests": {"cpu": "1"}}},
            "status.allocatedResources",
        ),
    ],
)
def test_bad_status_names_its_field(status: dict[str, Any], where: str) -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"containers": [c("a", "1")]}, "status": status}
    with pytest.raises(ValueError, match=where):
        decode_pod(obj)


_QTY = st.sampled_from(["1", "2", "1000m", "3"])


@st.composite
def _pods_with_status(draw: st.DrawFn) -> dict[str, Any]:
    names = ["a", "b"]
    containers = [c(n, draw(_QTY)) for n in names]
    statuses = []
    for n in draw(st.lists(st.sampled_from([*names, "ghost"]), max_size=3, unique=True)):
        statuses.append(
            cs(
                n,
                allocated=draw(st.one_of(st.none(), _QTY)),
                actuated=draw(st.one_of(st.none(), _QTY)),
            )
        )
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": statuses}
    if draw(st.booleans()):
        status["conditions"] = [draw(st.sampled_from([INFEASIBLE, DEFERRED]))]
    spec: dict[str, Any] = {"nodeName": "n", "containers": containers}
    if draw(st.booleans()):
        spec["resources"] = {"requests": {"cpu": draw(_QTY)}}
        if draw(st.booleans()):
            status["resources"] = {"requests": {"cpu": draw(_QTY)}}
    return {"metadata": {"name": "p"}, "spec": spec, "status": status}


@settings(max_examples=300, deadline=None)
@given(_pods_with_status())
def test_decode_skips_the_status_only_where_it_changes_nothing(obj: dict[str, Any]) -> None:
    """decode_pod leaves a pod's status out of its requests when ``status_changes_requests``
    says it cannot matter (the hot path): the requests are always those of the full
    arithmetic with the status."""
    full = pod_requests(obj["spec"], status=obj["status"])
    assert decode_pod(obj).requests_exact == full
    if not status_changes_requests(obj["spec"], obj["status"]):
        assert pod_requests(obj["spec"]) == full
