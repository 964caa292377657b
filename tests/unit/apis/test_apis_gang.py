"""apis.gang: which gang a pod belongs to (annotations, PodGroup, lightweight label), the
PodGroup decoder, and the timeout mark."""

from __future__ import annotations

from typing import Any

import pytest

from apis.core import decode_pod
from apis.gang import (
    DEFAULT_WAITING_SECONDS,
    GangSpec,
    GangSpecError,
    PodGroup,
    decode_pod_group,
    gang_of,
    timed_out,
)

G = "gang.scheduling.koordinator.sh"
L = "pod-group.scheduling.sigs.k8s.io"
GROUPS = {"ml/train": PodGroup("ml", "train", 3, 120.0)}


def pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> Any:
    meta = {"name": "w", "namespace": "ml", "labels": labels or {}}
    meta["annotations"] = annotations or {}
    return decode_pod({"metadata": meta})


@pytest.mark.parametrize(
    ("labels", "annotations", "want"),
    [
        pytest.param({}, {}, None, id="no-gang"),
        pytest.param(
            {L: "train"},
            {},
            GangSpec("ml/train", 3, 3, waiting_seconds=120.0, groups=("ml/train",),
                     source="PodGroup"),
            id="label-with-pod-group",
        ),
        pytest.param(
            {f"{L}/name": "train"},
            {},
            GangSpec("ml/train", 3, 3, waiting_seconds=120.0, groups=("ml/train",),
                     source="PodGroup"),
            id="name-label-with-pod-group",
        ),
        pytest.param(
            {L: "other", f"{L}/min-available": "2"},
            {},
            GangSpec("ml/other", 2, 2, groups=("ml/other",), source="labels"),
            id="lightweight-label",
        ),
        pytest.param(
            {L: "other"},
            {},
            GangSpec("ml/other", 1, 1, groups=("ml/other",), source="labels",
                     needs_pod_group=True),
            id="waits-for-its-pod-group",
        ),
        pytest.param(
            {L: "train"},
            {f"{G}/name": "ann", f"{G}/min-available": "4"},
            GangSpec("ml/ann", 4, 4, groups=("ml/ann",)),
            id="annotations-win",
        ),
    ],
)  # fmt: skip
def test_gang_of(
    labels: dict[str, str], annotations: dict[str, str], want: GangSpec | None
) -> None:
    assert gang_of(pod(labels, annotations), GROUPS) == want


def test_a_pod_group_without_timeout_waits_the_default() -> None:
    spec = gang_of(pod({L: "t"}), {"ml/t": PodGroup("ml", "t", 2)})
    assert spec is not None and spec.waiting_seconds == DEFAULT_WAITING_SECONDS


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        pytest.param({"minMember": 0}, "spec.minMember", id="zero-members"),
        pytest.param({"minMember": True}, "spec.minMember", id="bool-members"),
        pytest.param({"minMember": 2, "scheduleTimeoutSeconds": 0}, "scheduleTimeoutSeconds",
                     id="zero-timeout"),
        pytest.param([1], "spec: not an object", id="spec-not-object"),
    ],
)  # fmt: skip
def test_bad_pod_groups_name_the_field(spec: Any, error: str) -> None:
    with pytest.raises(GangSpecError, match=error):
        decode_pod_group({"metadata": {"name": "t", "namespace": "ml"}, "spec": spec})


def test_decode_pod_group() -> None:
    group = decode_pod_group(
        {
            "metadata": {"name": "t", "namespace": "ml", "resourceVersion": "7"},
            "spec": {"minMember": 3, "scheduleTimeoutSeconds": 30},
        }
    )
    assert group == PodGroup("ml", "t", 3, 30.0, resource_version="7")
    assert group.key == group.id == "ml/t"


@pytest.mark.parametrize(
    ("value", "want"), [("true", True), ("false", False), (None, False)], ids=["t", "f", "none"]
)
def test_timed_out_reads_the_mark(value: str | None, want: bool) -> None:
    annotations = {} if value is None else {f"{G}/timeout": value}
    assert timed_out(pod(annotations=annotations)) is want
