"""The token scheduler's rules (SPEC section 11) on a fake clock: tables and a state machine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from koordlet.fairshare.tokens import ClientShare, SchedulerConfig, TokenScheduler


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _sched(shares: dict[str, tuple[float, float]], **cfg: float) -> tuple[TokenScheduler, Clock]:
    clock = Clock()
    s = TokenScheduler(clock, SchedulerConfig(**cfg))
    s.set_clients({n: ClientShare(r, lim) for n, (r, lim) in shares.items()})
    return s, clock


def _run(s: TokenScheduler, clock: Clock, name: str, ms: float) -> None:
    """Give ``name`` one grant of ``ms`` in the past: submit, grant, hold, come back."""
    assert s.submit(name, ("t", name, clock.now), 0.0, 0.0)
    g = s.poll()
    assert g is not None and g.client == name
    clock.now += ms
    s.submit(name, ("done", name, clock.now), max(0.0, ms - g.quota_ms), 0.0)
    s.cancel(("done", name, clock.now))


# --- priority: (usage per client in the window, waiting clients) -> order -----------------
PRIORITY = [
    pytest.param(
        {"a": (0.5, 1.0), "b": (0.3, 1.0)}, {}, ["b", "a"], ["b", "a"], id="no-usage-arrival"
    ),
    pytest.param(
        # a: missing 5000-1000=4000 -> 4000/5000=0.8; b: missing 3000-0 -> 1.0
        {"a": (0.5, 1.0), "b": (0.3, 1.0)},
        {"a": 1000},
        ["a", "b"],
        ["b", "a"],
        id="ratio",
    ),
    pytest.param(
        # a at 4000/5000 -> ratio 0.2; b at 500/3000 -> 2500/3000 = 0.83
        {"a": (0.5, 1.0), "b": (0.3, 1.0)},
        {"a": 1000, "b": 500},
        ["a", "b"],
        ["b", "a"],
        id="ratio-both-used",
    ),
    pytest.param(
        # b met its request (3000); a still missing: a first although it used more
        {"a": (0.5, 1.0), "b": (0.3, 1.0)},
        {"a": 4000, "b": 3000},
        ["b", "a"],
        ["a", "b"],
        id="below-request-first",
    ),
    pytest.param(
        # both above request: least used first
        {"a": (0.1, 1.0), "b": (0.1, 1.0)},
        {"a": 3000, "b": 2000},
        ["a", "b"],
        ["b", "a"],
        id="least-used",
    ),
    pytest.param(
        # b reached its limit (0.2 x 10 s): not eligible at all
        {"a": (0.1, 1.0), "b": (0.2, 0.2)},
        {"a": 3000, "b": 2000},
        ["a", "b"],
        ["a"],
        id="limit-excludes",
    ),
]


@pytest.mark.parametrize(("shares", "used", "arrivals", "expected"), PRIORITY)
def test_priority_order(
    shares: dict[str, tuple[float, float]],
    used: dict[str, float],
    arrivals: list[str],
    expected: list[str],
) -> None:
    s, clock = _sched(shares)
    for name, ms in used.items():
        _run(s, clock, name, ms)
    for name in arrivals:
        s.submit(name, name, 0.0, 0.0)
        clock.now += 0.001
    assert s.priority() == expected
    g = s.poll()
    assert g is not None and g.client == expected[0]


# --- quota rule: (limit, burst reported, previous quota) -> quota --------------------------
QUOTA = [
    pytest.param(1.0, 0.0, None, 250.0, id="no-burst-base"),
    pytest.param(1.0, 150.0, None, 200.0, id="half-burst-half-previous"),
    pytest.param(1.0, 10.0, None, 130.0, id="smooths-down"),
    pytest.param(1.0, 1.0, 100.0, 100.0, id="clamped-to-minimum"),
    pytest.param(1.0, 30_000.0, None, 10_000.0, id="clamped-to-limit-x-window"),
    pytest.param(0.05, 5_000.0, None, 500.0, id="small-limit-max"),
    pytest.param(0.005, 0.0, None, 50.0, id="limit-below-minimum-wins"),
]


@pytest.mark.parametrize(("limit", "burst", "previous", "expected"), QUOTA)
def test_quota_rule(limit: float, burst: float, previous: float | None, expected: float) -> None:
    s, clock = _sched({"a": (0.0, limit)})
    if previous is not None:  # reach the previous quota by a chain of grants
        while True:
            s.submit("a", "p", 0.0, 1.0)
            g = s.poll()
            assert g is not None
            clock.now += 20_000  # out of the window, far from the limit
            if g.quota_ms <= previous:
                break
    s.submit("a", "t", 0.0, burst)
    assert s.quota_for("a") == pytest.approx(expected)
    g = s.poll()
    assert g is not None and g.quota_ms == pytest.approx(expected)


def test_one_holder_until_it_returns_or_expires() -> None:
    s, clock = _sched({"a": (0.5, 1.0), "b": (0.5, 1.0)})
    s.submit("a", 1, 0.0, 0.0)
    s.submit("b", 2, 0.0, 0.0)
    first = s.poll()
    assert first is not None and first.client == "a" and first.quota_ms == 250.0
    assert s.poll() is None and s.next_deadline() == 250.0
    clock.now = 100.0
    s.submit("a", 3, 0.0, 0.0)  # back early: token free, unused rest returned
    assert s.usage_ms("a") == pytest.approx(100.0)
    second = s.poll()
    assert second is not None and second.client == "b" and second.waited_ms == 0.0


def test_dead_holder_loses_token_at_quota_expiry() -> None:
    s, clock = _sched({"a": (0.5, 1.0), "b": (0.5, 1.0)})
    s.submit("a", 1, 0.0, 0.0)
    assert s.poll() is not None
    s.submit("b", 2, 0.0, 0.0)
    clock.now = 249.0
    assert s.poll() is None
    clock.now = 260.0
    g = s.poll()
    assert g is not None and g.client == "b" and g.waited_ms == pytest.approx(10.0)


def test_overuse_is_charged_to_the_last_grant() -> None:
    s, clock = _sched({"a": (0.5, 1.0)})
    s.submit("a", 1, 0.0, 0.0)
    assert s.poll() is not None
    clock.now = 300.0  # quota 250 expired; it kept running 40 ms more
    s.submit("a", 2, 40.0, 0.0)
    assert s.usage_ms("a") == pytest.approx(290.0)


def test_all_at_limit_waits_for_the_window() -> None:
    s, clock = _sched({"a": (0.01, 0.01)}, window_ms=10_000, min_quota_ms=100)
    s.submit("a", 1, 0.0, 0.0)
    g = s.poll()
    assert g is not None and g.quota_ms == 100.0  # limit x W = 100
    clock.now = 100.0
    s.submit("a", 2, 0.0, 0.0)
    assert s.poll() is None
    assert s.next_deadline() == pytest.approx(10_000.0)
    clock.now = 10_000.5
    assert s.poll() is not None


def test_oversubscribed_requests_are_scaled_and_reported() -> None:
    s, _ = _sched({"a": (0.8, 1.0), "b": (0.4, 0.5)})
    assert s.oversubscription == pytest.approx(1.2)
    assert s.effective_request("a") == pytest.approx(0.8 / 1.2)
    assert s.effective_request("b") == pytest.approx(0.4 / 1.2)
    s.set_clients({"a": ClientShare(0.8, 1.0)})
    assert s.oversubscription == 0.0 and s.effective_request("a") == 0.8


def test_unknown_and_removed_clients() -> None:
    s, _ = _sched({"a": (0.5, 1.0)})
    assert not s.submit("zz", 1, 0.0, 0.0)
    s.submit("a", 2, 0.0, 0.0)
    s.set_clients({})
    assert s.poll() is None and s.waiting() == []


@pytest.mark.parametrize(("request_", "limit"), [(-0.1, 1.0), (0.1, 0.0), (0.1, 1.5)], ids=str)
def test_bad_shares_rejected(request_: float, limit: float) -> None:
    with pytest.raises(ValueError):
        ClientShare(request_, limit)


def test_a_limit_below_the_request_caps_the_client() -> None:
    """Gemini's rule (issue 25.5): the limit is the cap whatever the request; the request only
    orders the waiting clients. Request 0.5, limit 0.2: 0.2 of the card, not 0.5."""
    s, clock = _sched({"a": (0.5, 0.2)}, window_ms=10_000, base_quota_ms=250, min_quota_ms=100)
    ticket = 0
    while clock.now < 30_000:  # a greedy client, three windows
        ticket += 1
        assert s.submit("a", ticket, 0.0, 250.0)
        g = s.poll()
        if g is None:
            deadline = s.next_deadline()
            assert deadline is not None and deadline > clock.now
            clock.now = deadline
            continue
        clock.now += g.quota_ms
    assert s.usage_ms("a") <= 0.2 * 10_000 + 250.0


# --- state machine: greedy clients that always come back at quota end ----------------------
class FairShareMachine(RuleBasedStateMachine):
    """Clients with random shares ask, hold, overrun a little or die; the clock jumps."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.s = TokenScheduler(
            self.clock, SchedulerConfig(window_ms=2_000, min_quota_ms=20, base_quota_ms=50)
        )
        self.given: list[tuple[str, float, float]] = []  # (client, start, end) granted
        self.held: tuple[str, float] | None = None
        self.n = 0

    @rule(
        shares=st.lists(
            st.tuples(st.floats(0.0, 0.6), st.floats(0.05, 1.0)), min_size=1, max_size=4
        )
    )
    def set_clients(self, shares: list[tuple[float, float]]) -> None:
        self.s.set_clients(
            {f"c{i}": ClientShare(min(r, lim), lim) for i, (r, lim) in enumerate(shares)}
        )

    @rule(i=st.integers(0, 3), burst=st.floats(0, 400), overuse=st.floats(0, 5))
    def ask(self, i: int, burst: float, overuse: float) -> None:
        self.n += 1
        self.s.submit(f"c{i}", self.n, overuse, burst)

    @rule(dt=st.floats(0.0, 500.0))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule()
    def poll(self) -> None:
        g = self.s.poll()
        if g is None:
            return
        now = self.clock.now
        if self.held is not None:
            holder, until = self.held
            assert now >= until or holder == g.client or self.s.holder == g.client
        share = self.s.share(g.client)
        assert share is not None
        assert g.quota_ms <= share.limit * 2_000 + 1e-6
        assert self.s.usage_ms(g.client) <= share.limit * 2_000 + g.quota_ms + 1e-6
        self.held = (g.client, now + g.quota_ms)

    @invariant()
    def single_holder(self) -> None:
        h = self.s.holder
        if h is not None:
            assert self.held is not None and self.held[0] == h


TestFairShareMachine = FairShareMachine.TestCase
TestFairShareMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize(
    "requests_", [(0.5, 0.3, 0.2), (0.4, 0.4, 0.2), (0.25, 0.25, 0.25, 0.25), (0.4, 0.2)], ids=str
)
def test_greedy_clients_converge_to_their_requests(requests_: tuple[float, ...]) -> None:
    """Simulated time: every client always wants the GPU; shares over 60 s match requests
    (when they sum to 1) or exceed them, the spare going to the least used (sum below 1)."""
    clock = Clock()
    s = TokenScheduler(clock)
    names = [f"c{i}" for i in range(len(requests_))]
    s.set_clients({n: ClientShare(r, 1.0) for n, r in zip(names, requests_, strict=True)})
    got = dict.fromkeys(names, 0.0)
    for n in names:
        s.submit(n, n, 0.0, 30.0)
    while clock.now < 60_000:
        g = s.poll()
        assert g is not None
        got[g.client] += g.quota_ms
        clock.now += g.quota_ms
        s.submit(g.client, g.client, 0.0, 30.0)
    total = sum(got.values())
    for n, r in zip(names, requests_, strict=True):
        if sum(requests_) == pytest.approx(1.0):
            assert got[n] / total == pytest.approx(r, rel=0.05), (n, got[n] / total)
        else:
            assert got[n] / total >= r * 0.95, (n, got[n] / total)
