"""koordlet.kubelet.deviceids: device-plugin ids (time-slicing, MIG, index, gpushare) -> cards."""

from __future__ import annotations

from pathlib import Path

import pytest

from apis.checkpoint import PodDeviceEntry, parse_kubelet_checkpoint
from koordlet.devices.fake import FakeLibrary, parse_fake_spec
from koordlet.devices.library import GPU
from koordlet.kubelet.deviceids import CardResolver, normalize_entries

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-device-plugin-ids.json"

# NVML index order differs from minor order on purpose: index ids name the NVML index.
GPUS = (
    GPU(uuid="GPU-1111", minor=0, index=1),
    GPU(uuid="GPU-2222", minor=1, index=2),
    GPU(uuid="GPU-3333", minor=2, index=0),
)
MIGS = {"MIG-aaaa-0001": "GPU-2222", "MIG-elsewhere": "GPU-on-another-node"}


def resolver() -> CardResolver:
    return CardResolver(GPUS, MIGS.get)


CASES = [
    pytest.param("GPU-1111", "GPU-1111", id="uuid"),
    pytest.param("GPU-1111::7", "GPU-1111", id="time-slicing-replica"),
    pytest.param("MIG-aaaa-0001", "GPU-2222", id="mig-through-the-library"),
    pytest.param("MIG-aaaa-0001::1", "GPU-2222", id="time-sliced-mig"),
    pytest.param("MIG-GPU-3333/2/0", "GPU-3333", id="mig-pre-r470-name"),
    pytest.param("0", "GPU-3333", id="nvml-index"),
    pytest.param("2:1", "GPU-2222", id="mig-index-strategy"),
    pytest.param("GPU-2222-_-5", "GPU-2222", id="gpushare-memory-unit"),
    pytest.param("GPU-9999", None, id="unknown-uuid"),
    pytest.param("MIG-elsewhere", None, id="mig-of-a-card-not-here"),
    pytest.param("MIG-GPU-9999/1/0", None, id="old-mig-of-a-card-not-here"),
    pytest.param("7", None, id="index-out-of-range"),
    pytest.param("all", None, id="not-an-id"),
]


@pytest.mark.parametrize(("device_id", "want"), CASES)
def test_card_of_a_device_id(device_id: str, want: str | None) -> None:
    assert resolver().card(device_id) == want


def test_checkpoint_fixture_is_published_by_card() -> None:
    entries = parse_kubelet_checkpoint(FIXTURE.read_bytes()).entries
    spec = parse_fake_spec(
        {"gpus": [
            {"uuid": "GPU-3333", "minor": 2},  # NVML index 0
            {"uuid": "GPU-1111", "minor": 0},  # NVML index 1
            {"uuid": "GPU-2222", "minor": 1, "migDevices": ["MIG-aaaa-0001"]},  # index 2
        ]},
        FIXTURE.parent,
    )  # fmt: skip
    library = FakeLibrary(spec)
    got = {e.pod_uid: e.device_ids for e in
           normalize_entries(entries, library.discover().gpus, library.mig_parent)}  # fmt: skip
    assert got == {
        "pod-ts": ("GPU-1111",),  # two replicas of one card: the card once
        "pod-mig": ("GPU-2222",),
        "pod-old-mig": ("GPU-3333",),
        "pod-index": ("GPU-2222",),
        "pod-unknown": ("GPU-not-here", "MIG-unknown", "9"),  # kept as they are
    }


def test_mig_answers_are_cached() -> None:
    asked: list[str] = []

    def parent(mig: str) -> str | None:
        asked.append(mig)
        return MIGS.get(mig)

    r = CardResolver(GPUS, parent)
    entry = PodDeviceEntry("p", "c", "nvidia.com/gpu", ("MIG-aaaa-0001",))
    assert r.normalize([entry, entry])[1].device_ids == ("GPU-2222",)
    assert asked == ["MIG-aaaa-0001"]
