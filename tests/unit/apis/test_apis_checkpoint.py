"""Tests for apis.checkpoint: both kubelet shapes, errors, the annotation codec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.allocation import go_json_loads
from apis.checkpoint import (
    ANNOTATION_DEVICES_CHECKPOINTS,
    CheckpointError,
    KubeletCheckpoint,
    PodDeviceEntry,
    decode_devices_checkpoints,
    encode_devices_checkpoints,
    fnv32a,
    kubelet_checksum,
    parse_kubelet_checkpoint,
    spew_checkpoint_data,
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


GOLDEN = Path(__file__).with_name("fixtures") / "kubelet-checkpoint"
"""Written by Kubernetes v1.20.2's checkpoint types, checksum code and vendored go-spew
(hack/kubelet-checkpoint-golden); spew.txt holds go-spew's rendering of each file's Data."""


@pytest.mark.parametrize(
    ("name", "line", "form"),
    [("numa.json", 0, "numa"), ("numa-empty.json", 1, "numa"), ("v1.json", 2, "list")],
)
def test_the_kubelets_own_checksum_and_rendering(name: str, line: int, form: str) -> None:
    text = (GOLDEN / name).read_text()
    data = go_json_loads(text).fields(("Data",))["Data"]
    expected = (GOLDEN / "spew.txt").read_text().splitlines()[line]
    assert spew_checkpoint_data(data, form) == expected
    assert kubelet_checksum(data) == json.loads(text)["Checksum"]
    parsed = parse_kubelet_checkpoint(text)
    assert parsed.checksum_ok and parsed.expected_checksum == parsed.checksum


def test_fnv32a_matches_go() -> None:
    assert fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C


@pytest.mark.parametrize("name", ["numa.json", "v1.json"])
def test_a_changed_or_mis_summed_checkpoint_is_not_ok(name: str) -> None:
    text = (GOLDEN / name).read_text()
    checksum = json.loads(text)["Checksum"]
    for bad in (
        text.replace(f'"Checksum":{checksum}', f'"Checksum":{checksum - 1}'),
        text.replace("GPU-0", "GPU-9", 1),
        text.replace(f',"Checksum":{checksum}', ""),
    ):
        parsed = parse_kubelet_checkpoint(bad)
        assert not parsed.checksum_ok


def test_the_shape_decides_the_types_hashed() -> None:
    # a list-shaped file is hashed with kubelet 1.19's types: the same data NUMA-keyed does not
    # carry the list-shaped checksum
    v1 = json.loads((GOLDEN / "v1.json").read_text())
    v1["Data"]["PodDeviceEntries"][0]["DeviceIDs"] = {"-1": ["GPU-2", "GPU-0"]}
    assert not parse_kubelet_checkpoint(json.dumps(v1)).checksum_ok
