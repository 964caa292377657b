"""Unit tests of the chaos tier's audit-log analysis (tests/e2e/chaos/audit.py): the Lease
timeline and the late-bind rule, on hand-written audit events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.e2e.chaos import audit

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
USERS = {"u-a": "replica-a-", "u-b": "replica-b-"}


def ts(t: float) -> str:
    return datetime.fromtimestamp(T0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(
    t: float, holder: str, user: str, *, code: int = 200, took: float = 0.01
) -> dict[str, Any]:
    return {
        "stage": "ResponseComplete",
        "verb": "update",
        "user": {"username": user},
        "objectRef": {"resource": "leases", "namespace": "default", "name": "L"},
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": ts(t),
        "stageTimestamp": ts(t + took),
        "responseObject": {"spec": {"holderIdentity": holder, "leaseDurationSeconds": 10}},
    }


def binding(
    t: float, user: str, *, code: int = 201, took: float = 0.01, name: str = "p"
) -> dict[str, Any]:
    return {
        "stage": "ResponseComplete",
        "verb": "create",
        "user": {"username": user},
        "userAgent": "koord-scheduler/0.1.0",
        "objectRef": {
            "resource": "pods",
            "subresource": "binding",
            "namespace": "ns",
            "name": name,
        },
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": ts(t),
        "stageTimestamp": ts(t + took),
        "requestObject": {"metadata": {"uid": f"uid-{name}"}, "target": {"name": "n1"}},
    }


CASES = [
    pytest.param([lease(0, "replica-a-1", "u-a"), binding(1, "u-a")], [], id="holder-binds"),
    pytest.param(
        [lease(0, "replica-a-1", "u-a"), lease(5, "replica-b-1", "u-b"), binding(6, "u-a")],
        [("lost", "replica-b-1")],
        id="bind-after-takeover",
    ),
    pytest.param(
        [lease(0, "replica-a-1", "u-a"), lease(5, "", "u-a"), binding(6, "u-a")],
        [("lost", "")],
        id="bind-after-release",
    ),
    pytest.param(
        [lease(0, "replica-a-1", "u-a"), binding(11, "u-a")],
        [("expired", "replica-a-1")],
        id="bind-on-expired-lease",
    ),
    pytest.param(
        [
            lease(0, "replica-a-1", "u-a"),
            lease(5, "replica-b-1", "u-b"),
            binding(6, "u-a", code=409),
        ],
        [],
        id="rejected-binding-is-no-write",
    ),
    pytest.param(
        [
            lease(0, "replica-b-1", "u-b"),
            binding(4.9, "u-a", took=0.2),
            lease(5, "replica-a-2", "u-a"),
        ],
        [],
        id="own-lease-write-overlaps-binding",
    ),
    pytest.param(
        [lease(0, "replica-a-1", "u-a"), lease(5, "replica-a-2", "u-a"), binding(6, "u-a")],
        [],
        id="new-incarnation-same-user",
    ),
    pytest.param([binding(1, "u-a")], [("lost", "")], id="bind-before-any-lease"),
    pytest.param(
        [lease(0, "replica-b-1", "u-b"), binding(1, "koord-admin")], [], id="not-a-replica"
    ),
    pytest.param(
        [
            lease(0, "replica-a-1", "u-a"),
            lease(5, "replica-b-1", "u-b", code=409),
            binding(6, "u-a"),
        ],
        [],
        id="failed-lease-write-ignored",
    ),
]


@pytest.mark.parametrize(("events", "expected"), CASES)
def test_late_binds(events: list[dict[str, Any]], expected: list[tuple[str, str]]) -> None:
    leases = audit.lease_writes(events, "default", "L")
    bindings = audit.binding_writes(events, "ns")
    late = audit.late_binds(bindings, leases, USERS)
    assert [(lb.reason, lb.lease_holder) for lb in late] == expected


def test_binding_fields_and_transitions() -> None:
    events = [
        lease(0, "replica-a-1", "u-a"),
        lease(2, "replica-a-1", "u-a"),
        lease(9, "replica-b-1", "u-b"),
        binding(3, "u-a", name="x"),
        {"stage": "ResponseStarted", "objectRef": {"resource": "pods"}},  # other stages skipped
    ]
    [b] = audit.binding_writes(events, "ns")
    assert (b.name, b.uid, b.node, b.user, b.code) == ("x", "uid-x", "n1", "u-a", 201)
    holders = [w.holder for w in audit.transitions(audit.lease_writes(events, "default", "L"))]
    assert holders == ["replica-a-1", "replica-b-1"]


def pod_create(t: float, name: str, *, code: int = 201, took: float = 0.01) -> dict[str, Any]:
    return {
        "stage": "ResponseComplete",
        "verb": "create",
        "user": {"username": "koord-admin"},
        "objectRef": {"resource": "pods", "namespace": "ns", "name": name},
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": ts(t),
        "stageTimestamp": ts(t + took),
    }


@pytest.mark.parametrize(
    ("events", "landed"),
    [
        pytest.param([pod_create(0, "p"), binding(1, "u-a", name="p")], 1, id="one"),
        pytest.param(
            [pod_create(0, "p"), binding(1, "u-a", name="p"), pod_create(2, "p")],
            0,
            id="bound-old-incarnation-only",
        ),
        pytest.param(
            [pod_create(0, "p"), pod_create(2, "p"), binding(1.99, "u-a", name="p", took=0.1)],
            1,
            id="in-flight-binding-lands-on-new-pod",
        ),
        pytest.param(
            [pod_create(0, "p", took=0.5), binding(0.1, "u-a", name="p")],
            1,
            id="bound-before-the-create-was-logged-complete",
        ),
        pytest.param(
            [pod_create(0, "p"), pod_create(2, "p", code=409), binding(1, "u-a", name="p")],
            1,
            id="failed-create-is-not-an-incarnation",
        ),
        pytest.param(
            [pod_create(0, "p"), binding(1, "u-a", name="p"), binding(2, "u-b", name="p")],
            2,
            id="twice",
        ),
    ],
)
def test_bindings_of_live_incarnation(events: list[dict[str, Any]], landed: int) -> None:
    got = audit.bindings_of_live(
        audit.binding_writes(events, "ns"), audit.last_creates(events, "ns")
    )
    assert len(got.get("p", [])) == landed


@pytest.mark.parametrize(
    ("events", "late_by"),
    [
        pytest.param(
            [lease(0, "replica-a-1", "u-a"), lease(5, "replica-b-1", "u-b"), binding(6, "u-a")],
            0.99,
            id="since-takeover",
        ),
        pytest.param([lease(0, "replica-a-1", "u-a"), binding(12, "u-a")], 1.99, id="since-expiry"),
    ],
)
def test_late_by(events: list[dict[str, Any]], late_by: float) -> None:
    leases = audit.lease_writes(events, "default", "L")
    [late] = audit.late_binds(audit.binding_writes(events, "ns"), leases, USERS)
    assert late.late_by == pytest.approx(late_by, abs=1e-3)


def test_late_attempts_include_rejected_bindings() -> None:
    events = [
        lease(0, "replica-a-1", "u-a"),
        lease(5, "replica-b-1", "u-b"),
        binding(6, "u-a", code=409),
    ]
    leases = audit.lease_writes(events, "default", "L")
    bindings = audit.binding_writes(events, "ns")
    assert audit.late_binds(bindings, leases, USERS) == []
    [late] = audit.late_binds(bindings, leases, USERS, attempts=True)
    assert (late.reason, late.binding.code) == ("lost", 409)


@pytest.mark.parametrize(
    ("resumed_at", "frozen"),
    [
        pytest.param([5.5], True, id="on-the-wire-at-the-freeze"),
        pytest.param([1.0], False, id="resumed-long-before"),
        pytest.param([], False, id="never-frozen"),
        pytest.param([6.5], False, id="resumed-after-it-landed"),
    ],
)
def test_late_binds_sent_on_resume_from_a_freeze_are_told_apart(
    resumed_at: list[float], frozen: bool
) -> None:
    events = [lease(0, "replica-a-1", "u-a"), lease(5, "replica-b-1", "u-b"), binding(6, "u-a")]
    leases = audit.lease_writes(events, "default", "L")
    late = audit.late_binds(audit.binding_writes(events, "ns"), leases, USERS)
    assert len(late) == 1
    resumes = {"u-a": [T0 + t for t in resumed_at], "u-b": [T0 + 5.9]}
    strict, on_wire = audit.sent_before_freeze(late, resumes, window=2.0)
    assert (len(strict), len(on_wire)) == ((0, 1) if frozen else (1, 0))


def pod_write(
    verb: str, user: str, name: str, code: int, *, sub: str = "", ns: str = "ns"
) -> dict[str, Any]:
    ref = {"resource": "pods", "namespace": ns, "name": name}
    if sub:
        ref["subresource"] = sub
    return {
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": user},
        "objectRef": ref,
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": ts(0),
        "stageTimestamp": ts(0.01),
    }


def test_pod_writes_of_one_user_with_their_answers() -> None:
    """The workload user's pod writes (refused ones too, with their code), its bindings
    included (a binding writes annotations too); other users', other namespaces' and deletes
    are not."""
    events = [
        pod_write("create", "chaos-user", "forged-0001", 403),
        pod_write("patch", "chaos-user", "p-1", 500, sub="status"),
        pod_write("patch", "chaos-user", "p-2", 200),
        pod_write("patch", "u-a", "p-3", 200, sub="status"),
        pod_write("create", "chaos-user", "p-4", 201, ns="other"),
        binding(1, "chaos-user", name="p-5"),
        pod_write("delete", "chaos-user", "p-6", 200),
    ]
    assert audit.pod_writes(events, "ns", "chaos-user") == [
        audit.PodWrite("create", "forged-0001", "", 403),
        audit.PodWrite("patch", "p-1", "status", 500),
        audit.PodWrite("patch", "p-2", "", 200),
        audit.PodWrite("create", "p-5", "binding", 201),
    ]
