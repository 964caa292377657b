"""Tests for apis.partition: the gpu-partitions table, the partition policy label and the pod's
gpu-partition-spec (wire forms of Koordinator's apis/extension/device_share.go)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.device import Device
from apis.partition import (
    ANNOTATION_GPU_PARTITIONS,
    LABEL_GPU_PARTITION_POLICY,
    POLICY_HONOR,
    POLICY_PREFER,
    GPUPartition,
    PartitionDecodeError,
    PartitionSpec,
    PartitionTable,
    partition_policy,
)
from apis.quantity import Quantity
from apis.topology import TopologyDecodeError


def part(*minors: int, score: int = 1, bw: str | None = "450G") -> GPUPartition:
    return GPUPartition(
        minors, "NVLink", None if bw is None else Quantity.parse(bw), score
    )


# -- table codec ------------------------------------------------------------------------------


def test_encode_is_gos_json_marshal() -> None:
    table = PartitionTable(
        {
            1: (part(0, bw=None), part(1, bw=None)),
            2: (part(0, 1),),
            16: (GPUPartition(tuple(range(16))),),
        }
    )
    assert table.encode() == (
        '{"1":[{"minors":[0],"gpuLinkType":"NVLink","allocationScore":1},'
        '{"minors":[1],"gpuLinkType":"NVLink","allocationScore":1}],'
        '"16":[{"minors":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}],'
        '"2":[{"minors":[0,1],"gpuLinkType":"NVLink","ringBusBandwidth":"450G",'
        '"allocationScore":1}]}'
    )


def test_decode_koordlets_huawei_example() -> None:
    # The exact text Koordinator's koordlet test expects for an Ascend box.
    text = '{"4":[{"minors":[0,1,2,3],"gpuLinkType":"HCCS","allocationScore":1}]}'
    table = PartitionTable.decode(text)
    assert table.of_size(4) == (GPUPartition((0, 1, 2, 3), "HCCS", None, 1),)
    assert table.encode() == text


def test_of_size_orders_best_score_first_then_minors() -> None:
    table = PartitionTable({2: (part(2, 3, score=1), part(0, 3, score=2), part(0, 1, score=1))})
    assert [p.minors for p in table.of_size(2)] == [(0, 3), (0, 1), (2, 3)]
    assert table.of_size(4) == ()
    assert table.sizes() == (2,)
    assert part(1, 3).mask == 0b1010


def test_unknown_fields_are_ignored_and_minors_sorted() -> None:
    table = PartitionTable.decode('{"2":[{"minors":[3,1],"extra":true}],"4":null}')
    assert table.of_size(2) == (GPUPartition((1, 3)),)
    assert table.sizes() == (2,)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("null", "<root>", id="null-table"),
        pytest.param("[]", "<root>", id="array"),
        pytest.param("{", "<root>", id="bad-json"),
        pytest.param('{"x":[]}', "x", id="key-not-a-number"),
        pytest.param('{"0":[]}', "0", id="key-zero"),
        pytest.param('{"2":{}}', "2", id="not-an-array"),
        pytest.param('{"2":[7]}', "2[0]", id="entry-not-object"),
        pytest.param('{"2":[{"minors":[]}]}', "2[0].minors", id="empty-minors"),
        pytest.param('{"2":[{"minors":[0,-1]}]}', "2[0].minors[1]", id="negative-minor"),
        pytest.param('{"2":[{"minors":[1,1]}]}', "2[0].minors", id="duplicate-minor"),
        pytest.param('{"2":[{"minors":[0,1,2]}]}', "2[0].minors", id="size-mismatch"),
        pytest.param('{"1":[{"minors":[0],"gpuLinkType":3}]}', "1[0].gpuLinkType", id="link"),
        pytest.param(
            '{"1":[{"minors":[0],"ringBusBandwidth":"fast"}]}', "1[0].ringBusBandwidth", id="bw"
        ),
        pytest.param(
            '{"1":[{"minors":[0],"ringBusBandwidth":"-1"}]}', "1[0].ringBusBandwidth", id="neg-bw"
        ),
        pytest.param(
            '{"1":[{"minors":[0],"allocationScore":1.5}]}', "1[0].allocationScore", id="score"
        ),
    ],
)
def test_decode_errors_name_the_field(text: str, path: str) -> None:
    with pytest.raises(PartitionDecodeError) as exc:
        PartitionTable.decode(text)
    assert exc.value.path == path
    assert isinstance(exc.value, TopologyDecodeError)


@given(
    st.dictionaries(
        st.sampled_from([1, 2, 4, 8]),
        st.lists(
            st.tuples(
                st.integers(0, 3),
                st.sampled_from(["", "NVLink", "PCIe"]),
                st.sampled_from([None, "300G", "400Gi"]),
                st.integers(0, 3),
            ),
            max_size=3,
        ),
    )
)
def test_round_trip(raw: dict[int, list[tuple[int, str, str | None, int]]]) -> None:
    table = PartitionTable(
        {
            size: tuple(
                GPUPartition(
                    tuple(range(start * size, start * size + size)),
                    link,
                    None if bw is None else Quantity.parse(bw),
                    score,
                )
                for start, link, bw, score in entries
            )
            for size, entries in raw.items()
        }
    )
    assert PartitionTable.decode(table.encode()) == table
    assert json.loads(table.encode()) == table.to_dict()


def test_device_accessors() -> None:
    device = Device(
        name="n",
        labels={LABEL_GPU_PARTITION_POLICY: POLICY_HONOR},
        annotations={ANNOTATION_GPU_PARTITIONS: '{"1":[{"minors":[0]}]}'},
    )
    assert device.gpu_partitions() == PartitionTable({1: (GPUPartition((0,)),)})
    assert device.gpu_partition_policy == POLICY_HONOR
    assert Device(name="n").gpu_partitions() is None
    assert Device(name="n").gpu_partition_policy == POLICY_PREFER


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        pytest.param("Honor", POLICY_HONOR, id="honor"),
        pytest.param("Prefer", POLICY_PREFER, id="prefer"),
        pytest.param("honor", POLICY_PREFER, id="case-sensitive"),
        pytest.param(None, POLICY_PREFER, id="absent"),
    ],
)
def test_partition_policy(value: str | None, policy: str) -> None:
    labels = {} if value is None else {LABEL_GPU_PARTITION_POLICY: value}
    assert partition_policy(labels) == policy


# -- pod spec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy", "bandwidth"),
    [
        pytest.param("{}", "BestEffort", None, id="empty-is-best-effort"),
        pytest.param('{"allocatePolicy":""}', "BestEffort", None, id="blank-policy"),
        pytest.param('{"allocatePolicy":"BestEffort"}', "BestEffort", None, id="best-effort"),
        pytest.param(
            '{"allocatePolicy":"Restricted","ringBusBandwidth":"200Gi"}',
            "Restricted",
            "200Gi",
            id="restricted-with-bandwidth",
        ),
    ],
)
def test_spec_decode(text: str, policy: str, bandwidth: str | None) -> None:
    spec = PartitionSpec.decode(text)
    assert spec.allocate_policy == policy
    assert spec.restricted == (policy == "Restricted")
    assert spec.ring_bandwidth == (None if bandwidth is None else Quantity.parse(bandwidth))
    assert PartitionSpec.decode(spec.encode()) == spec


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("invalid GPU Partition Spec", "<root>", id="not-json"),
        pytest.param("[]", "<root>", id="array"),
        pytest.param('{"allocatePolicy":"Strict"}', "allocatePolicy", id="unknown-policy"),
        pytest.param('{"ringBusBandwidth":true}', "ringBusBandwidth", id="bad-bandwidth"),
    ],
)
def test_spec_errors(text: str, path: str) -> None:
    with pytest.raises(PartitionDecodeError) as exc:
        PartitionSpec.decode(text)
    assert exc.value.path == path
