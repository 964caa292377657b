"""Node-side device admission: the ledger of admitted pods (``koordlet.admission``).

Mutation-tested (``hack/mutation.py koordlet/admission.py``, mutmut 3, these tests): no mutant
survives, so none is named equivalent here. A mutant that survives a change needs a test, or a
``# mutmut-equivalent: <name> -- <why>`` line in this file.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import pytest
from structlog.testing import capture_logs

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from koordlet.admission import (
    ADMITTED,
    NOT_READY,
    OVERCOMMIT,
    NodeAdmission,
    NodeDevice,
    PodFailer,
    Refusal,
    Verdict,
    gpu_devices,
    nic_devices,
)
from koordlet.devices.library import GPU
from koordlet.devices.rdma import NIC
from koordlet.pods.record import PodRecord, decode_pod_record

GI = 1 << 30
CORE, RATIO, MEM = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu-memory",
)
CARDS = gpu_devices([GPU(uuid=f"GPU-{m}", minor=m, memory_total=80 * GI) for m in (0, 1)])


def alloc(*entries: tuple[int, Mapping[str, str]]) -> str:
    return json.dumps({"gpu": [{"minor": m, "resources": dict(r)} for m, r in entries]})


def share(minor: int, core: int, ratio: int, memory_gi: int) -> str:
    return alloc((minor, {CORE: str(core), RATIO: str(ratio), MEM: f"{memory_gi}Gi"}))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def ledger(
    clock: Clock | None = None,
    devices: Sequence[NodeDevice] = CARDS,
    types: tuple[str, ...] = ("gpu",),
) -> tuple[NodeAdmission, list[Refusal]]:
    refused: list[Refusal] = []
    adm = NodeAdmission(
        lambda: devices,
        device_types=types,
        on_refused=refused.append,
        ready_wait_s=0.0,
        monotonic=clock if clock is not None else Clock(),
    )
    adm.observe([], listed_at=0.0)  # a first (empty) pod list: ready
    return adm, refused


def bound(
    uid: str, name: str, allocation: str, created: str = "", started: bool = False
) -> PodRecord:
    """A pod of the node's list that holds ``allocation`` (its device-allocated annotation)."""
    annotations = {ANNOTATION_DEVICE_ALLOCATED: allocation}
    return PodRecord(uid, "ns", name, annotations=annotations, created=created, started=started)


def running(uid: str, allocation: str, created: str = "2026-01-01T00:00:00Z") -> PodRecord:
    return bound(uid, uid, allocation, created=created, started=True)


CASES = [
    pytest.param(share(0, 50, 50, 40), share(0, 50, 50, 40), ADMITTED, id="fits-exactly"),
    pytest.param(share(0, 60, 10, 8), share(0, 50, 10, 8), OVERCOMMIT, id="core-over"),
    pytest.param(share(0, 10, 60, 8), share(0, 10, 50, 8), OVERCOMMIT, id="ratio-over"),
    pytest.param(share(0, 10, 10, 50), share(0, 10, 10, 31), OVERCOMMIT, id="memory-over"),
    pytest.param(share(0, 10, 10, 50), share(0, 10, 10, 30), ADMITTED, id="memory-fits"),
    pytest.param(share(0, 100, 100, 80), share(1, 100, 100, 80), ADMITTED, id="other-card"),
    pytest.param(share(0, 1, 1, 1), share(7, 10, 10, 1), OVERCOMMIT, id="card-not-on-node"),
    # a resource an entry does not name, it does not take (nor is it asked of the card)
    pytest.param(alloc((0, {CORE: "100"})), alloc((0, {RATIO: "100", MEM: "80Gi"})), ADMITTED,
                 id="core-only-leaves-memory"),
    pytest.param(alloc((0, {RATIO: "100", MEM: "80Gi"})), alloc((0, {CORE: "100"})), ADMITTED,
                 id="memory-only-leaves-core"),
    # The one counting rule (read_allocations + held_amounts): an invalid entry holds its
    # card whole, whatever it claims; valid entries beside it count as written.
    pytest.param(alloc((0, {CORE: "-100", RATIO: "10", MEM: "1Gi"})), share(0, 1, 1, 1),
                 OVERCOMMIT, id="negative-amount-holds-card-whole"),
    pytest.param(alloc((0, {CORE: "-100", RATIO: "10", MEM: "1Gi"})), share(1, 100, 100, 80),
                 ADMITTED, id="invalid-entry-holds-only-its-card"),
    pytest.param(alloc((0, {CORE: "0", RATIO: "0", MEM: "0"})), share(0, 1, 1, 1),
                 OVERCOMMIT, id="zero-entry-holds-card-whole"),
    pytest.param("{not json", share(1, 1, 1, 1), OVERCOMMIT,
                 id="unreadable-holds-every-card"),
]  # fmt: skip


@pytest.mark.parametrize(("first", "second", "want"), CASES)
def test_the_second_pod_is_admitted_only_if_it_fits(first: str, second: str, want: str) -> None:
    adm, refused = ledger()
    assert adm.decide("uid-a", "ns", "a", first).outcome == ADMITTED  # an empty ledger
    verdict = adm.decide("uid-b", "ns", "b", second)
    assert verdict.outcome == want
    if want == OVERCOMMIT:
        assert [(r.uid, r.namespace, r.name) for r in refused] == [("uid-b", "ns", "b")]
        assert refused[0].message == verdict.message
        assert "GPU" in verdict.message
    else:
        assert refused == []


def test_the_refusal_names_the_card_the_amounts_and_the_holders() -> None:
    adm, _ = ledger()
    adm.decide("uid-a", "ns", "a", share(0, 60, 60, 48))
    verdict = adm.decide("uid-b", "ns", "b", share(0, 50, 10, 8))
    assert verdict.message == (
        "GPU 0 would be over-committed: koordinator.sh/gpu-core 50 requested, "
        "60 held by admitted pods (ns/a), 100 on the device"
    )


def test_decisions_are_sticky_and_refused_once() -> None:
    adm, refused = ledger()
    assert adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80)).outcome == ADMITTED
    assert adm.decide("uid-b", "ns", "b", share(0, 10, 10, 8)).outcome == OVERCOMMIT
    # every later container of either pod gets the same answer; the refusal is reported once
    assert adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80)).outcome == ADMITTED
    again = adm.decide("uid-b", "ns", "b", share(0, 10, 10, 8))
    assert (again.outcome, again.message) == (OVERCOMMIT, refused[0].message)
    assert len(refused) == 1
    # a refused pod never holds anything: a third pod that fits beside a still fits
    assert adm.decide("uid-c", "ns", "c", share(1, 100, 100, 80)).outcome == ADMITTED


def test_a_deleted_admitted_pod_frees_its_share() -> None:
    clock = Clock()
    adm, _ = ledger(clock)
    assert adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80)).outcome == ADMITTED
    # a list started before the admission does not drop it (the pod may not be listed yet)
    adm.observe([], listed_at=clock.t - 1)
    assert adm.decide("uid-b", "ns", "b", share(0, 10, 10, 8)).outcome == OVERCOMMIT
    # a list started after it, without the pod (deleted, or Succeeded/Failed): freed
    clock.t += 10
    adm.observe([], listed_at=clock.t - 1)
    assert adm.decide("uid-c", "ns", "c", share(0, 10, 10, 8)).outcome == ADMITTED


def test_a_listed_admitted_pod_keeps_its_share() -> None:
    clock = Clock()
    adm, _ = ledger(clock)
    adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80))
    clock.t += 10
    adm.observe([bound("uid-a", "a", share(0, 100, 100, 80))], clock.t)
    assert adm.decide("uid-b", "ns", "b", share(0, 10, 10, 8)).outcome == OVERCOMMIT


def test_a_restarted_agent_relearns_the_running_pods() -> None:
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    adm.observe(
        [
            running("uid-a", share(0, 60, 60, 48)),
            # bound, not started: not admitted, holds nothing yet
            bound("uid-p", "p", share(1, 100, 100, 80)),
        ],
        listed_at=50.0,
    )
    assert adm.admitted() == {"uid-a"}
    assert adm.decide("uid-b", "ns", "b", share(0, 50, 50, 8)).outcome == OVERCOMMIT
    assert adm.decide("uid-c", "ns", "c", share(1, 100, 100, 80)).outcome == ADMITTED
    # the pending one comes second now: its card is taken
    assert adm.decide("uid-p", "ns", "p", share(1, 100, 100, 80)).outcome == OVERCOMMIT


def test_running_pods_that_over_commit_are_all_learned_in_creation_order() -> None:
    # Their containers already see the cards: the agent cannot take them back, so it admits
    # them (and logs the over-commit); new pods find the card full.
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    adm.observe(
        [
            running("uid-late", share(0, 80, 80, 64), created="2026-01-02T00:00:00Z"),
            running("uid-early", share(0, 80, 80, 64), created="2026-01-01T00:00:00Z"),
        ],
        listed_at=50.0,
    )
    assert adm.admitted() == {"uid-early", "uid-late"}
    assert adm.overcommitted() == ["uid-late"]
    assert adm.decide("uid-b", "ns", "b", share(0, 1, 1, 1)).outcome == OVERCOMMIT


def test_a_running_pod_with_an_unreadable_annotation_holds_every_card() -> None:
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    adm.observe([running("uid-x", "{not json")], listed_at=50.0)
    for minor in (0, 1):
        assert adm.decide(f"uid-{minor}", "ns", "p", share(minor, 1, 1, 1)).outcome == OVERCOMMIT


def test_a_refused_pod_is_never_learned_as_admitted() -> None:
    clock = Clock()
    adm, _ = ledger(clock)
    adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80))
    adm.decide("uid-b", "ns", "b", share(0, 100, 100, 80))
    clock.t += 10
    # its containers started (without the card) before its Failed status landed
    adm.observe([running("uid-a", share(0, 100, 100, 80)),
                 running("uid-b", share(0, 100, 100, 80))], clock.t)  # fmt: skip
    assert adm.admitted() == {"uid-a"}


def test_before_the_first_pod_list_nothing_is_admitted() -> None:
    refused: list[Refusal] = []
    adm = NodeAdmission(lambda: CARDS, on_refused=refused.append, ready_wait_s=0.0)
    verdict = adm.decide("uid-a", "ns", "a", share(0, 1, 1, 1))
    assert verdict.outcome == NOT_READY
    assert refused == []  # not the pod's fault: it is not failed
    adm.observe([], listed_at=0.0)
    assert adm.decide("uid-a", "ns", "a", share(0, 1, 1, 1)).outcome == ADMITTED


def test_a_pod_record_says_whether_its_containers_started() -> None:
    def pod(status: dict[str, object]) -> PodRecord:
        return decode_pod_record({
            "metadata": {"uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"scheduling.koordinator.sh/device-allocated": "{}"}},
            "status": status,
        })  # fmt: skip

    assert pod({"phase": "Running"}).started
    assert pod({"phase": "Pending", "initContainerStatuses": [
        {"state": {"running": {}}}]}).started  # fmt: skip
    assert pod({"phase": "Pending", "containerStatuses": [
        {"state": {"terminated": {}}}]}).started  # fmt: skip
    assert not pod({"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]}).started  # fmt: skip
    assert not pod({}).started
    record = pod({})
    assert (record.allocation, record.created) == ("{}", "2026-01-01T00:00:00Z")


def test_learned_pods_are_ordered_by_creation_before_uid() -> None:
    # uid order and creation order disagree: creation decides; equal times fall back to uid
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    adm.observe(
        [
            running("uid-a", share(0, 80, 80, 64), created="2026-01-02T00:00:00Z"),
            running("uid-b", share(0, 80, 80, 64), created="2026-01-01T00:00:00Z"),
            running("uid-d", share(1, 80, 80, 64), created="2026-01-01T00:00:00Z"),
            running("uid-c", share(1, 80, 80, 64), created="2026-01-01T00:00:00Z"),
        ],
        listed_at=50.0,
    )
    assert sorted(adm.overcommitted()) == ["uid-a", "uid-d"]


def test_a_learned_pod_that_fits_is_not_over_committed_and_devices_are_read_only_to_learn() -> None:
    reads: list[int] = []

    def devices() -> list[NodeDevice]:
        reads.append(1)
        return CARDS

    adm = NodeAdmission(devices, ready_wait_s=0.0, monotonic=Clock())
    adm.observe([bound("uid-p", "p", share(0, 10, 10, 8))], listed_at=50.0)  # not started
    assert reads == [] and adm.admitted() == set()
    adm.observe([running("uid-a", share(0, 60, 60, 48)),
                 running("uid-b", share(0, 40, 40, 32))], listed_at=60.0)  # fmt: skip
    assert reads == [1]  # once per list that learns, not per pod
    assert adm.admitted() == {"uid-a", "uid-b"} and adm.overcommitted() == []
    # a started pod without an allocation is not the ledger's
    adm.observe([running("uid-a", share(0, 60, 60, 48)), running("uid-b", share(0, 40, 40, 32)),
                 PodRecord("uid-x", "ns", "x", started=True)], listed_at=70.0)  # fmt: skip
    assert adm.admitted() == {"uid-a", "uid-b"} and reads == [1]


def test_an_admitted_pod_listed_running_is_not_learned_again() -> None:
    clock = Clock()
    adm, _ = ledger(clock)
    assert adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80)).outcome == ADMITTED
    clock.t += 10
    adm.observe([running("uid-a", share(0, 100, 100, 80))], clock.t)
    assert adm.overcommitted() == []  # judged beside itself it would over-commit


def test_a_departed_over_committing_pod_leaves_the_over_committed_list() -> None:
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    adm.observe([running("uid-a", share(0, 80, 80, 64), created="2026-01-01T00:00:00Z"),
                 running("uid-b", share(0, 80, 80, 64), created="2026-01-02T00:00:00Z")],
                listed_at=50.0)  # fmt: skip
    assert adm.overcommitted() == ["uid-b"]
    adm.observe([running("uid-a", share(0, 80, 80, 64))], listed_at=60.0)
    assert adm.overcommitted() == [] and adm.admitted() == {"uid-a"}


def test_a_list_started_when_the_pod_was_decided_does_not_forget_it() -> None:
    clock = Clock()
    adm, _ = ledger(clock)
    adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80))
    adm.observe([], listed_at=clock.t)  # the same instant: the list may predate the pod
    assert adm.admitted() == {"uid-a"}


def test_a_departed_refused_pod_is_forgotten_and_judged_afresh() -> None:
    clock = Clock()
    adm, refused = ledger(clock)
    adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80))
    assert adm.decide("uid-b", "ns", "b", share(0, 100, 100, 80)).outcome == OVERCOMMIT
    adm.observe([bound("uid-b", "b", share(0, 100, 100, 80))], listed_at=clock.t + 1)
    assert adm.decide("uid-b", "ns", "b", share(0, 100, 100, 80)).outcome == OVERCOMMIT
    adm.observe([], listed_at=clock.t - 1)  # a list older than the refusal: kept
    assert adm.decide("uid-b", "ns", "b", share(0, 100, 100, 80)).outcome == OVERCOMMIT
    clock.t += 10
    adm.observe([], listed_at=clock.t - 1)  # a and b gone (b's uid re-asking is a new pod)
    assert adm.decide("uid-b", "ns", "b", share(0, 100, 100, 80)).outcome == ADMITTED
    assert len(refused) == 1


def test_decide_waits_for_the_first_pod_list() -> None:
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=30.0)
    assert not adm.ready
    timer = threading.Timer(0.05, adm.observe, args=([], 0.0))
    timer.start()
    try:
        assert adm.decide("uid-a", "ns", "a", share(0, 1, 1, 1)).outcome == ADMITTED
    finally:
        timer.join()
    assert adm.ready


def test_a_failing_refusal_report_neither_raises_nor_changes_the_decision() -> None:
    def broken(_: Refusal) -> None:
        raise RuntimeError("event queue gone")

    adm = NodeAdmission(lambda: CARDS, on_refused=broken, ready_wait_s=0.0)
    adm.observe([], listed_at=0.0)
    adm.decide("uid-a", "ns", "a", share(0, 100, 100, 80))
    with capture_logs() as logs:
        assert adm.decide("uid-b", "ns", "b", share(0, 1, 1, 1)).outcome == OVERCOMMIT
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("pod refused at the node: its devices would be over-committed", "warning"),
        ("reporting a refused pod failed", "error"),
    ]
    assert logs[0]["pod"] == "ns/b" and logs[0]["uid"] == "uid-b"
    assert logs[0]["reason"].startswith("GPU 0 would be over-committed")
    assert "event queue gone" in logs[1]["error"]
    assert adm.decide("uid-b", "ns", "b", share(0, 1, 1, 1)).outcome == OVERCOMMIT


def test_a_learned_over_commit_is_logged() -> None:
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    with capture_logs() as logs:
        adm.observe([running("uid-a", share(0, 80, 80, 64), created="2026-01-01T00:00:00Z"),
                     running("uid-b", share(0, 80, 80, 64), created="2026-01-02T00:00:00Z")],
                    listed_at=50.0)  # fmt: skip
    assert [(e["event"], e["log_level"], e["pod"], e["uid"]) for e in logs] == [(
        "running pod over-commits a device: admitted, its containers see it", "warning",
        "ns/uid-b", "uid-b")]  # fmt: skip
    assert logs[0]["reason"].startswith("GPU 0 would be over-committed")


def test_a_device_type_without_a_rule_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match=r"no admission rule for device types \['tpu'\]"):
        NodeAdmission(lambda: CARDS, device_types=("gpu", "tpu"))


# -- RDMA NICs, their VFs, FPGAs: every device type the node serves ------------------------------

RDMA, FPGA = "koordinator.sh/rdma", "koordinator.sh/fpga"
NIC_A, NIC_B = "0000:18:00.0", "0000:5e:00.0"
VF_A2, VF_A3, VF_B2 = "0000:18:00.2", "0000:18:00.3", "0000:5e:00.2"
NICS = nic_devices([NIC(NIC_A, 0, True, 0, "pci0000:17", (VF_A2, VF_A3)),
                    NIC(NIC_B, 1, True, 1, "pci0000:ae", (VF_B2,))])  # fmt: skip
FPGAS = [NodeDevice("fpga", 0, {FPGA: 100})]
NODE = [*CARDS, *NICS, *FPGAS]
SERVED = ("gpu", "rdma", "fpga")


def rdma(minor: int, percent: int = 1, *vfs: str, pf: str = NIC_A) -> dict[str, object]:
    entry: dict[str, object] = {"minor": minor, "resources": {RDMA: str(percent)}, "id": pf}
    if vfs:
        entry["extension"] = {"vfs": [{"minor": -1, "busID": b} for b in vfs]}
    return entry


def devices(**types: list[dict[str, object]]) -> str:
    return json.dumps(types)


def vf(bus_id: str, minor: int = 0) -> str:
    return devices(rdma=[rdma(minor, 1, bus_id)])


GPU_SHARE = {"minor": 0, "resources": {CORE: "50", RATIO: "50", MEM: "40Gi"}}

DEVICE_CASES = [
    pytest.param(vf(VF_A3), vf(VF_A3), SERVED,
                 f"VF {VF_A3} of RDMA NIC 0 is held by an admitted pod (ns/a)", id="same-vf"),
    pytest.param(vf(VF_A2), vf(VF_A3), SERVED, None, id="other-vf-same-nic"),
    pytest.param(vf(VF_A3), vf(VF_B2, 1), SERVED, None, id="vf-of-other-nic"),
    pytest.param(vf(VF_A3), devices(rdma=[rdma(0, 1, VF_A2, VF_A3)]), SERVED,
                 f"VF {VF_A3} of RDMA NIC 0 is held by an admitted pod (ns/a)",
                 id="one-of-two-vfs-held"),
    pytest.param(vf(VF_A3), vf(VF_B2, 0), SERVED,
                 f"'{VF_B2}' is not a VF of RDMA NIC 0 on this node", id="vf-not-of-that-nic"),
    pytest.param(devices(), devices(rdma=[rdma(0, 1, "")]), SERVED,
                 "'' is not a VF of RDMA NIC 0 on this node", id="vf-without-bus-id"),
    pytest.param(devices(rdma=[rdma(0, 100)]), vf(VF_A3), SERVED,
                 "RDMA NIC 0 would be over-committed: koordinator.sh/rdma 1 requested, "
                 "100 held by admitted pods (ns/a), 100 on the device", id="whole-nic-then-vf"),
    pytest.param(vf(VF_A3), devices(rdma=[rdma(0, 100)]), SERVED,
                 "RDMA NIC 0 would be over-committed: koordinator.sh/rdma 100 requested, "
                 "1 held by admitted pods (ns/a), 100 on the device", id="vf-then-whole-nic"),
    pytest.param(devices(rdma=[rdma(0, 50)]), devices(rdma=[rdma(0, 50)]), SERVED, None,
                 id="nic-shares-fit"),
    pytest.param(devices(rdma=[rdma(1, 50, pf=NIC_B)]), devices(rdma=[rdma(1, 51, pf=NIC_B)]),
                 SERVED, "RDMA NIC 1 would be over-committed: koordinator.sh/rdma 51 requested, "
                 "50 held by admitted pods (ns/a), 100 on the device", id="nic-shares-over"),
    pytest.param(devices(), devices(rdma=[rdma(7, 1)]), SERVED,
                 "RDMA NIC 7 is not a device of this node", id="nic-not-on-node"),
    # an invalid entry holds its NIC whole, whatever VF it names (the hook hands that VF out)
    pytest.param(devices(rdma=[rdma(0, 0, VF_A2)]), vf(VF_A3), SERVED,
                 "RDMA NIC 0 would be over-committed: koordinator.sh/rdma 1 requested, "
                 "100 held by admitted pods (ns/a), 100 on the device", id="invalid-holds-nic"),
    pytest.param("{not json", vf(VF_B2, 1), SERVED,
                 "RDMA NIC 1 would be over-committed: koordinator.sh/rdma 1 requested, "
                 "100 held by admitted pods (ns/a), 100 on the device",
                 id="unreadable-holds-every-nic"),
    pytest.param(devices(gpu=[GPU_SHARE], rdma=[rdma(0, 1, VF_A3)]),
                 devices(gpu=[GPU_SHARE], rdma=[rdma(0, 1, VF_A3)]), SERVED,
                 f"VF {VF_A3} of RDMA NIC 0 is held by an admitted pod (ns/a)",
                 id="gpu-fits-vf-does-not"),
    pytest.param(devices(fpga=[{"minor": 0, "resources": {FPGA: "60"}}]),
                 devices(fpga=[{"minor": 0, "resources": {FPGA: "50"}}]), SERVED,
                 "FPGA 0 would be over-committed: koordinator.sh/fpga 50 requested, "
                 "60 held by admitted pods (ns/a), 100 on the device", id="fpga-over"),
    # a type the node does not serve (no hook hands it out) holds nothing here
    pytest.param(vf(VF_A3), vf(VF_A3), ("gpu",), None, id="rdma-not-served"),
    pytest.param(devices(rdma=[rdma(7, 100)]), devices(rdma=[rdma(7, 100)]), ("gpu",), None,
                 id="unknown-nic-not-served"),
    pytest.param(vf(VF_A3), devices(gpu=[GPU_SHARE]), ("rdma",), None, id="gpu-not-served"),
]  # fmt: skip


@pytest.mark.parametrize(("first", "second", "types", "refusal"), DEVICE_CASES)
def test_every_served_device_type_is_counted(
    first: str, second: str, types: tuple[str, ...], refusal: str | None
) -> None:
    adm, refused = ledger(devices=NODE, types=types)
    assert adm.decide("uid-a", "ns", "a", first).outcome == ADMITTED
    verdict = adm.decide("uid-b", "ns", "b", second)
    if refusal is None:
        assert verdict.outcome == ADMITTED and refused == []
    else:
        assert (verdict.outcome, verdict.message) == (OVERCOMMIT, refusal)
        assert [(r.uid, r.message) for r in refused] == [("uid-b", refusal)]


def test_a_vf_is_free_again_once_its_holder_left() -> None:
    clock = Clock()
    adm, _ = ledger(clock, NODE, SERVED)
    adm.decide("uid-a", "ns", "a", vf(VF_A3))
    assert adm.decide("uid-b", "ns", "b", vf(VF_A3)).outcome == OVERCOMMIT
    clock.t += 10
    adm.observe([], listed_at=clock.t - 1)
    assert adm.decide("uid-c", "ns", "c", vf(VF_A3)).outcome == ADMITTED


def test_a_running_pod_holding_a_vf_is_learned_with_it() -> None:
    adm = NodeAdmission(lambda: NODE, device_types=SERVED, ready_wait_s=0.0, monotonic=Clock())
    adm.observe([running("uid-a", vf(VF_A3))], listed_at=50.0)
    verdict = adm.decide("uid-b", "ns", "b", vf(VF_A3))
    assert verdict.message == f"VF {VF_A3} of RDMA NIC 0 is held by an admitted pod (ns/uid-a)"


def test_nic_devices_publish_what_the_device_cr_says() -> None:
    nic = NIC(NIC_B, 3, False, 1, "pci0000:ae", (VF_B2, "0000:5e:00.3"))
    assert nic_devices([nic]) == [
        NodeDevice("rdma", 3, {RDMA: 100}, frozenset({VF_B2, "0000:5e:00.3"}))]
    assert gpu_devices([GPU("GPU-9", 9, memory_total=GI)]) == [
        NodeDevice("gpu", 9, {CORE: 100, RATIO: 100, MEM: GI})]


# -- PodFailer: the refused pod's status, written off the RPC's thread ----------------------------


class StatusAPI:
    """Fails the first ``failures`` writes; records every call with its monotonic time."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[tuple[str, ...], float]] = []
        self.lock = threading.Lock()

    def fail_pod(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        with self.lock:
            self.calls.append(((namespace, name, uid, reason, message), time.monotonic()))
            if len(self.calls) <= self.failures:
                raise RuntimeError(f"apiserver unavailable ({len(self.calls)})")

    def names(self) -> list[str]:
        with self.lock:
            return [args[1] for args, _ in self.calls]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_refused_pod_is_failed_once_with_its_reason() -> None:
    api = StatusAPI()
    failer = PodFailer(api)
    failer.start()
    try:
        with capture_logs() as logs:
            failer.fail("ns", "a", "uid-a", "DeviceOvercommit", "GPU 0 would be over-committed")
            failer.fail("ns", "b", "uid-b", "DeviceOvercommit", "VF held")
            wait_for(lambda: failer.written == 2)
    finally:
        failer.stop()
    assert [args for args, _ in api.calls] == [
        ("ns", "a", "uid-a", "DeviceOvercommit", "GPU 0 would be over-committed"),
        ("ns", "b", "uid-b", "DeviceOvercommit", "VF held")]  # fmt: skip
    assert [(e["event"], e["pod"], e["reason"]) for e in logs] == [
        ("refused pod failed", "ns/a", "DeviceOvercommit"),
        ("refused pod failed", "ns/b", "DeviceOvercommit")]  # fmt: skip
    assert failer.dropped == 0


def test_a_failed_write_is_retried_with_a_growing_backoff() -> None:
    api = StatusAPI(failures=2)
    failer = PodFailer(api, attempts=3, backoff_s=0.1)
    failer.start()
    try:
        with capture_logs() as logs:
            failer.fail("ns", "a", "uid-a", "R", "m")
            wait_for(lambda: failer.written == 1)
    finally:
        failer.stop()
    times = [t for _, t in api.calls]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.1 and times[2] - times[1] >= 0.2  # 1x, then 2x backoff
    assert [(e["event"], e.get("attempt")) for e in logs] == [
        ("failing a refused pod failed", 1), ("failing a refused pod failed", 2),
        ("refused pod failed", None)]  # fmt: skip
    assert logs[0]["pod"] == "ns/a" and logs[0]["error"] == "apiserver unavailable (1)"


def test_after_the_last_attempt_the_next_pod_is_written_at_once() -> None:
    api = StatusAPI(failures=2)
    failer = PodFailer(api, attempts=2, backoff_s=0.3)
    failer.start()
    try:
        failer.fail("ns", "a", "uid-a", "R", "m")  # fails twice: given up
        failer.fail("ns", "b", "uid-b", "R", "m")
        wait_for(lambda: failer.written == 1)
    finally:
        failer.stop()
    assert api.names() == ["a", "a", "b"]
    times = [t for _, t in api.calls]
    assert times[1] - times[0] >= 0.3
    assert times[2] - times[1] < 0.3  # no wait after the last attempt


def test_a_full_queue_drops_the_write_without_blocking() -> None:
    api = StatusAPI()
    failer = PodFailer(api, capacity=2)
    with capture_logs() as logs:
        for name in ("a", "b", "c", "d"):
            failer.fail("ns", name, f"uid-{name}", "R", "m")  # not started: nothing drains
    assert failer.dropped == 2
    assert [(e["event"], e["log_level"], e["pod"]) for e in logs] == [
        ("failing a refused pod dropped: queue full", "error", "ns/c"),
        ("failing a refused pod dropped: queue full", "error", "ns/d")]  # fmt: skip
    failer.start()
    try:
        wait_for(lambda: failer.written == 2)
    finally:
        failer.stop()
    assert api.names() == ["a", "b"]


def test_stop_ends_a_backoff_at_once_and_start_again_resumes() -> None:
    api = StatusAPI(failures=1)
    failer = PodFailer(api, attempts=3, backoff_s=30.0)
    failer.stop()  # never started: nothing to stop
    failer.start()
    worker = [t for t in threading.enumerate() if t.name == "koordlet-pod-failer"]
    assert len(worker) == 1 and worker[0].daemon  # never keeps the agent's process alive
    with pytest.raises(RuntimeError, match=r"^PodFailer already started$"):
        failer.start()
    failer.fail("ns", "a", "uid-a", "R", "m")
    wait_for(lambda: len(api.names()) == 1)  # failed once; now in a 30 s backoff
    failer.fail("ns", "c", "uid-c", "DeviceOvercommit", "VF held")  # queued behind it
    began = time.monotonic()
    failer.stop()
    assert time.monotonic() - began < 5.0 and not worker[0].is_alive()
    failer.stop()  # twice: a no-op
    assert failer.written == 0
    failer.start()  # a restarted failer waits its backoffs again (the stop is cleared)
    try:
        failer.fail("ns", "b", "uid-b", "R", "m")
        wait_for(lambda: failer.written == 2)
    finally:
        failer.stop()
    # the pod queued when it stopped is written after the restart, as it was queued
    assert [args for args, _ in api.calls] == [
        ("ns", "a", "uid-a", "R", "m"), ("ns", "c", "uid-c", "DeviceOvercommit", "VF held"),
        ("ns", "b", "uid-b", "R", "m")]  # fmt: skip


def test_the_documented_defaults() -> None:
    """docs/node.md: 3 tries; a queue of 256 refused pods (beyond, dropped and logged)."""
    failer = PodFailer(StatusAPI())
    for n in range(257):
        failer.fail("ns", f"p{n}", f"uid-{n}", "R", "m")
    assert failer.dropped == 1
    api = StatusAPI(failures=3)
    failer = PodFailer(api, backoff_s=0.0)
    failer.start()
    try:
        failer.fail("ns", "a", "uid-a", "R", "m")
        failer.fail("ns", "b", "uid-b", "R", "m")
        wait_for(lambda: failer.written == 1)
    finally:
        failer.stop()
    assert api.names() == ["a", "a", "a", "b"]
    # tries 1 s apart (then 2 s): one failure, then the write
    api = StatusAPI(failures=1)
    failer = PodFailer(api)
    failer.start()
    try:
        failer.fail("ns", "a", "uid-a", "R", "m")
        wait_for(lambda: failer.written == 1)
    finally:
        failer.stop()
    times = [t for _, t in api.calls]
    assert 1.0 <= times[1] - times[0] < 1.9


def test_decide_waits_one_second_for_the_first_pod_list_by_default() -> None:
    adm = NodeAdmission(lambda: CARDS)
    began = time.monotonic()
    verdict = adm.decide("uid-a", "ns", "a", share(0, 1, 1, 1))
    assert 1.0 <= time.monotonic() - began < 1.9
    assert verdict == Verdict(NOT_READY, "the agent has not listed the node's pods yet")


def test_a_resource_a_pod_does_not_ask_is_not_held_against_it() -> None:
    # learned pods over-commit card 0's core; a pod asking no core still fits beside them
    adm = NodeAdmission(lambda: CARDS, ready_wait_s=0.0, monotonic=Clock())
    adm.observe([running("uid-a", share(0, 80, 10, 8)), running("uid-b", share(0, 80, 10, 8))],
                listed_at=50.0)
    assert adm.decide("uid-c", "ns", "c", alloc((0, {RATIO: "10", MEM: "8Gi"}))).outcome == ADMITTED
    verdict = adm.decide("uid-d", "ns", "d", share(0, 1, 1, 1))
    assert verdict.message == (
        "GPU 0 would be over-committed: koordinator.sh/gpu-core 1 requested, 160 held by "
        "admitted pods (ns/c, ns/uid-a, ns/uid-b), 100 on the device")


def test_more_than_a_device_has_is_refused_even_alone() -> None:
    adm, _ = ledger()
    assert adm.decide("uid-a", "ns", "a", share(0, 10, 10, 81)).message == (
        "GPU 0 would be over-committed: koordinator.sh/gpu-memory 86973087744 requested, "
        "0 held by admitted pods (none), 85899345920 on the device")


def test_a_resource_a_device_does_not_declare_it_does_not_have() -> None:
    adm, _ = ledger(devices=[NodeDevice("fpga", 0, {})], types=("fpga",))
    verdict = adm.decide("uid-a", "ns", "a", devices(fpga=[{"minor": 0, "resources": {
        FPGA: "1"}}]))  # fmt: skip
    assert verdict.message == (
        "FPGA 0 would be over-committed: koordinator.sh/fpga 1 requested, "
        "0 held by admitted pods (none), 0 on the device")


def test_vfs_of_a_type_the_node_does_not_serve_do_not_hide_the_served_ones() -> None:
    adm, _ = ledger(devices=NODE, types=("gpu", "rdma"))
    adm.decide("uid-a", "ns", "a", vf(VF_A3))
    both = devices(fpga=[{"minor": 0, "resources": {FPGA: "1"},
                          "extension": {"vfs": [{"busID": "0000:aa:00.1"}]}}],
                   rdma=[rdma(0, 1, VF_A3)])  # fmt: skip
    assert adm.decide("uid-b", "ns", "b", both).outcome == OVERCOMMIT
