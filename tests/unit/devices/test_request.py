"""A pod's device request: SPEC §3 combinations through PreFilter, splits, hints, joint."""

from __future__ import annotations

from typing import Any

import pytest

from apis.hints import ANNOTATION_DEVICE_ALLOCATE_HINT, ANNOTATION_DEVICE_JOINT_ALLOCATE
from scheduler.devices.request import TypeRequest, parse_request
from scheduler.framework.status import Code
from scheduler.plugins.deviceshare.plugin import STATE_KEY
from scheduler.plugins.deviceshare.state import DeviceShareState
from tests.builders import make_pod
from tests.unit.devices.helpers import GI, gpu_pod, gpus, plugin_of, prefilter

CORE = "koordinator.sh/gpu-core"
MEM = "koordinator.sh/gpu-memory"
RATIO = "koordinator.sh/gpu-memory-ratio"
SHARED = "koordinator.sh/gpu.shared"
KGPU = "koordinator.sh/gpu"
NVIDIA = "nvidia.com/gpu"
RDMA = "koordinator.sh/rdma"
FPGA = "koordinator.sh/fpga"

T = True
F = False


def gpu_req(count: int, core: int, ratio: int, memory: int, requested: tuple[bool, ...],
            total: tuple[int, ...], shared: bool) -> TypeRequest:
    return TypeRequest("gpu", count, (core, ratio, memory), requested, total, shared)


# SPEC §3, allowed rows: request -> the TypeRequests PreFilter computes.
VALID: list[Any] = [
    pytest.param({NVIDIA: 2}, [gpu_req(2, 100, 100, 0, (T, T, F), (200, 200, 0), F)],
                 id="nvidia-gpu-2"),
    pytest.param({KGPU: 50}, [gpu_req(1, 50, 50, 0, (T, T, F), (50, 50, 0), T)],
                 id="koord-gpu-50"),
    pytest.param({KGPU: 200}, [gpu_req(2, 100, 100, 0, (T, T, F), (200, 200, 0), F)],
                 id="koord-gpu-200"),
    pytest.param({MEM: "8Gi"}, [gpu_req(1, 0, 0, 8 * GI, (F, F, T), (0, 0, 8 * GI), T)],
                 id="memory-alone"),
    pytest.param({RATIO: 50}, [gpu_req(1, 0, 50, 0, (F, T, F), (0, 50, 0), T)],
                 id="ratio-alone-50"),
    pytest.param({RATIO: 300}, [gpu_req(3, 0, 100, 0, (F, T, F), (0, 300, 0), F)],
                 id="ratio-alone-300"),
    pytest.param({CORE: 50, MEM: "8Gi"},
                 [gpu_req(1, 50, 0, 8 * GI, (T, F, T), (50, 0, 8 * GI), T)], id="core-memory"),
    pytest.param({CORE: 200, MEM: "16Gi"},
                 [gpu_req(1, 200, 0, 16 * GI, (T, F, T), (200, 0, 16 * GI), T)],
                 id="core-200-memory"),
    pytest.param({CORE: 50, RATIO: 50}, [gpu_req(1, 50, 50, 0, (T, T, F), (50, 50, 0), T)],
                 id="core-ratio"),
    pytest.param({CORE: 200, RATIO: 200}, [gpu_req(2, 100, 100, 0, (T, T, F), (200, 200, 0), F)],
                 id="core-ratio-200"),
    pytest.param({SHARED: 2, RATIO: 100, CORE: 100},
                 [gpu_req(2, 50, 50, 0, (T, T, F), (100, 100, 0), T)], id="shared-2-core-ratio"),
    pytest.param({SHARED: 2, MEM: "16Gi"},
                 [gpu_req(2, 0, 0, 8 * GI, (F, F, T), (0, 0, 16 * GI), T)], id="shared-2-memory"),
    pytest.param({SHARED: 2, RATIO: 200}, [gpu_req(2, 0, 100, 0, (F, T, F), (0, 200, 0), F)],
                 id="shared-2-ratio-200-whole"),
    pytest.param({RDMA: 50}, [TypeRequest("rdma", 1, (50,), (T,), (50,), T)], id="rdma-50"),
    pytest.param({RDMA: 200}, [TypeRequest("rdma", 2, (100,), (T,), (200,), F)], id="rdma-200"),
    pytest.param({FPGA: 100}, [TypeRequest("fpga", 1, (100,), (T,), (100,), F)], id="fpga-100"),
    pytest.param({KGPU: "50.5"}, [gpu_req(1, 51, 51, 0, (T, T, F), (51, 51, 0), T)],
                 id="non-integer-rounds-up"),
    pytest.param({NVIDIA: 1, RDMA: 1, FPGA: 100},
                 [gpu_req(1, 100, 100, 0, (T, T, F), (100, 100, 0), F),
                  TypeRequest("rdma", 1, (1,), (T,), (1,), T),
                  TypeRequest("fpga", 1, (100,), (T,), (100,), F)], id="gpu-rdma-fpga"),
]


@pytest.mark.parametrize(("requests", "want"), VALID)
def test_prefilter_valid(requests: dict[str, Any], want: list[TypeRequest]) -> None:
    plugin, _ = plugin_of([gpus("n", 1)])
    state, status = prefilter(plugin, gpu_pod("p", requests).build())
    assert status is None
    entry = state.read(STATE_KEY)
    assert isinstance(entry, DeviceShareState)
    assert entry.request is not None
    assert list(entry.request.types) == want


# SPEC §3, rejected rows: the exact PreFilter message (UnschedulableAndUnresolvable).
INVALID: list[Any] = [
    pytest.param({CORE: 50}, f"invalid resource device requests: [{CORE}]", id="core-alone"),
    pytest.param({KGPU: 150}, f"invalid resource unit {KGPU}: 150", id="koord-gpu-150"),
    pytest.param({KGPU: 101}, f"invalid resource unit {KGPU}: 101", id="koord-gpu-101"),
    pytest.param({KGPU: "100.5"}, f"invalid resource unit {KGPU}: 100500m",
                 id="koord-gpu-exact-quantity"),
    pytest.param({RDMA: 150}, f"invalid resource unit {RDMA}: 150", id="rdma-150"),
    pytest.param({FPGA: 1050}, f"invalid resource unit {FPGA}: 1050", id="fpga-1050"),
    pytest.param({FPGA: "1.55k"}, f"invalid resource unit {FPGA}: 1550", id="fpga-1550"),
    pytest.param({RATIO: 150}, f"invalid resource device requests: [{RATIO}]",
                 id="ratio-150"),
    pytest.param({CORE: 150, RATIO: 50},
                 f"invalid resource device requests: [{CORE} {RATIO}]", id="core-150-ratio"),
    pytest.param({CORE: 50, MEM: "8Gi", RATIO: 50},
                 f"invalid resource device requests: [{CORE} {MEM} {RATIO}]",
                 id="core-memory-ratio"),
    pytest.param({NVIDIA: 1, CORE: 100},
                 f"invalid resource device requests: [{CORE} {NVIDIA}]", id="nvidia-and-core"),
    pytest.param({KGPU: 50, RATIO: 50},
                 f"invalid resource device requests: [{KGPU} {RATIO}]", id="koord-gpu-and-ratio"),
    pytest.param({SHARED: 2}, f"invalid resource device requests: [{SHARED}]",
                 id="shared-alone"),
    pytest.param({SHARED: 2, CORE: 100},
                 f"invalid resource device requests: [{CORE} {SHARED}]", id="shared-core-only"),
    pytest.param({SHARED: 2, RATIO: 101},
                 f"invalid resource device requests: [{RATIO} {SHARED}]",
                 id="shared-not-multiple"),
    pytest.param({SHARED: 2, RATIO: 300},
                 f"invalid resource device requests: [{RATIO} {SHARED}]",
                 id="shared-over-100-per-gpu"),
    pytest.param({SHARED: 2, CORE: 300, MEM: "8Gi"},
                 f"invalid resource device requests: [{CORE} {MEM} {SHARED}]",
                 id="shared-core-over-100-per-gpu"),
]


@pytest.mark.parametrize(("requests", "message"), INVALID)
def test_prefilter_invalid(requests: dict[str, Any], message: str) -> None:
    plugin, _ = plugin_of([gpus("n", 1)])
    state, status = prefilter(plugin, gpu_pod("p", requests).build())
    assert status is not None
    assert status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.reasons == (message,)
    assert state.get(STATE_KEY) is None


def test_prefilter_skips_pods_without_devices() -> None:
    plugin, _ = plugin_of([gpus("n", 1)])
    pod = make_pod("cpu").req(cpu="2", memory="1Gi").annotation(
        ANNOTATION_DEVICE_ALLOCATE_HINT, "{not json"
    )
    state, status = prefilter(plugin, pod.build())
    assert status is not None and status.code == Code.SKIP
    entry = state.read(STATE_KEY)
    assert isinstance(entry, DeviceShareState) and entry.request is None


def test_requests_sum_containers_and_take_init_max() -> None:
    pod = (make_pod("p").req({KGPU: "50"}).container({KGPU: "50"})
           .init_container({KGPU: "100", "cpu": "1"}).build())
    request = parse_request(pod)
    assert request is not None
    assert request.types == (gpu_req(1, 100, 100, 0, (T, T, F), (100, 100, 0), F),)


HINT_ERRORS: list[Any] = [
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT: "{"},
                 f"invalid {ANNOTATION_DEVICE_ALLOCATE_HINT} annotation: invalid JSON",
                 id="hint-json"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT: '{"gpu":{"requiredTopologyScope":"Rack"}}'},
                 f"invalid {ANNOTATION_DEVICE_ALLOCATE_HINT} annotation: "
                 'gpu.requiredTopologyScope: unknown value "Rack"', id="hint-scope"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT:
                  '{"gpu":{"selector":{"matchExpressions":[{"key":"a","operator":"Has"}]}}}'},
                 f"invalid {ANNOTATION_DEVICE_ALLOCATE_HINT} annotation: "
                 "gpu.selector.matchExpressions[0].operator", id="hint-selector"),
    pytest.param({ANNOTATION_DEVICE_JOINT_ALLOCATE: '{"deviceTypes":"gpu"}'},
                 f"invalid {ANNOTATION_DEVICE_JOINT_ALLOCATE} annotation: deviceTypes: "
                 "expected an array", id="joint-types"),
    pytest.param({ANNOTATION_DEVICE_JOINT_ALLOCATE: '{"requiredScope":"SameNUMA"}'},
                 f"invalid {ANNOTATION_DEVICE_JOINT_ALLOCATE} annotation: requiredScope",
                 id="joint-scope"),
]


@pytest.mark.parametrize(("annotations", "prefix"), HINT_ERRORS)
def test_prefilter_malformed_hints(annotations: dict[str, str], prefix: str) -> None:
    plugin, _ = plugin_of([gpus("n", 1)])
    _, status = prefilter(plugin, gpu_pod("p", {NVIDIA: 1}, annotations).build())
    assert status is not None
    assert status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.message.startswith(prefix), status.message


HINTS: list[Any] = [
    pytest.param({RDMA: 1}, '{"rdma":{"allocateStrategy":"ApplyForAll"}}',
                 TypeRequest("rdma", 0, (1,), (T,), (1,), T), id="apply-for-all"),
    pytest.param({RDMA: 3}, '{"rdma":{"allocateStrategy":"RequestsAsCount"}}',
                 TypeRequest("rdma", 3, (1,), (T,), (3,), T), id="requests-as-count"),
    pytest.param({RDMA: 2}, '{"rdma":{"allocateStrategy":"RequestsAsCount",'
                 '"exclusivePolicy":"DeviceLevel"}}',
                 TypeRequest("rdma", 2, (100,), (T,), (2,), F), id="requests-as-count-exclusive"),
    pytest.param({RDMA: 200}, '{"rdma":{"allocateStrategy":"ApplyForAll"}}',
                 TypeRequest("rdma", 2, (100,), (T,), (200,), F),
                 id="multiple-of-100-wins-over-hint"),
]


@pytest.mark.parametrize(("requests", "hint", "want"), HINTS)
def test_rdma_allocate_strategies(requests: dict[str, Any], hint: str, want: TypeRequest
                                  ) -> None:
    request = parse_request(gpu_pod("p", requests, {ANNOTATION_DEVICE_ALLOCATE_HINT: hint})
                            .build())
    assert request is not None
    assert request.types == (want,)
    assert not request.vectorizable


JOINT: list[Any] = [
    pytest.param({NVIDIA: 1, RDMA: 1}, '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
                 "", ("gpu", "rdma"), True, id="gpu-rdma-same-pcie"),
    pytest.param({NVIDIA: 1, RDMA: 1}, '{"deviceTypes":["rdma","gpu"]}', "", ("rdma", "gpu"),
                 False, id="order-kept-no-scope"),
    pytest.param({NVIDIA: 1}, '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}', "",
                 ("gpu",), True, id="unrequested-type-dropped"),
    pytest.param({NVIDIA: 1, RDMA: 1}, '{"deviceTypes":["gpu","rdma"]}',
                 '{"rdma":{"allocateStrategy":"ApplyForAll"}}', ("gpu",), False,
                 id="apply-for-all-dropped"),
]


@pytest.mark.parametrize(("requests", "joint", "hint", "types", "same_pcie"), JOINT)
def test_joint_allocate(requests: dict[str, Any], joint: str, hint: str,
                        types: tuple[str, ...], same_pcie: bool) -> None:
    annotations = {ANNOTATION_DEVICE_JOINT_ALLOCATE: joint}
    if hint:
        annotations[ANNOTATION_DEVICE_ALLOCATE_HINT] = hint
    request = parse_request(gpu_pod("p", requests, annotations).build())
    assert request is not None
    assert request.joint_types == types
    assert request.joint_same_pcie is same_pcie


VECTORIZABLE: list[Any] = [
    pytest.param({}, True, id="no-hints"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT: '{"gpu":{"requiredTopologyScope":"Node"}}'},
                 True, id="node-scope-is-trivial"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT: '{"fpga":{"selector":{}}}'}, True,
                 id="hint-for-unrequested-type"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT: '{"gpu":{"requiredTopologyScope":"PCIe"}}'},
                 False, id="pcie-scope"),
    pytest.param({ANNOTATION_DEVICE_ALLOCATE_HINT: '{"gpu":{"selector":{}}}'}, False,
                 id="selector"),
]


@pytest.mark.parametrize(("annotations", "want"), VECTORIZABLE)
def test_vectorizable(annotations: dict[str, str], want: bool) -> None:
    request = parse_request(gpu_pod("p", {NVIDIA: 2}, annotations).build())
    assert request is not None
    assert request.vectorizable is want
