"""gpushare's device-plugin protocol: fake devices, the pod an Allocate is for, the env."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from koordlet.deviceplugin.gpushare import (
    ANNOTATION_ASSIGNED,
    ANNOTATION_ASSUME_TIME,
    ANNOTATION_IDX,
    AllocateError,
    Card,
    MemoryUnit,
    PendingPod,
    allocate_envs,
    assigned_annotations,
    card_of_device,
    choose_pod,
    fake_devices,
    remaining,
)

GI = 1 << 30
CARDS = (
    Card(0, "GPU-a", 16 * GI, numa_node=0),
    Card(1, "GPU-b", 40 * GI + 123, numa_node=1),
    Card(2, "GPU-c", 8 * GI, healthy=False),
)


def pending(
    name: str, units: int, idx: int | None = 0, assume: int = 1, assigned: str = "false"
) -> PendingPod:
    annotations = {ANNOTATION_ASSIGNED: assigned, ANNOTATION_ASSUME_TIME: str(assume)}
    if idx is not None:
        annotations[ANNOTATION_IDX] = str(idx)
    return PendingPod("ns", name, f"uid-{name}", units, annotations, resource_version="7")


def test_one_device_per_unit_of_each_card_with_its_own_size() -> None:
    devices = fake_devices(reversed(CARDS), MemoryUnit.GiB)
    assert len(devices) == 16 + 40 + 8
    assert devices[0].id == "GPU-a-_-0" and devices[15].id == "GPU-a-_-15"
    assert devices[16].id == "GPU-b-_-0" and devices[16].numa_node == 1
    assert all(not d.healthy for d in devices if d.id.startswith("GPU-c"))
    assert all(d.healthy for d in devices if not d.id.startswith("GPU-c"))
    assert len(fake_devices(CARDS[:1], MemoryUnit.MiB)) == 16 * 1024


@pytest.mark.parametrize(
    ("device", "card"),
    [
        pytest.param("GPU-a-_-3", "GPU-a", id="unit"),
        pytest.param("GPU-1-2-_-_-9", "GPU-1-2-_", id="separator-in-uuid"),
        pytest.param("GPU-a", "GPU-a", id="bare"),
    ],
)
def test_card_of_device(device: str, card: str) -> None:
    assert card_of_device(device) == card


@pytest.mark.parametrize(
    ("pods", "units", "chosen"),
    [
        pytest.param([pending("a", 4, assume=5), pending("b", 4, assume=2)], 4, "b", id="oldest"),
        pytest.param([pending("a", 4, assume=2), pending("b", 2, assume=1)], 2, "b", id="size"),
        pytest.param(
            [pending("a", 4, assume=1, assigned="true"), pending("b", 4, assume=9)],
            4,
            "b",
            id="assigned-skipped",
        ),
        pytest.param(
            [pending("a", 4, idx=None, assume=1), pending("b", 4, assume=9)],
            4,
            "b",
            id="unannotated-skipped",
        ),
        pytest.param([pending("z", 4, assume=3), pending("y", 4, assume=3)], 4, "y", id="ties"),
    ],
)
def test_choose_pod(pods: list[PendingPod], units: int, chosen: str) -> None:
    assert choose_pod(pods, [units], MemoryUnit.GiB).name == chosen


def test_no_matching_pod_is_a_clear_error() -> None:
    with pytest.raises(AllocateError) as err:
        choose_pod([pending("a", 4), pending("b", 2)], [3], MemoryUnit.GiB)
    assert str(err.value) == (
        "no pending pod on this node has a container left that asks for 3 GiB of "
        "aliyun.com/gpu-mem with ALIYUN_COM_GPU_MEM_ASSIGNED=false; waiting containers ask "
        "for 2, 4"
    )
    with pytest.raises(AllocateError, match="asks for 1 MiB"):
        choose_pod([], [1], MemoryUnit.MiB)


def test_choose_pod_matches_one_container_not_the_pod_total() -> None:
    # the kubelet calls Allocate once per container: a 1 GiB call is for the two-container
    # pod's first container, not for the (newer) one-container 1 GiB pod's... unless the
    # two-container pod is newer, then the oldest wins as in gpushare
    pair = dataclasses.replace(pending("pair", 3, assume=1), containers=(1, 2))
    single = pending("single", 1, assume=5)
    assert choose_pod([single, pair], [1], MemoryUnit.GiB).name == "pair"
    assert choose_pod([single, pair], [2], MemoryUnit.GiB).name == "pair"
    with pytest.raises(AllocateError):
        choose_pod([single, pair], [3], MemoryUnit.GiB)  # no container asks for 3


def test_a_partly_served_pod_comes_first_and_only_for_what_it_has_left() -> None:
    pair = dataclasses.replace(pending("pair", 2, assume=9), containers=(1, 1))
    old = pending("old", 1, assume=1)
    assert choose_pod([old, pair], [1], MemoryUnit.GiB).name == "old"
    served = {pair.uid: Counter({1: 1})}
    assert remaining(pair, served) == Counter({1: 1})
    assert choose_pod([old, pair], [1], MemoryUnit.GiB, served).name == "pair"
    served = {pair.uid: Counter({1: 2})}
    assert not remaining(pair, served)
    assert choose_pod([old, pair], [1], MemoryUnit.GiB, served).name == "old"


def test_several_containers_in_one_call_need_a_pod_with_each() -> None:
    multi = dataclasses.replace(pending("multi", 5, assume=3), containers=(2, 3))
    assert choose_pod([pending("five", 5, assume=1), multi], [2, 3], MemoryUnit.GiB) is multi
    assert choose_pod([pending("five", 5, assume=1), multi], [5], MemoryUnit.GiB).name == "five"


def test_envs_per_container() -> None:
    pod = pending("a", 6, idx=1)
    envs = allocate_envs(pod, [2, 4], CARDS, MemoryUnit.GiB)
    assert envs == [
        {
            "NVIDIA_VISIBLE_DEVICES": "1",
            "ALIYUN_COM_GPU_MEM_IDX": "1",
            "ALIYUN_COM_GPU_MEM_POD": "6",
            "ALIYUN_COM_GPU_MEM_CONTAINER": str(n),
            "ALIYUN_COM_GPU_MEM_DEV": "40",
        }
        for n in (2, 4)
    ]


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        pytest.param(
            pending("a", 4, idx=7),
            r"card 7 \(ALIYUN_COM_GPU_MEM_IDX\) is not on this node",
            id="unknown-card",
        ),
        pytest.param(pending("a", 4, idx=2), "card 2 is unhealthy", id="unhealthy"),
        pytest.param(pending("a", 17, idx=0), "asks for 17 GiB but card 0 has 16", id="too-big"),
    ],
)
def test_envs_fail_closed(pod: PendingPod, message: str) -> None:
    with pytest.raises(AllocateError, match=message):
        allocate_envs(pod, [pod.units], CARDS, MemoryUnit.GiB)


def test_bad_index_annotation() -> None:
    pod = pending("a", 4)
    pod = PendingPod(pod.namespace, pod.name, pod.uid, 4, {**pod.annotations, ANNOTATION_IDX: "x"})
    with pytest.raises(AllocateError, match="'x' is not a card index"):
        allocate_envs(pod, [4], CARDS, MemoryUnit.GiB)


def test_assigned_annotations() -> None:
    assert assigned_annotations(123) == {
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
        "ALIYUN_COM_GPU_MEM_ASSIGN_TIME": "123",
    }
