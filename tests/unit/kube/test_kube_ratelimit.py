"""scheduler.kube.ratelimit: the token bucket and the backoff, on a fake clock."""

from __future__ import annotations

import random

import pytest

from scheduler.kube.ratelimit import Backoff, TokenBucket
from tests.fakes import FakeClock


def test_bucket_starts_full_then_refills_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2, 3, clock=clock.now)
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_time() == pytest.approx(0.5)
    clock.advance(0.5)
    assert bucket.try_acquire() and not bucket.try_acquire()
    clock.advance(100)
    assert sum(bucket.try_acquire() for _ in range(10)) == 3  # never more than the burst


def test_reserve_queues_waiters_behind_each_other() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 1, clock=clock.now)
    assert bucket.reserve() == 0
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)


def test_acquire_sleeps_for_its_token() -> None:
    clock = FakeClock()
    slept: list[float] = []
    bucket = TokenBucket(4, 1, clock=clock.now, sleep=slept.append)
    bucket.acquire()
    bucket.acquire()
    assert slept == [pytest.approx(0.25)]


def test_zero_rate_is_unlimited() -> None:
    bucket = TokenBucket(0, 1)
    assert bucket.unlimited
    assert all(bucket.try_acquire() for _ in range(1000))
    assert bucket.reserve() == 0 and bucket.wait_time() == 0


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(0.5, 4.0, jitter=0)
    assert [b.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.reset()
    assert b.next() == 0.5


def test_backoff_jitter_stays_in_bounds() -> None:
    b = Backoff(1.0, 1.0, jitter=0.2, rng=random.Random(3))
    values = [b.next() for _ in range(200)]
    assert all(0.8 <= v <= 1.2 for v in values) and len(set(values)) > 100


@pytest.mark.parametrize(
    "args",
    [(0, 1), (2, 1), (1, 2, 0.5, 0.0), (1, 2, 2.0, 1.0)],
    ids=["zero", "max<initial", "factor", "jitter"],
)
def test_backoff_validates(args: tuple[float, ...]) -> None:
    initial, maximum, *rest = args
    kwargs = {}
    if rest:
        kwargs = {"factor": rest[0], "jitter": rest[1]}
    with pytest.raises(ValueError):
        Backoff(initial, maximum, **kwargs)
