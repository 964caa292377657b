"""Tests for apis.checkpoint: both kubelet shapes, errors, the annotation codec."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.checkpoint import (
    ANNOTATION_DEVICES_CHECKPOINTS,
    CheckpointError,
    KubeletCheckpoint,
    PodDeviceEntry,
    decode_devices_checkpoints,
    encode_devices_checkpoints,
    parse_kubelet_checkpoint,
)

NVIDIA = "nvidia.com/gpu"

NUMA_SHAPE = json.dumps(
    {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": "pod-a",
                    "ContainerName": "cuda",
                    "ResourceName": NVIDIA,
                    "DeviceIDs": {"0": ["GPU-1", "GPU-2"], "1": ["GPU-2", "GPU-3"]},
                    "AllocResp": "CgQKAggB",
                },
                {
                    "PodUID": "pod-b",
                    "ContainerName": "main",
                    "ResourceName": "example.com/fpga",
                    "DeviceIDs": {"-1": ["F-0"]},
                    "AllocResp": None,
                },
            ],
            "RegisteredDevices": {NVIDIA: ["GPU-1", "GPU-2", "GPU-3"]},
        },
        "Checksum": 1234567890,
    }
)

LIST_SHAPE = json.dumps(
    {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": "pod-old",
                    "ContainerName": "c",
                    "ResourceName": NVIDIA,
                    "DeviceIDs": ["GPU-9", "GPU-8", "GPU-9"],
                    "AllocResp": "",
                }
            ],
            "RegisteredDevices": {NVIDIA: ["GPU-8", "GPU-9"]},
        },
        "Checksum": 18446744073709551615,
    }
)

PARSE = [
    (
        "numa-map",
        NUMA_SHAPE,
        KubeletCheckpoint(
            entries=(
                PodDeviceEntry("pod-a", "cuda", NVIDIA, ("GPU-1", "GPU-2", "GPU-3")),
                PodDeviceEntry("pod-b", "main", "example.com/fpga", ("F-0",)),
            ),
            registered_devices={NVIDIA: ("GPU-1", "GPU-2", "GPU-3")},
            checksum=1234567890,
        ),
    ),
    (
        "plain-list",
        LIST_SHAPE,
        KubeletCheckpoint(
            entries=(PodDeviceEntry("pod-old", "c", NVIDIA, ("GPU-9", "GPU-8")),),
            registered_devices={NVIDIA: ("GPU-8", "GPU-9")},
            checksum=2**64 - 1,
        ),
    ),
    ("bytes", NUMA_SHAPE.encode(), None),
    ("empty-data", '{"Data":{},"Checksum":0}', KubeletCheckpoint(checksum=0)),
    (
        "nulls",
        '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":null}',
        KubeletCheckpoint(),
    ),
    (
        "case-insensitive",
        '{"data":{"podDeviceEntries":[{"poduid":"p","containername":"c","resourcename":"r",'
        '"deviceids":null}]}}',
        KubeletCheckpoint(entries=(PodDeviceEntry("p", "c", "r"),)),
    ),
]


@pytest.mark.parametrize(("data", "expect"), [p[1:] for p in PARSE], ids=[p[0] for p in PARSE])
def test_parse_kubelet_checkpoint(data: str | bytes, expect: KubeletCheckpoint | None) -> None:
    got = parse_kubelet_checkpoint(data)
    if expect is None:
        expect = parse_kubelet_checkpoint(NUMA_SHAPE)
    assert got == expect


ERRORS = [
    ("empty", "", "invalid JSON"),
    ("truncated", NUMA_SHAPE[: len(NUMA_SHAPE) // 2], "invalid JSON"),
    ("garbage", "\x00\x01", "invalid JSON"),
    ("null", "null", "empty checkpoint"),
    ("array", "[]", "expected an object, got array"),
    ("data-string", '{"Data":"x"}', "Data: expected an object, got string"),
    (
        "entries-object",
        '{"Data":{"PodDeviceEntries":{}}}',
        "Data.PodDeviceEntries: expected an array, got object",
    ),
    (
        "entry-null",
        '{"Data":{"PodDeviceEntries":[null]}}',
        "Data.PodDeviceEntries[0]: expected an object, got null",
    ),
    (
        "uid-number",
        '{"Data":{"PodDeviceEntries":[{"PodUID":1}]}}',
        "Data.PodDeviceEntries[0].PodUID: expected a string, got number",
    ),
    (
        "numa-key",
        '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"x":["a"]}}]}}',
        "Data.PodDeviceEntries[0].DeviceIDs: NUMA node key 'x' is not an int64",
    ),
    (
        "numa-key-blank",
        '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{" 1":["a"]}}]}}',
        "NUMA node key ' 1' is not an int64",
    ),
    (
        "numa-key-huge",
        '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"9223372036854775808":["a"]}}]}}',
        "is not an int64",
    ),
    (
        "device-id-number",
        '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"0":[1]}}]}}',
        "Data.PodDeviceEntries[0].DeviceIDs['0'][0]: expected a string, got number",
    ),
    ("device-ids-string", '{"Data":{"PodDeviceEntries":[{"DeviceIDs":"a"}]}}', "expected an array"),
    ("checksum-string", '{"Data":{},"Checksum":"1"}', "Checksum: expected an integer, got string"),
    ("checksum-negative", '{"Data":{},"Checksum":-1}', "Checksum: expected an unsigned integer"),
    (
        "registered-list",
        '{"Data":{"RegisteredDevices":[]}}',
        "Data.RegisteredDevices: expected an object, got array",
    ),
]


@pytest.mark.parametrize(("data", "fragment"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_parse_kubelet_checkpoint_errors(data: str, fragment: str) -> None:
    with pytest.raises(CheckpointError) as info:
        parse_kubelet_checkpoint(data)
    assert str(info.value).startswith("invalid kubelet device checkpoint: ")
    assert fragment in str(info.value)


ENCODE = [
    ("empty", [], "[]"),
    (
        "sorted",
        [
            PodDeviceEntry("b", "c", NVIDIA, ("GPU-2",)),
            PodDeviceEntry("a", "z", NVIDIA, ("GPU-1", "GPU-0")),
            PodDeviceEntry("a", "c", NVIDIA, ()),
        ],
        '[{"podUID":"a","containerName":"c","resourceName":"nvidia.com/gpu","deviceIDs":[]},'
        '{"podUID":"a","containerName":"z","resourceName":"nvidia.com/gpu",'
        '"deviceIDs":["GPU-1","GPU-0"]},'
        '{"podUID":"b","containerName":"c","resourceName":"nvidia.com/gpu","deviceIDs":["GPU-2"]}]',
    ),
    (
        "escaped",
        [PodDeviceEntry("<p>", "c", "r", ("&",))],
        '[{"podUID":"\\u003cp\\u003e","containerName":"c","resourceName":"r",'
        '"deviceIDs":["\\u0026"]}]',
    ),
]


@pytest.mark.parametrize(("entries", "expect"), [e[1:] for e in ENCODE], ids=[e[0] for e in ENCODE])
def test_encode_devices_checkpoints(entries: list[PodDeviceEntry], expect: str) -> None:
    assert encode_devices_checkpoints(entries) == expect
    assert decode_devices_checkpoints(expect) == sorted(entries, key=PodDeviceEntry.sort_key)


DECODE = [
    ("null", "null", []),
    ("null-ids", '[{"podUID":"p","deviceIDs":null}]', [PodDeviceEntry("p", "", "")]),
    (
        "case-insensitive",
        '[{"PodUID":"p","DeviceIds":["x"]}]',
        [PodDeviceEntry("p", "", "", ("x",))],
    ),
]


@pytest.mark.parametrize(("text", "expect"), [d[1:] for d in DECODE], ids=[d[0] for d in DECODE])
def test_decode_devices_checkpoints(text: str, expect: list[PodDeviceEntry]) -> None:
    assert decode_devices_checkpoints(text) == expect


DECODE_ERRORS = [
    ("malformed", "[", "invalid JSON"),
    ("object", "{}", "expected an array, got object"),
    ("entry-null", "[null]", "[0]: expected an object, got null"),
    ("ids-string", '[{"deviceIDs":"x"}]', "[0].deviceIDs: expected an array, got string"),
    ("uid-bool", '[{"podUID":true}]', "[0].podUID: expected a string, got boolean"),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [d[1:] for d in DECODE_ERRORS], ids=[d[0] for d in DECODE_ERRORS]
)
def test_decode_devices_checkpoints_errors(text: str, fragment: str) -> None:
    with pytest.raises(CheckpointError) as info:
        decode_devices_checkpoints(text)
    assert str(info.value).startswith(f"invalid {ANNOTATION_DEVICES_CHECKPOINTS} annotation: ")
    assert fragment in str(info.value)


_entries = st.builds(
    PodDeviceEntry,
    st.text(max_size=8),
    st.text(max_size=8),
    st.sampled_from([NVIDIA, "koordinator.sh/gpu"]),
    st.lists(st.text(max_size=6), max_size=4).map(tuple),
)


@given(st.lists(_entries, max_size=6))
def test_annotation_round_trip_is_deterministic(entries: list[PodDeviceEntry]) -> None:
    text = encode_devices_checkpoints(entries)
    assert encode_devices_checkpoints(reversed(entries)) == text
    assert decode_devices_checkpoints(text) == sorted(entries, key=PodDeviceEntry.sort_key)
    assert json.loads(text) == [
        {"podUID": e.pod_uid, "containerName": e.container_name,
         "resourceName": e.resource_name, "deviceIDs": list(e.device_ids)}
        for e in sorted(entries, key=PodDeviceEntry.sort_key)
    ]  # fmt: skip
