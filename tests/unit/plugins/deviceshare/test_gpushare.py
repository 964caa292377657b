"""gpushare pods through DeviceShare and the one ledger: ``aliyun.com/gpu-mem`` requests, the
accounting of pods gpushare placed before a switch, and gpushare's bind annotations."""

from __future__ import annotations

import pytest

from apis.core import Pod
from apis.gpushare import MemoryUnit, UnhealthyGPUs
from scheduler.devices.request import RequestError, parse_request
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import UNHEALTHY_GPUS_KIND, Change
from scheduler.framework.status import Status
from scheduler.framework.types import Snapshot
from scheduler.plugins.deviceshare.plugin import DeviceShare
from tests.builders import PodBuilder, make_node, make_pod
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


def bind(plugin: DeviceShare, snapshot: Snapshot, pod: Pod) -> dict[str, str] | Status:
    """PreFilter, Filter on ``n``, Reserve and PreBind: the annotations of the bind, or the
    first status that is not a success."""
    state = CycleState()
    for status in (
        plugin.pre_filter(state, pod),
        plugin.filter(state, pod, info(snapshot, "n")),
        plugin.reserve(state, pod, "n"),
        plugin.pre_bind(state, pod, "n"),
    ):
        if status is not None:
            return status
    return dict(state.bind_annotations)


def capacity_only(units: int, count: int, *pods: Pod) -> tuple[DeviceShare, Snapshot]:
    """A node with gpushare's device plugin alone: no Device CR, only its capacity."""
    plugin, snapshot = plugin_of([], pods, nodes=["n"],
                                 args={"scoringStrategy": {"type": "MostAllocated"}})
    node = make_node("n").cpu("64").gpushare(units, count).build()
    plugin.ledger.apply_change(Change("Node", None, node))
    plugin._clock_ns = lambda: 1234
    return plugin, snapshot


def test_a_node_with_only_gpushare_capacity_takes_gpushare_pods_binpacked() -> None:
    """Issue 27 item 1: before, "Insufficient gpu devices" on every such node."""
    old = gs_pod("old", 10, ALIYUN_COM_GPU_MEM_IDX="1", ALIYUN_COM_GPU_MEM_POD="10").node("n")
    plugin, snapshot = capacity_only(33, 2, old.build())  # 2 cards of 16 (integer division)
    got = bind(plugin, snapshot, gs_pod("p", 6).build())
    assert isinstance(got, dict), got
    # binpack: card 1 has 6 left next to the pod gpushare placed there, exactly enough
    assert (got["ALIYUN_COM_GPU_MEM_IDX"], got["ALIYUN_COM_GPU_MEM_DEV"]) == ("1", "16")
    too_big = bind(plugin, snapshot, gs_pod("big", 17).build())
    assert isinstance(too_big, Status) and too_big.reasons == ("Insufficient gpu devices",)


def test_a_card_the_unhealthy_configmap_names_is_never_chosen() -> None:
    """Issue 27 item 3: before, the ConfigMap was ignored."""
    old = gs_pod("old", 4, ALIYUN_COM_GPU_MEM_IDX="0", ALIYUN_COM_GPU_MEM_POD="4").node("n")
    plugin, snapshot = capacity_only(32, 2, old.build())
    marks = UnhealthyGPUs("n", frozenset({0}))
    plugin.ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, None, marks))
    got = bind(plugin, snapshot, gs_pod("p", 2).build())
    assert isinstance(got, dict) and got["ALIYUN_COM_GPU_MEM_IDX"] == "1", got
    plugin.ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, marks, None))
    again = bind(plugin, snapshot, gs_pod("q", 2).build())
    assert isinstance(again, dict) and again["ALIYUN_COM_GPU_MEM_IDX"] == "0", again


def test_pod_units_count_app_containers_only_and_the_card_holds_the_init_container() -> None:
    """Issue 27 item 5: ``ALIYUN_COM_GPU_MEM_POD`` was "4" where gpushare writes "1"."""
    plugin, snapshot = capacity_only(32, 2)
    pod = gs_pod("p", 1).init_container({"aliyun.com/gpu-mem": "4"}).build()
    got = bind(plugin, snapshot, pod)
    assert isinstance(got, dict), got
    assert got["ALIYUN_COM_GPU_MEM_POD"] == "1"
    # the init container runs on the card first: the scheduler keeps its 4 GiB there
    assert '"koordinator.sh/gpu-memory":"4Gi"' in got["scheduling.koordinator.sh/device-allocated"]
