"""Tests for apis.device: decoding, round trip, error paths, model names."""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.device import (
    API_VERSION,
    KIND,
    Condition,
    Device,
    DeviceDecodeError,
    DeviceInfo,
    DeviceTopology,
    VirtualFunction,
    VirtualFunctionGroup,
    gpu_model_name,
)
from apis.quantity import BINARY_SI, DECIMAL_SI, Quantity

GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_RATIO = "koordinator.sh/gpu-memory-ratio"


def gpu(index: int, /, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "gpu",
        "id": f"GPU-{index:08d}",
        "minor": index,
        "health": True,
        "resources": {GPU_CORE: "100", GPU_MEMORY: "15472384Ki", GPU_RATIO: "100"},
        "topology": {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"},
        "labels": {},
    }
    d.update(extra)
    return d


def cr(*devices: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "node-1", **meta},
        "spec": {"devices": list(devices)},
    }


def test_decodes_spec_example() -> None:
    d = Device.from_dict(cr(gpu(0)))
    assert d.name == "node-1"
    (info,) = d.devices
    assert info == DeviceInfo(
        type="gpu",
        id="GPU-00000000",
        minor=0,
        health=True,
        resources={
            GPU_CORE: Quantity.of(100),
            GPU_MEMORY: Quantity.of(15472384 * 1024, BINARY_SI),
            GPU_RATIO: Quantity.of(100),
        },
        topology=DeviceTopology(-1, 0, "pci0000:3a", "0000:3b:00.0"),
    )
    assert info.resources[GPU_MEMORY].format == BINARY_SI
    assert info.resources[GPU_CORE].format == DECIMAL_SI
    assert info.resource_value(GPU_MEMORY) == 15472384 * 1024
    assert info.resource_value("koordinator.sh/rdma") == 0
    assert d.devices_of_type("gpu") == (info,)
    assert d.devices_of_type("rdma") == ()


FULL: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "metadata": {
        "name": "node-1",
        "uid": "0b1c",
        "resourceVersion": "42",
        "labels": {"node.koordinator.sh/gpu-model": "A100-SXM4-80GB"},
        "annotations": {"node.koordinator.sh/devices-checkpoints": "[]"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "u"}],
        "creationTimestamp": "2024-01-01T00:00:00Z",
        "managedFields": [{"manager": "koordlet"}],
    },
    "spec": {
        "devices": [
            gpu(0, moduleID=3, futureField={"x": 1}),
            {
                "type": "rdma",
                "id": "0000:1f:00.0",
                "minor": 0,
                "health": False,
                "resources": {"koordinator.sh/rdma": "100"},
                "vfGroups": [
                    {
                        "labels": {"type": "general"},
                        "vfs": [{"minor": 0, "busID": "0000:1f:00.2"}, {"minor": 1}],
                    }
                ],
                "conditions": [
                    {
                        "type": "Healthy",
                        "status": "False",
                        "reason": "XID",
                        "message": "xid 79",
                        "lastTransitionTime": "2024-01-01T00:00:00Z",
                        "observedGeneration": 2,
                    }
                ],
            },
        ],
        "specExtra": True,
    },
    "status": {"allocations": [{"type": "gpu", "entries": [{"name": "p", "minors": [0]}]}]},
    "topLevelExtra": "kept",
}


def test_full_round_trip_keeps_every_field() -> None:
    d = Device.from_dict(FULL)
    out = d.to_dict()
    expected = copy.deepcopy(FULL)
    del expected["spec"]["devices"][0]["labels"]  # empty map: omitempty, as Go would write it
    assert out == expected
    assert Device.from_dict(out) == d
    assert d.devices[0].module_id == 3
    assert d.devices[0].extra == {"futureField": {"x": 1}}
    assert d.devices[1].vf_groups == (
        VirtualFunctionGroup(
            labels={"type": "general"},
            vfs=(VirtualFunction(0, "0000:1f:00.2"), VirtualFunction(1)),
        ),
    )
    assert d.devices[1].conditions[0] == Condition(
        "Healthy", "False", "XID", "xid 79", "2024-01-01T00:00:00Z", 2
    )
    assert d.metadata_extra["creationTimestamp"] == "2024-01-01T00:00:00Z"


def test_to_dict_returns_fresh_objects() -> None:
    d = Device.from_dict(FULL)
    out = d.to_dict()
    out["status"]["allocations"].clear()
    out["metadata"]["managedFields"].clear()
    out["metadata"]["ownerReferences"][0]["name"] = "changed"
    assert d.to_dict() != out
    assert Device.from_dict(FULL) == d


CANONICALIZING = [
    ("quantity-canonical", {GPU_MEMORY: "16384Mi"}, {GPU_MEMORY: "16Gi"}),
    ("quantity-number", {GPU_CORE: 100}, {GPU_CORE: "100"}),
    ("quantity-float", {GPU_CORE: 0.5}, {GPU_CORE: "500m"}),
    ("quantity-blanks", {GPU_CORE: " 100 "}, {GPU_CORE: "100"}),
]


@pytest.mark.parametrize(
    ("resources", "written"), [c[1:] for c in CANONICALIZING], ids=[c[0] for c in CANONICALIZING]
)
def test_resources_are_written_canonically(
    resources: dict[str, Any], written: dict[str, str]
) -> None:
    d = Device.from_dict(cr(gpu(0, resources=resources)))
    assert d.to_dict()["spec"]["devices"][0]["resources"] == written


NULLS = [
    ("labels", {"labels": None}),
    ("minor", {"minor": None}),
    ("health", {"health": None}),
    ("resources", {"resources": None}),
    ("topology", {"topology": None}),
    ("vfGroups", {"vfGroups": None}),
]


@pytest.mark.parametrize("extra", [n[1] for n in NULLS], ids=[n[0] for n in NULLS])
def test_null_means_absent(extra: dict[str, Any]) -> None:
    info = Device.from_dict(cr(gpu(0, **extra))).devices[0]
    key = next(iter(extra))
    assert key not in info.to_dict() or key == "health"


ERRORS = [
    (
        "bad-quantity",
        cr(gpu(0), gpu(1), gpu(2, resources={GPU_MEMORY: "12Zi"})),
        'spec.devices[2].resources["koordinator.sh/gpu-memory"]: invalid quantity "12Zi"',
    ),
    (
        "quantity-bool",
        cr(gpu(0, resources={GPU_CORE: True})),
        'spec.devices[0].resources["koordinator.sh/gpu-core"]: expected a quantity, got boolean',
    ),
    (
        "minor-string",
        cr(gpu(0, minor="0")),
        "spec.devices[0].minor: expected an integer, got string",
    ),
    (
        "minor-float",
        cr(gpu(0, minor=1.0)),
        "spec.devices[0].minor: expected an integer, got number",
    ),
    (
        "minor-big",
        cr(gpu(0, minor=2**31)),
        "spec.devices[0].minor: integer 2147483648 out of int32 range",
    ),
    (
        "health-string",
        cr(gpu(0, health="true")),
        "spec.devices[0].health: expected a boolean, got string",
    ),
    ("type-int", cr(gpu(0, type=1)), "spec.devices[0].type: expected a string, got number"),
    (
        "label-value",
        cr(gpu(0, labels={"a": 1})),
        'spec.devices[0].labels["a"]: expected a string, got number',
    ),
    (
        "topology-list",
        cr(gpu(0, topology=[])),
        "spec.devices[0].topology: expected an object, got array",
    ),
    (
        "topology-socket",
        cr(gpu(0, topology={"socketID": "x"})),
        "spec.devices[0].topology.socketID: expected an integer, got string",
    ),
    (
        "vf-minor",
        cr(gpu(0, vfGroups=[{"vfs": [{"minor": "a"}]}])),
        "spec.devices[0].vfGroups[0].vfs[0].minor: expected an integer, got string",
    ),
    (
        "condition-generation",
        cr(gpu(0, conditions=[{"type": "Healthy", "observedGeneration": "1"}])),
        "spec.devices[0].conditions[0].observedGeneration: expected an integer, got string",
    ),
    (
        "devices-object",
        {"metadata": {"name": "n"}, "spec": {"devices": {}}},
        "spec.devices: expected an array, got object",
    ),
    ("device-string", cr("gpu"), "spec.devices[0]: expected an object, got string"),  # type: ignore[arg-type]
    (
        "spec-string",
        {"metadata": {"name": "n"}, "spec": "x"},
        "spec: expected an object, got string",
    ),
    ("no-name", {"metadata": {}}, "metadata.name: required"),
    ("no-metadata", {"spec": {}}, "metadata.name: required"),
    (
        "wrong-kind",
        {"kind": "Node", "metadata": {"name": "n"}},
        'kind: expected "Device", got "Node"',
    ),
    (
        "annotation-value",
        cr(annotations={"a": None}),
        'metadata.annotations["a"]: expected a string, got null',
    ),
    (
        "owner-ref",
        cr(ownerReferences=["x"]),
        "metadata.ownerReferences[0]: expected an object, got string",
    ),
    ("status-list", {**cr(), "status": []}, "status: expected an object, got array"),
    ("root-list", [], "<root>: expected an object, got array"),
]


@pytest.mark.parametrize(("obj", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_decode_errors_name_the_field(obj: Any, message: str) -> None:
    with pytest.raises(DeviceDecodeError) as info:
        Device.from_dict(obj)
    assert str(info.value) == message
    assert message.startswith(info.value.path + ": ")


MODELS = [
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100 SXM4 80GB", "A100-SXM4-80GB"),
    ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
    ("Tesla T4", "Tesla-T4"),
    ("NVIDIA GeForce RTX 2080 Ti", "GeForce-RTX-2080-Ti"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
    ("NVIDIAX", "NVIDIAX"),
]


@pytest.mark.parametrize(("nvml", "label"), MODELS, ids=[m[0] for m in MODELS])
def test_gpu_model_name(nvml: str, label: str) -> None:
    assert gpu_model_name(nvml) == label


def test_defaults_when_optional_parts_are_missing() -> None:
    d = Device.from_dict({"metadata": {"name": "n"}})
    assert d == Device(name="n")
    assert d.to_dict() == {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "n"},
        "spec": {},
    }


def test_json_text_round_trip() -> None:
    d = Device.from_dict(json.loads(json.dumps(FULL)))
    assert Device.from_dict(json.loads(json.dumps(d.to_dict()))) == d


_names = st.text("abcdefghijklmnopqrstuvwxyz-./", min_size=1, max_size=12)
_int32 = st.integers(-(2**31), 2**31 - 1)
_quantities = st.builds(
    lambda n, s, f: Quantity(Fraction(n, 10**s), f),
    st.integers(0, 10**15),
    st.integers(0, 9),
    st.sampled_from([DECIMAL_SI, BINARY_SI]),
)
_topologies = st.builds(DeviceTopology, _int32, _int32, _names, st.text(max_size=12))
_infos = st.builds(
    DeviceInfo,
    type=st.sampled_from(["gpu", "rdma", "fpga", ""]),
    id=st.text(max_size=20),
    minor=st.none() | _int32,
    health=st.booleans(),
    resources=st.dictionaries(_names, _quantities, max_size=3),
    topology=st.none() | _topologies,
    module_id=st.none() | _int32,
    vf_groups=st.lists(
        st.builds(
            VirtualFunctionGroup,
            labels=st.dictionaries(_names, st.text(max_size=5), max_size=2),
            vfs=st.lists(st.builds(VirtualFunction, _int32, st.text(max_size=8)), max_size=2).map(
                tuple
            ),
        ),
        max_size=2,
    ).map(tuple),
    labels=st.dictionaries(_names, st.text(max_size=8), max_size=3),
    conditions=st.lists(
        st.builds(
            Condition,
            type=_names,
            status=st.sampled_from(["True", "False", "Unknown"]),
            reason=st.text(max_size=5),
            message=st.text(max_size=5),
            last_transition_time=st.sampled_from(["", "2024-01-01T00:00:00Z"]),
            observed_generation=st.none() | st.integers(0, 10),
        ),
        max_size=2,
    ).map(tuple),
)


@given(st.lists(_infos, max_size=4), st.dictionaries(_names, st.text(max_size=8), max_size=2))
def test_round_trip_property(infos: list[DeviceInfo], labels: dict[str, str]) -> None:
    d = Device(name="node-x", devices=tuple(infos), labels=labels, uid="u", resource_version="7")
    assert Device.from_dict(d.to_dict()) == d
    assert Device.from_dict(json.loads(json.dumps(d.to_dict()))) == d
