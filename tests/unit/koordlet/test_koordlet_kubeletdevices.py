"""koordlet.kubelet.devices: device-plugin GPUs seen by the hook, until the checkpoint has them."""

from __future__ import annotations

from apis.checkpoint import PodDeviceEntry
from koordlet.kubelet.devices import HotDevices


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_record_wakes_once_and_merges_until_the_checkpoint_lists_it() -> None:
    woken: list[int] = []
    hot = HotDevices(on_change=lambda: woken.append(1))
    hot.record("uid-a", "cuda", ("GPU-1",))
    hot.record("uid-a", "cuda", ("GPU-1",))  # the same again: nothing new
    assert len(woken) == 1
    other = PodDeviceEntry("uid-b", "x", "nvidia.com/gpu", ("GPU-2",))
    assert hot.merged([other]) == (
        other,
        PodDeviceEntry("uid-a", "cuda", "nvidia.com/gpu", ("GPU-1",)),
    )
    listed = PodDeviceEntry("uid-a", "cuda", "nvidia.com/gpu", ("GPU-1::2",))
    assert hot.merged([listed]) == (listed,)
    assert hot.entries() == ()  # the checkpoint is the source of truth from now on


def test_ignores_empty_records() -> None:
    hot = HotDevices()
    hot.record("", "cuda", ("GPU-1",))
    hot.record("uid", "cuda", ())
    assert hot.entries() == ()


def test_retain_forgets_gone_pods_only_after_a_later_list() -> None:
    clock = Clock()
    hot = HotDevices(monotonic=clock)
    hot.record("uid-a", "cuda", ("GPU-1",))
    hot.retain(frozenset(), listed_at=clock.now - 1)  # a list started before the record
    assert len(hot.entries()) == 1
    hot.retain(frozenset({"uid-a"}), listed_at=clock.now + 1)
    assert len(hot.entries()) == 1
    hot.retain(frozenset(), listed_at=clock.now + 1)
    assert hot.entries() == ()
