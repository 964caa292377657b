"""Node-side device admission: the ledger of admitted pods (``koordlet.admission``)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from koordlet.admission import (
    ADMITTED,
    NOT_READY,
    OVERCOMMIT,
    NodeAdmission,
    Refusal,
    gpu_devices,
)
from koordlet.devices.library import GPU
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


def ledger(clock: Clock | None = None) -> tuple[NodeAdmission, list[Refusal]]:
    refused: list[Refusal] = []
    adm = NodeAdmission(
        lambda: CARDS,
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
    assert adm.decide("uid-b", "ns", "b", share(0, 10, 10, 8)).outcome == OVERCOMMIT
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
