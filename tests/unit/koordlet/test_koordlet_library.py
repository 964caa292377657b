"""koordlet.devices.library: the port's records."""

from __future__ import annotations

import pytest

from koordlet.devices.library import GPU, HEALTHY, REASON_QUERY_FAILED, Health, query_failed


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        pytest.param("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", id="a100"),
        pytest.param("A100 SXM4 80GB", "A100-SXM4-80GB", id="spaces"),
        pytest.param("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB", id="tesla"),
        pytest.param("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090", id="geforce"),
        pytest.param("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3", id="h100"),
        pytest.param("", "", id="unknown"),
    ],
)
def test_gpu_model(nvml_name: str, model: str) -> None:
    assert GPU(uuid="GPU-1", minor=0, name=nvml_name).model == model


def test_health_records() -> None:
    assert Health(True, "DeviceHealthy", "device is healthy") == HEALTHY
    assert query_failed("nvmlDeviceGetName", "GPU is lost") == Health(
        False, REASON_QUERY_FAILED, "nvmlDeviceGetName failed: GPU is lost"
    )
