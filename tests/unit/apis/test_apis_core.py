"""apis.core pod requests: the API server's limit-to-request defaulting."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from apis.core import pod_requests


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
