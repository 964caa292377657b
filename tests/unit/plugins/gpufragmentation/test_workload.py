"""Pod shapes and the target workload: fixed, or learned from a bounded window."""

from __future__ import annotations

from typing import Any

import pytest

from apis.core import decode_pod
from scheduler.plugins.gpufragmentation.measure import PodShape
from scheduler.plugins.gpufragmentation.workload import (
    WorkloadConfig,
    WorkloadEstimator,
    shape_of,
)


def _pod(requests: dict[str, str], **spec: Any) -> Any:
    return decode_pod(
        {
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}], **spec},
        }
    )


_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "node.koordinator.sh/gpu-model", "operator": "In", "values": ["T4"]}
                    ]
                }
            ]
        }
    }
}


@pytest.mark.parametrize(
    ("requests", "spec", "shape"),
    [
        pytest.param({"cpu": "2"}, {}, PodShape(2000), id="cpu-only"),
        pytest.param(
            {"cpu": "4", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"},
            {},
            PodShape(4000, 500, 1),
            id="share",
        ),
        pytest.param({"cpu": "8", "nvidia.com/gpu": "2"}, {}, PodShape(8000, 1000, 2), id="whole"),
        pytest.param({"koordinator.sh/gpu": "200"}, {}, PodShape(0, 1000, 2), id="koord-gpu"),
        pytest.param(
            {"cpu": "1", "nvidia.com/gpu": "1"},
            {"nodeSelector": {"node.koordinator.sh/gpu-model": "A10"}},
            PodShape(1000, 1000, 1, ("A10",)),
            id="node-selector",
        ),
        pytest.param(
            {"cpu": "1", "nvidia.com/gpu": "1"},
            {"affinity": _AFFINITY},
            PodShape(1000, 1000, 1, ("T4",)),
            id="affinity",
        ),
        pytest.param({"koordinator.sh/gpu-core": "50"}, {}, None, id="invalid-request"),
        pytest.param({"koordinator.sh/gpu-memory": "8Gi"}, {}, None, id="memory-only"),
    ],
)
def test_shape_of(requests: dict[str, str], spec: dict[str, Any], shape: PodShape | None) -> None:
    assert shape_of(_pod(requests, **spec)) == shape


A, B, C = PodShape(1000, 500, 1), PodShape(1000, 1000, 1), PodShape(2000)


def test_fixed_workload_is_the_configured_one() -> None:
    est = WorkloadEstimator(WorkloadConfig(shapes=((A, 3.0), (B, 1.0)), popularity=1.0))
    est.observe("u1", C)  # not learning: ignored
    assert est.current().as_mapping() == pytest.approx({A: 0.75, B: 0.25})


def test_learned_workload_window_and_prior() -> None:
    config = WorkloadConfig(
        shapes=((A, 1.0),), seed_weight=2.0, window=3, refresh_every=1, popularity=1.0
    )
    est = WorkloadEstimator(config)
    assert est.current().as_mapping() == pytest.approx({A: 1.0})
    for uid, shape in [("1", B), ("2", B), ("2", B), ("3", C), ("4", C)]:
        est.observe(uid, shape)
    # The window holds the last 3 distinct pods (2: B, 3: C, 4: C); the prior is worth 2 pods.
    assert list(est.window_shapes()) == [B, C, C]
    assert est.current().as_mapping() == pytest.approx({A: 2 / 5, B: 1 / 5, C: 2 / 5})


def test_learned_workload_refreshes_in_batches() -> None:
    est = WorkloadEstimator(WorkloadConfig(shapes=((A, 1.0),), window=10, refresh_every=2))
    first = est.current()
    est.observe("1", B)
    assert est.current() is first
    est.observe("2", B)
    assert est.current() is not first and est.generation == 2
