"""gpushare pods through DeviceShare and the one ledger: ``aliyun.com/gpu-mem`` requests, the
accounting of pods gpushare placed before a switch, and gpushare's bind annotations."""

from __future__ import annotations

import pytest

from apis.gpushare import MemoryUnit
from scheduler.devices.request import RequestError, parse_request
from scheduler.framework.cycle_state import CycleState
from tests.builders import PodBuilder, make_pod
from tests.unit.devices.helpers import device, gpu, gpu_pod, info, ledger_of, plugin_of, verify

GI = 1 << 30


def gs_pod(name: str, units: int, **annotations: str) -> PodBuilder:
    pod = make_pod(name).req(cpu="1").limit({"aliyun.com/gpu-mem": str(units)})
    for k, v in annotations.items():
        pod.annotation(k, v)
    return pod


@pytest.mark.parametrize(
    ("unit", "memory"),
    [
        pytest.param(MemoryUnit.GiB, 3 * GI, id="GiB"),
        pytest.param(MemoryUnit.MiB, 3 << 20, id="MiB"),
    ],
)
def test_gpu_mem_asks_for_that_memory_on_one_card(unit: MemoryUnit, memory: int) -> None:
    request = parse_request(gs_pod("p", 3).build(), unit)
    assert request is not None and request.gpushare_units == 3
    (gpu_req,) = request.types
    assert gpu_req.count == 1 and gpu_req.per_device[2] == memory


def test_gpu_mem_cannot_be_combined_with_koordinator_gpu_resources() -> None:
    pod = gpu_pod("p", {"aliyun.com/gpu-mem": 2, "koordinator.sh/gpu-core": 50}).build()
    with pytest.raises(RequestError) as err:
        parse_request(pod)
    assert err.value.message == (
        "aliyun.com/gpu-mem cannot be combined with koordinator.sh/gpu-core: "
        "ask for GPU memory one way"
    )


def test_pods_placed_by_gpushare_hold_their_memory() -> None:
    placed = (
        gs_pod("old", 6, ALIYUN_COM_GPU_MEM_IDX="1", ALIYUN_COM_GPU_MEM_POD="6").node("n").build()
    )
    broken = (
        gs_pod("bad", 2, ALIYUN_COM_GPU_MEM_IDX="x", ALIYUN_COM_GPU_MEM_POD="2").node("n").build()
    )
    ledger = ledger_of([device("n", gpu(0, "16Gi"), gpu(1, "16Gi"))], [placed, broken])
    view = ledger.node_view("n", ("gpu",))
    free = {c.minor: c.free for c in view.cards["gpu"]}
    assert free[1][2] == 10 * GI and free[0][2] == 16 * GI
    assert ledger.annotation_errors == 1
    verify(ledger)
    replayed = type(ledger).replay([device("n", gpu(0, "16Gi"), gpu(1, "16Gi"))], [placed, broken])
    assert replayed.snapshot_state() == ledger.snapshot_state()


def test_bind_writes_gpushare_annotations_and_device_allocated() -> None:
    plugin, snapshot = plugin_of(
        [device("n", gpu(0, "16Gi"), gpu(1, "40Gi"))],
        args={"scoringStrategy": {"type": "MostAllocated"}},
    )
    plugin._clock_ns = lambda: 1234
    pod = gs_pod("p", 4).build()
    state = CycleState()
    assert plugin.pre_filter(state, pod) is None
    assert plugin.filter(state, pod, info(snapshot, "n")) is None
    assert plugin.reserve(state, pod, "n") is None
    assert plugin.pre_bind(state, pod, "n") is None
    annotations = dict(state.bind_annotations)
    idx = annotations["ALIYUN_COM_GPU_MEM_IDX"]
    assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == ("16" if idx == "0" else "40")
    assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert annotations["ALIYUN_COM_GPU_MEM_ASSUME_TIME"] == "1234"
    assert f'"minor":{idx}' in annotations["scheduling.koordinator.sh/device-allocated"]
    plugin.unreserve(state, pod, "n")
    assert all(c.free[2] == c.total[2] for c in plugin.ledger.node_view("n", ("gpu",)).cards["gpu"])


def test_unit_arg_is_validated() -> None:
    with pytest.raises(Exception, match="gpushareMemoryUnit: must be GiB or MiB"):
        plugin_of([device("n", gpu(0, "16Gi"))], args={"gpushareMemoryUnit": "KiB"})


def test_gpushare_units_beyond_int64_fill_the_card_instead_of_breaking_the_ledger() -> None:
    """Anyone may write these on a pod bound by nodeName: 10**25 GiB raised OverflowError out
    of the ledger's event handler (the scheduling thread); it now counts as the whole card."""
    huge = gs_pod("huge", 1, ALIYUN_COM_GPU_MEM_IDX="0",
                  ALIYUN_COM_GPU_MEM_POD="9" * 25).node("n").build()
    ledger = ledger_of([device("n", gpu(0, "16Gi"), gpu(1, "16Gi"))], [huge])
    free = {c.minor: c.free for c in ledger.node_view("n", ("gpu",)).cards["gpu"]}
    assert free[0][2] == 0 and free[1][2] == 16 * GI
    verify(ledger)
