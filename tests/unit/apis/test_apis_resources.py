"""Tests for apis.resources: every row of SPEC section 3, the messages, the per-GPU split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.quantity import Quantity
from apis.resources import (
    FPGA,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    GPU_SHARED,
    KOORD_GPU,
    NVIDIA_GPU,
    RDMA,
    GPUSplit,
    InvalidDeviceRequest,
    device_requests,
    gpu_split,
    invalid_combination_message,
    invalid_unit_message,
    is_valid_percentage,
    memory_from_ratio,
    ratio_from_memory,
)

GI = 1024**3

VALID = [
    ("no-device", {"cpu": 4000, "memory": 8 * GI}, {}),
    ("zeros-dropped", {GPU_CORE: 0, NVIDIA_GPU: 0, "cpu": 1}, {}),
    ("nvidia-1", {NVIDIA_GPU: 1}, {"gpu": {GPU_CORE: 100, GPU_MEMORY_RATIO: 100}}),
    ("nvidia-4", {NVIDIA_GPU: 4, "cpu": 8}, {"gpu": {GPU_CORE: 400, GPU_MEMORY_RATIO: 400}}),
    ("koord-gpu-50", {KOORD_GPU: 50}, {"gpu": {GPU_CORE: 50, GPU_MEMORY_RATIO: 50}}),
    ("koord-gpu-100", {KOORD_GPU: 100}, {"gpu": {GPU_CORE: 100, GPU_MEMORY_RATIO: 100}}),
    ("koord-gpu-200", {KOORD_GPU: 200}, {"gpu": {GPU_CORE: 200, GPU_MEMORY_RATIO: 200}}),
    ("memory-alone", {GPU_MEMORY: 8 * GI}, {"gpu": {GPU_MEMORY: 8 * GI}}),
    ("ratio-alone-50", {GPU_MEMORY_RATIO: 50}, {"gpu": {GPU_MEMORY_RATIO: 50}}),
    ("ratio-alone-300", {GPU_MEMORY_RATIO: 300}, {"gpu": {GPU_MEMORY_RATIO: 300}}),
    (
        "core-memory",
        {GPU_CORE: 50, GPU_MEMORY: 8 * GI},
        {"gpu": {GPU_CORE: 50, GPU_MEMORY: 8 * GI}},
    ),
    (
        "core-200-memory",
        {GPU_CORE: 200, GPU_MEMORY: 8 * GI},
        {"gpu": {GPU_CORE: 200, GPU_MEMORY: 8 * GI}},
    ),
    (
        "core-ratio",
        {GPU_CORE: 50, GPU_MEMORY_RATIO: 50},
        {"gpu": {GPU_CORE: 50, GPU_MEMORY_RATIO: 50}},
    ),
    (
        "core-ratio-200",
        {GPU_CORE: 200, GPU_MEMORY_RATIO: 200},
        {"gpu": {GPU_CORE: 200, GPU_MEMORY_RATIO: 200}},
    ),
    (
        "shared-memory",
        {GPU_SHARED: 2, GPU_MEMORY: 16 * GI},
        {"gpu": {GPU_SHARED: 2, GPU_MEMORY: 16 * GI}},
    ),
    (
        "shared-ratio",
        {GPU_SHARED: 2, GPU_MEMORY_RATIO: 100},
        {"gpu": {GPU_SHARED: 2, GPU_MEMORY_RATIO: 100}},
    ),
    (
        "shared-core-memory",
        {GPU_SHARED: 2, GPU_CORE: 100, GPU_MEMORY: GI},
        {"gpu": {GPU_SHARED: 2, GPU_CORE: 100, GPU_MEMORY: GI}},
    ),
    (
        "shared-core-ratio",
        {GPU_SHARED: 4, GPU_CORE: 200, GPU_MEMORY_RATIO: 400},
        {"gpu": {GPU_SHARED: 4, GPU_CORE: 200, GPU_MEMORY_RATIO: 400}},
    ),
    (
        "shared-ratio-100-per-card",
        {GPU_SHARED: 3, GPU_MEMORY_RATIO: 300},
        {"gpu": {GPU_SHARED: 3, GPU_MEMORY_RATIO: 300}},
    ),
    ("rdma-alone", {RDMA: 100}, {"rdma": {RDMA: 100}}),
    ("rdma-50", {RDMA: 50}, {"rdma": {RDMA: 50}}),
    ("fpga-200", {FPGA: 200}, {"fpga": {FPGA: 200}}),
    (
        "gpu-and-rdma",
        {NVIDIA_GPU: 1, RDMA: 100},
        {"gpu": {GPU_CORE: 100, GPU_MEMORY_RATIO: 100}, "rdma": {RDMA: 100}},
    ),
    (
        "all-three",
        {KOORD_GPU: 50, RDMA: 1, FPGA: 100, "memory": 1},
        {
            "gpu": {GPU_CORE: 50, GPU_MEMORY_RATIO: 50},
            "rdma": {RDMA: 1},
            "fpga": {FPGA: 100},
        },
    ),
    ("unknown-vendor-ignored", {"amd.com/gpu": 1}, {}),
]


@pytest.mark.parametrize(("requests", "expect"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_device_requests_valid(requests: dict[str, int], expect: dict[str, dict[str, int]]) -> None:
    assert device_requests(requests) == expect


INVALID = [
    ("core-alone", {GPU_CORE: 100}, f"invalid resource device requests: [{GPU_CORE}]"),
    ("koord-gpu-101", {KOORD_GPU: 101}, f"invalid resource unit {KOORD_GPU}: 101"),
    ("koord-gpu-150", {KOORD_GPU: 150}, f"invalid resource unit {KOORD_GPU}: 150"),
    (
        "ratio-101",
        {GPU_MEMORY_RATIO: 101},
        f"invalid resource device requests: [{GPU_MEMORY_RATIO}]",
    ),
    ("rdma-150", {RDMA: 150}, f"invalid resource unit {RDMA}: 150"),
    ("fpga-1050", {FPGA: 1050}, f"invalid resource unit {FPGA}: 1050"),
    (
        "core-150-memory",
        {GPU_CORE: 150, GPU_MEMORY: GI},
        f"invalid resource device requests: [{GPU_CORE} {GPU_MEMORY}]",
    ),
    (
        "core-ratio-150",
        {GPU_CORE: 100, GPU_MEMORY_RATIO: 150},
        f"invalid resource device requests: [{GPU_CORE} {GPU_MEMORY_RATIO}]",
    ),
    (
        "memory-and-ratio",
        {GPU_MEMORY: GI, GPU_MEMORY_RATIO: 50},
        f"invalid resource device requests: [{GPU_MEMORY} {GPU_MEMORY_RATIO}]",
    ),
    (
        "nvidia-and-core",
        {NVIDIA_GPU: 1, GPU_CORE: 100},
        f"invalid resource device requests: [{GPU_CORE} {NVIDIA_GPU}]",
    ),
    (
        "nvidia-and-koord-gpu",
        {NVIDIA_GPU: 1, KOORD_GPU: 100},
        f"invalid resource device requests: [{KOORD_GPU} {NVIDIA_GPU}]",
    ),
    ("shared-alone", {GPU_SHARED: 2}, f"invalid resource device requests: [{GPU_SHARED}]"),
    (
        "shared-core-only",
        {GPU_SHARED: 2, GPU_CORE: 100},
        f"invalid resource device requests: [{GPU_CORE} {GPU_SHARED}]",
    ),
    (
        "shared-ratio-not-multiple",
        {GPU_SHARED: 2, GPU_MEMORY_RATIO: 101},
        f"invalid resource device requests: [{GPU_MEMORY_RATIO} {GPU_SHARED}]",
    ),
    (
        "shared-ratio-over-100-each",
        {GPU_SHARED: 2, GPU_MEMORY_RATIO: 202},
        f"invalid resource device requests: [{GPU_MEMORY_RATIO} {GPU_SHARED}]",
    ),
    (
        "shared-core-over-100-each",
        {GPU_SHARED: 2, GPU_CORE: 300, GPU_MEMORY: GI},
        f"invalid resource device requests: [{GPU_CORE} {GPU_MEMORY} {GPU_SHARED}]",
    ),
    ("negative", {GPU_MEMORY: -1}, f"invalid resource unit {GPU_MEMORY}: -1"),
    (
        "gpu-checked-before-rdma",
        {GPU_CORE: 1, RDMA: 150},
        f"invalid resource device requests: [{GPU_CORE}]",
    ),
]


@pytest.mark.parametrize(
    ("requests", "message"), [v[1:] for v in INVALID], ids=[v[0] for v in INVALID]
)
def test_device_requests_invalid(requests: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidDeviceRequest) as info:
        device_requests(requests)
    assert str(info.value) == message
    assert info.value.message == message


MESSAGES = [
    ("unit-int", invalid_unit_message(KOORD_GPU, 101), f"invalid resource unit {KOORD_GPU}: 101"),
    ("unit-int-k", invalid_unit_message(RDMA, 2000), f"invalid resource unit {RDMA}: 2k"),
    (
        "unit-quantity",
        invalid_unit_message(KOORD_GPU, Quantity.parse("1500m")),
        f"invalid resource unit {KOORD_GPU}: 1500m",
    ),
    ("unit-str", invalid_unit_message(FPGA, "150"), f"invalid resource unit {FPGA}: 150"),
    (
        "combo-sorted",
        invalid_combination_message(["b", "a"]),
        "invalid resource device requests: [a b]",
    ),
    ("combo-empty", invalid_combination_message([]), "invalid resource device requests: []"),
]


@pytest.mark.parametrize(("got", "expect"), [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES])
def test_messages(got: str, expect: str) -> None:
    assert got == expect


@pytest.mark.parametrize(
    ("value", "ok"),
    [(1, True), (100, True), (101, False), (150, False), (200, True), (1000, True), (250, False)],
    ids=["1", "100", "101", "150", "200", "1000", "250"],
)
def test_is_valid_percentage(value: int, ok: bool) -> None:
    assert is_valid_percentage(value) is ok


SPLITS = [
    ("nvidia-1", {GPU_CORE: 100, GPU_MEMORY_RATIO: 100}, GPUSplit(1, 100, 100, None, False)),
    ("nvidia-4", {GPU_CORE: 400, GPU_MEMORY_RATIO: 400}, GPUSplit(4, 100, 100, None, False)),
    ("half", {GPU_CORE: 50, GPU_MEMORY_RATIO: 50}, GPUSplit(1, 50, 50, None, True)),
    ("ratio-only", {GPU_MEMORY_RATIO: 50}, GPUSplit(1, None, 50, None, True)),
    ("ratio-only-200", {GPU_MEMORY_RATIO: 200}, GPUSplit(2, None, 100, None, False)),
    ("memory-only", {GPU_MEMORY: 8 * GI}, GPUSplit(1, None, None, 8 * GI, True)),
    ("core-memory", {GPU_CORE: 50, GPU_MEMORY: 8 * GI}, GPUSplit(1, 50, None, 8 * GI, True)),
    ("core-200-memory", {GPU_CORE: 200, GPU_MEMORY: 8 * GI}, GPUSplit(1, 200, None, 8 * GI, True)),
    (
        "shared-memory",
        {GPU_SHARED: 2, GPU_MEMORY: 16 * GI},
        GPUSplit(2, None, None, 8 * GI, True),
    ),
    (
        "shared-core-ratio",
        {GPU_SHARED: 4, GPU_CORE: 200, GPU_MEMORY_RATIO: 400},
        GPUSplit(4, 50, 100, None, False),
    ),
    (
        "shared-ratio-below-100",
        {GPU_SHARED: 2, GPU_MEMORY_RATIO: 100},
        GPUSplit(2, None, 50, None, True),
    ),
    ("rdma-style-empty", {}, GPUSplit(1, None, None, None, False)),
]


@pytest.mark.parametrize(
    ("request_", "expect"), [s[1:] for s in SPLITS], ids=[s[0] for s in SPLITS]
)
def test_gpu_split(request_: dict[str, int], expect: GPUSplit) -> None:
    assert gpu_split(request_) == expect


CONVERSIONS = [
    ("half-of-64Gi", 50, 64 * GI, 32 * GI),
    ("full", 100, 16 * GI, 16 * GI),
    ("floor", 33, 100, 33),
    ("floor-odd", 1, 15843721216, 158437212),
    ("zero", 0, 16 * GI, 0),
]


@pytest.mark.parametrize(
    ("ratio", "total", "memory"), [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS]
)
def test_memory_from_ratio(ratio: int, total: int, memory: int) -> None:
    assert memory_from_ratio(ratio, total) == memory


RATIOS = [
    ("32Gi-of-64Gi", 32 * GI, 64 * GI, 50),
    ("truncates", 8 * GI, 15 * GI, 53),
    ("exact-29", 29, 100, 29),  # float64 arithmetic would give 28
    ("all", 16 * GI, 16 * GI, 100),
    ("tiny", 1, 16 * GI, 0),
    ("over", 32 * GI, 16 * GI, 200),
]


@pytest.mark.parametrize(
    ("memory", "total", "ratio"), [r[1:] for r in RATIOS], ids=[r[0] for r in RATIOS]
)
def test_ratio_from_memory(memory: int, total: int, ratio: int) -> None:
    assert ratio_from_memory(memory, total) == ratio


def test_ratio_from_memory_rejects_empty_card() -> None:
    with pytest.raises(ValueError, match="total_bytes must be positive"):
        ratio_from_memory(1, 0)


@given(st.integers(0, 100), st.integers(1, 2**40))
def test_ratio_memory_round_trip_never_exceeds(ratio: int, total: int) -> None:
    memory = memory_from_ratio(ratio, total)
    assert memory <= ratio * total / 100 < memory + 1
    assert ratio_from_memory(memory, total) <= ratio


@given(
    st.dictionaries(
        st.sampled_from(
            [
                NVIDIA_GPU,
                KOORD_GPU,
                GPU_SHARED,
                GPU_CORE,
                GPU_MEMORY,
                GPU_MEMORY_RATIO,
                RDMA,
                FPGA,
                "cpu",
            ]
        ),
        st.integers(0, 1000),
    )
)
def test_device_requests_total_function(requests: dict[str, int]) -> None:
    """Any integer request is either converted or rejected with one of the two messages."""
    try:
        result = device_requests(requests)
    except InvalidDeviceRequest as err:
        assert str(err).startswith(
            ("invalid resource unit ", "invalid resource device requests: [")
        )
    else:
        assert set(result) <= {"gpu", "rdma", "fpga"}
        assert all(v > 0 for per_type in result.values() for v in per_type.values())
        if "gpu" in result:
            split = gpu_split(result["gpu"])
            assert split.count >= 1
