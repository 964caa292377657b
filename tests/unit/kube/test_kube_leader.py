"""scheduler.kube.leader: client-go's lease algorithm on a fake clock and an in-memory Lease."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.kube.leader import (
    KubeLeaseStore,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
    micro_time,
)
from scheduler.kube.rest import RestClient, TransportError
from tests.fakes import FakeClock
from tests.unit.kube.kube_fakes import FakeTransport, json_response, status_response

LEASE, RENEW, RETRY = 15.0, 10.0, 2.0


class MemoryLease:
    """One Lease with optimistic concurrency; ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.rv = 0
        self.down = False
        self.writes = 0

    def _check(self) -> None:
        if self.down:
            raise TransportError("connection refused")

    def get(self) -> tuple[LeaseRecord, str] | None:
        self._check()
        return None if self.record is None else (self.record, str(self.rv))

    def create(self, record: LeaseRecord) -> str:
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    def update(self, record: LeaseRecord, resource_version: str) -> str:
        self._check()
        if self.record is None or resource_version != str(self.rv):
            raise LeaseConflict("stale")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> str:
        self.record = record
        self.rv += 1
        self.writes += 1
        return str(self.rv)


def elector(store: MemoryLease, clock: FakeClock, identity: str) -> LeaderElector:
    return LeaderElector(
        store,
        identity,
        lease_duration=LEASE,
        renew_deadline=RENEW,
        retry_period=RETRY,
        clock=clock.now,
        wall=lambda: datetime(2024, 1, 1, tzinfo=UTC) + timedelta(seconds=clock.now()),
        rng=random.Random(0),
    )


def test_first_candidate_creates_the_lease_and_leads() -> None:
    store, clock = MemoryLease(), FakeClock()
    a = elector(store, clock, "a")
    assert not a.leading
    assert a.try_acquire_or_renew()
    assert a.leading
    assert store.record is not None
    assert (store.record.holder, store.record.lease_duration, store.record.transitions) == (
        "a",
        15,
        0,
    )
    assert store.record.acquire_time == "2024-01-01T00:00:00.000000Z"


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    store, clock = MemoryLease(), FakeClock()
    a = elector(store, clock, "a")
    a.try_acquire_or_renew()
    clock.advance(RETRY)
    assert a.try_acquire_or_renew()
    assert store.record is not None
    assert store.record.acquire_time == "2024-01-01T00:00:00.000000Z"
    assert store.record.renew_time == "2024-01-01T00:00:02.000000Z"
    assert store.record.transitions == 0


def test_standby_waits_a_lease_duration_from_its_own_observation() -> None:
    store, clock = MemoryLease(), FakeClock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.try_acquire_or_renew()
    clock.advance(100)  # the record's renewTime is old, but b has never seen it change
    assert not b.try_acquire_or_renew()
    assert b.holder == "a" and b.standby_healthy and not b.leading
    clock.advance(LEASE - 0.1)
    assert not b.try_acquire_or_renew()
    clock.advance(0.2)
    assert b.try_acquire_or_renew()
    assert b.leading
    assert store.record is not None
    assert store.record.holder == "b" and store.record.transitions == 1


def test_a_renewing_leader_keeps_the_standby_out() -> None:
    store, clock = MemoryLease(), FakeClock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.try_acquire_or_renew()
    for _ in range(20):
        clock.advance(RETRY)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert a.leading and not b.leading


def test_leadership_ends_at_the_renew_deadline_even_without_an_attempt() -> None:
    store, clock = MemoryLease(), FakeClock()
    a = elector(store, clock, "a")
    a.try_acquire_or_renew()
    store.down = True
    clock.advance(RENEW - 0.5)
    assert not a.try_acquire_or_renew()
    assert a.leading  # still within the deadline
    clock.advance(0.5)
    assert not a.leading  # no call needed: the property checks the clock
    # Before a rival could take over (LEASE > RENEW), we have stopped.
    assert RENEW < LEASE


def test_a_leader_that_recovers_before_expiry_renews_its_own_lease() -> None:
    store, clock = MemoryLease(), FakeClock()
    a = elector(store, clock, "a")
    a.try_acquire_or_renew()
    store.down = True
    clock.advance(RENEW + 1)
    assert not a.leading
    store.down = False
    assert a.try_acquire_or_renew() and a.leading


def test_a_takeover_racing_a_renewal_loses() -> None:
    store, clock = MemoryLease(), FakeClock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b starts observing
    clock.advance(LEASE + 1)  # a looks expired to b...
    real_update = store.update

    def racing_update(record: LeaseRecord, resource_version: str) -> str:
        store.update = real_update  # type: ignore[method-assign]
        assert a.try_acquire_or_renew()  # ...but a renews between b's read and b's write
        return real_update(record, resource_version)

    store.update = racing_update  # type: ignore[method-assign]
    assert not b.try_acquire_or_renew()
    assert not b.leading and a.leading
    assert store.record is not None and store.record.holder == "a"


def test_release_hands_over_at_once() -> None:
    store, clock = MemoryLease(), FakeClock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert not a.leading
    assert store.record is not None and store.record.holder == ""
    assert b.try_acquire_or_renew()  # an empty holder is free to take
    assert not a.release()  # not ours any more


def test_an_acquisition_says_whether_it_took_over_an_unreleased_lease() -> None:
    """A released Lease (sent only with no bind on the wire) or a new one: nothing of the
    previous holder can still land; an expired one: its writes may still be on the wire."""
    store, clock = MemoryLease(), FakeClock()
    a, b, c = elector(store, clock, "a"), elector(store, clock, "b"), elector(store, clock, "c")
    assert a.try_acquire_or_renew() and a.took_over_from == ""  # created
    assert a.release()
    assert b.try_acquire_or_renew() and b.took_over_from == ""  # released
    assert not c.try_acquire_or_renew()
    clock.advance(LEASE + 0.1)  # b stops renewing: expired
    assert c.try_acquire_or_renew() and c.took_over_from == "b"
    store.down = True
    clock.advance(RENEW)  # c lapses; its own record stays untouched
    assert not c.leading
    store.down = False
    assert c.try_acquire_or_renew() and c.took_over_from == ""


def test_step_schedules_the_next_attempt() -> None:
    store, clock = MemoryLease(), FakeClock()
    changes: list[bool] = []
    a = LeaderElector(
        store,
        "a",
        lease_duration=LEASE,
        renew_deadline=RENEW,
        retry_period=RETRY,
        clock=clock.now,
        rng=random.Random(0),
        on_change=changes.append,
    )
    assert a.step() == RETRY
    assert changes == [True]
    store.down = True
    clock.advance(RENEW)
    assert RETRY <= a.step() <= RETRY * 1.2
    assert changes == [True, False]


def test_durations_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        LeaderElector(MemoryLease(), "a", lease_duration=5, renew_deadline=5, retry_period=1)


def test_micro_time() -> None:
    moment = datetime(2024, 2, 3, 4, 5, 6, 789, tzinfo=UTC)
    assert micro_time(moment) == "2024-02-03T04:05:06.000789Z"


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"


def test_kube_lease_store_speaks_the_lease_api() -> None:
    t = FakeTransport()
    store = KubeLeaseStore(RestClient(t), "kube-system", "koord-scheduler", timeout=5)
    t.on("GET", f"{LEASES}/koord-scheduler", status_response(404, "NotFound", "no"))
    assert store.get() is None
    t.on("POST", LEASES, json_response({"metadata": {"resourceVersion": "7"}}, 201))
    record = LeaseRecord("me", 15, "t0", "t0", 0)
    assert store.create(record) == "7"
    body = t.sent("POST", LEASES)[0].body
    assert body["kind"] == "Lease" and body["metadata"]["name"] == "koord-scheduler"
    assert body["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 0,
        "acquireTime": "t0",
        "renewTime": "t0",
    }
    t.on("PUT", f"{LEASES}/koord-scheduler", status_response(409, "Conflict", "stale"))
    with pytest.raises(LeaseConflict):
        store.update(record, "7")
    assert t.sent("PUT", f"{LEASES}/koord-scheduler")[0].body["metadata"]["resourceVersion"] == "7"
    t2 = FakeTransport()
    t2.on(
        "GET",
        f"{LEASES}/koord-scheduler",
        json_response(
            {
                "metadata": {"resourceVersion": "9"},
                "spec": {"holderIdentity": "x", "leaseDurationSeconds": 4, "leaseTransitions": 2},
            }
        ),
    )
    got = KubeLeaseStore(RestClient(t2), "kube-system", "koord-scheduler", 5).get()
    assert got == (LeaseRecord("x", 4, "", "", 2), "9")


class SlowLease:
    """A per-replica view of one ``MemoryLease`` whose calls take time on the fake clock.

    ``get`` advances the clock by ``before`` seconds, runs ``during`` (another replica's work
    while this call is on the wire), reads the record, then advances by ``after``: the answer
    shows a write made late in the call. Every clock move checks the safety property."""

    def __init__(self, inner: MemoryLease, clock: FakeClock, check: Callable[[], None]) -> None:
        self.inner, self.clock, self.check = inner, clock, check
        self.before = self.after = 0.0
        self.during: Callable[[], None] | None = None

    def _advance(self, seconds: float) -> None:
        self.check()
        self.clock.advance(seconds)
        self.check()

    def get(self) -> tuple[LeaseRecord, str] | None:
        self._advance(self.before)
        if self.during is not None:
            during, self.during = self.during, None
            during()
        got = self.inner.get()
        self._advance(self.after)
        return got

    def create(self, record: LeaseRecord) -> str:
        return self.inner.create(record)

    def update(self, record: LeaseRecord, resource_version: str) -> str:
        return self.inner.update(record, resource_version)


def two_slow_replicas() -> tuple[FakeClock, list[SlowLease], list[LeaderElector]]:
    clock, inner = FakeClock(), MemoryLease()
    electors: list[LeaderElector] = []

    def never_both() -> None:
        assert not all(e.leading for e in electors), f"both lead at t={clock.now()}"

    stores = [SlowLease(inner, clock, never_both) for _ in range(2)]
    electors.extend(elector(s, clock, name) for s, name in zip(stores, "ab", strict=True))
    return clock, stores, electors


def test_a_standby_dates_its_observation_from_the_end_of_a_slow_get() -> None:
    """b's GET takes 12 s (> renew deadline); a renews while it is on the wire. b must count
    the lease duration from when its GET returned, else it takes over while a still leads."""
    clock, stores, (a, b) = two_slow_replicas()
    assert a.try_acquire_or_renew()
    stores[1].before = 12.0
    stores[1].during = a.try_acquire_or_renew  # a renews at t=12 while b's GET is in flight
    assert not b.try_acquire_or_renew()
    stores[1].before = 0.0
    clock.set(16.0)  # past 0 + 15 (the old stamp), before 12 + 15 (the GET's return)
    assert not b.try_acquire_or_renew()
    assert a.leading  # renewed at 12: leads until 22
    clock.set(27.5)
    assert not a.leading
    assert b.try_acquire_or_renew()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1),  # who tries
            st.floats(0.0, 25.0),  # time on the wire before the server reads
            st.floats(0.0, 25.0),  # time on the wire after (the answer's way back)
            st.booleans(),  # does the other replica try meanwhile?
            st.floats(0.0, 20.0),  # idle time after the attempt
        ),
        min_size=1,
        max_size=25,
    )
)
def test_two_replicas_never_both_lead_whatever_the_lease_latency(
    steps: list[tuple[int, float, float, bool, float]],
) -> None:
    clock, stores, electors = two_slow_replicas()
    for who, before, after, interleave, idle in steps:
        other = 1 - who
        stores[who].before, stores[who].after = before, after
        if interleave:
            stores[who].during = electors[other].try_acquire_or_renew
        electors[who].try_acquire_or_renew()
        stores[who].before = stores[who].after = 0.0
        stores[who].check()
        clock.advance(idle)
        stores[who].check()
