"""A request for exactly what a card has free fits it; one unit more does not — in the fast
GPU filter (``card_fits`` and its kin, numpy over the ledger), in the per-card reference
(``card_amounts``), in ``allocate`` and in Reserve's ``allocate_plain``.

The random ledgers of test_allocator.py allocate in proportion (core = ratio, memory = ratio
of the card) and ask from a fixed list, so they almost never ask for *exactly* the free part
of one resource: a ``>=`` turned ``>`` in the fast filter went unnoticed (mutation testing,
issue 45). Here the holder takes any amounts and the request is the free part, +-1.
"""

# Equivalent mutants (make mutation MODULE=scheduler/devices/allocator.py):
# mutmut-equivalent: scheduler.devices.allocator.x_card_taken__mutmut_23
#   `ratio * card_memory // 100` -> `/ 100`: the result is stored into an int64 matrix, which
#   truncates the (positive) quotient; a double is exact to well past any card's bytes x 100.
# mutmut-equivalent: scheduler.devices.allocator.x_card_taken__mutmut_29
#   `memory * 100 // card_memory` -> `/`: stored into the int64 matrix, truncated; the rounded
#   quotient of two integers below 2**53 only reaches the next integer when card x ratio
#   exceeds 2**53 (a card of about 90 TB), so the two agree for every real card.
# mutmut-equivalent: scheduler.devices.allocator.x_card_fits__mutmut_47
#   `free >= ratio * card_memory // 100` -> `/ 100`: for an integer free, free >= x exactly
#   when free >= floor(x); the double quotient is exact enough below cards of ~70 TB.
# mutmut-equivalent: scheduler.devices.allocator.x_card_fits__mutmut_53
#   `card_memory > 0` -> `>= 0`: a card of 0 bytes has 0 free, which the memory test just
#   below refuses for every memory request (at least 1 byte).
# mutmut-equivalent: scheduler.devices.allocator.x_card_fits__mutmut_11
#   a NIC/FPGA's `ok &= free >= per` -> `ok = ...` drops the health mask, but an unhealthy
#   card's (or a padding column's) total and so free is 0 (ledger invariant) and every
#   request parse_request builds asks at least 1 of a non-GPU type: no unhealthy card fits.
# mutmut-equivalent: scheduler.devices.allocator.x_card_fits__mutmut_20
#   the core test `ok &= ...` -> `ok = ...` drops the health mask, but the ratio or memory test
#   that always follows rejects an unhealthy card alone: its total memory and free ratio are 0,
#   and a requested ratio or memory is at least 1 (parse_request).
# mutmut-equivalent: scheduler.devices.allocator.x_card_left__mutmut_21
#   `per[core] if requested[core] else 0` -> `per[core]`: per_device is 0 wherever requested is
#   False (request.TypeRequest's invariant, _gpu_request), so both take 0 cores.
# mutmut-equivalent: scheduler.devices.allocator.x_card_left__mutmut_88
#   `assert share is not None and declared is not None` -> `or`: both are set in the same loop
#   iteration over a non-empty per_device, so neither or both are None.

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler.devices.allocator import (
    allocate,
    allocate_plain,
    card_amounts,
    card_fits,
    card_left,
    card_taken,
    rows_feasible,
)
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import parse_request
from scheduler.devices.scoring import Scorer
from scheduler.framework.events import Change
from scheduler.plugins.deviceshare.args import DeviceShareArgs
from tests.unit.devices.helpers import bound, device, gpu, gpu_alloc, gpu_pod, nic

CORE, RATIO, MEM = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio", \
    "koordinator.sh/gpu-memory"
RDMA = "koordinator.sh/rdma"


def _expected(kind: str, ask: dict[str, int], card_memory: int,
              free: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """What a healthy GPU with ``free`` (core, ratio, memory) gives ``ask``, by hand:
    a ratio request takes ``ratio * card / 100`` bytes, a memory request the ratio
    ``memory * 100 // card``; every completed amount must be free."""
    core = ask.get(CORE, 0)
    if RATIO in ask:
        ratio, memory = ask[RATIO], ask[RATIO] * card_memory // 100
    else:
        memory, ratio = ask[MEM], ask[MEM] * 100 // card_memory
    fits = core <= free[0] and ratio <= free[1] and memory <= free[2]
    return (core, ratio, memory) if fits else None


@settings(max_examples=300, deadline=None)
@given(
    card_memory=st.sampled_from([1, 100, 1000, 16 * 1024**3, 80 * 1024**3 + 7]),
    held=st.tuples(st.integers(0, 100), st.integers(0, 100), st.floats(0, 1)),
    kind=st.sampled_from(["memory", "ratio", "core+ratio", "core+memory"]),
    delta=st.sampled_from([-1, 0, 1]),
)
# a one-byte card: a memory request of all of it is the whole ratio (1 * 100 // 1)
@example(card_memory=1, held=(0, 0, 0.0), kind="memory", delta=0)
@example(card_memory=1, held=(0, 0, 0.0), kind="core+memory", delta=0)
# ... nor when half the ratio is free (the ratio is 1 * 100 // 1, not // 2)
@example(card_memory=1, held=(0, 50, 0.0), kind="memory", delta=0)
# all of the ratio but 5 bytes short of its memory (100 * 1000 // 100): no fit
@example(card_memory=1000, held=(0, 0, 0.005), kind="ratio", delta=0)
def test_exactly_the_free_part_fits_and_one_more_does_not(
    card_memory: int, held: tuple[int, int, float], kind: str, delta: int
) -> None:
    held_core, held_ratio, memory_share = held
    held_memory = int(card_memory * memory_share)
    ledger = NodeDeviceLedger(rows=1, cards=1)
    ledger.apply_change(Change("Device", None, device("n", gpu(0, str(card_memory)))))
    if held_core or held_ratio or held_memory:
        holder = bound(gpu_pod("holder", {}), "n",
                       gpu_alloc(0, held_ratio, held_memory, core=held_core))
        ledger.apply_change(Change("Pod", None, holder))
    free = (100 - held_core, 100 - held_ratio, card_memory - held_memory)
    ask: dict[str, int] = {}
    if kind.startswith("core"):
        ask[CORE] = free[0] + delta
    if kind.endswith("ratio"):
        ask[RATIO] = free[1] + (delta if kind == "ratio" else 0)
    else:
        ask[MEM] = free[2] + (delta if kind == "memory" else 0)
    if any(v <= 0 for v in ask.values()) or ask.get(RATIO, 0) > 100 or ask.get(CORE, 0) > 100:
        return  # not a one-card request (or none at all)
    request = parse_request(gpu_pod("p", {k: str(v) for k, v in ask.items()}).build())
    assert request is not None
    (treq,) = request.types
    want = _expected(kind, ask, card_memory, free)

    card = ledger.node_view("n", ["gpu"]).cards["gpu"][0]
    assert card_amounts(treq, card) == want
    rows = np.arange(1)
    fits, taken = card_taken(ledger, treq, rows)
    fits_left, left = card_left(ledger, treq, rows)
    assert bool(card_fits(ledger, treq, rows)[0, 0]) == bool(fits[0, 0]) == \
        bool(fits_left[0, 0]) == (want is not None), (ask, free)
    assert bool(rows_feasible(ledger, request, rows)[0]) == (want is not None)
    if want is not None:
        assert tuple(int(x) for x in taken[:, 0, 0]) == want
        after = [f - w for f, w in zip(free, want, strict=True)]
        totals = (100, 100, card_memory)
        assert left.dtype.kind == "i"  # thousandths, integers like the ledger's share
        assert left[0, 0] == min(a * 1000 // t for a, t in zip(after, totals, strict=True))
    scorer = Scorer(DeviceShareArgs())
    ref = allocate(ledger.node_view("n", request.device_types), request, scorer)
    fast = allocate_plain(ledger, "n", request, scorer)
    assert isinstance(ref, list) == (want is not None)
    if fast is not None:
        assert fast == ref


def _share_left(total: tuple[int, ...], free: tuple[int, ...], taken: tuple[int, ...]) -> int:
    """The ledger's ``share`` of a card once ``taken`` is gone, by hand: min over declared
    resources of ``max(free - taken, 0) * 1000 // total``; 0 for a card declaring nothing."""
    parts = [max(f - t, 0) * 1000 // tot for tot, f, t in zip(total, free, taken, strict=True)
             if tot > 0]
    return min(parts) if parts else 0


_ASKS: tuple[dict[str, int], ...] = (
    {RATIO: 30}, {MEM: 500}, {MEM: 1}, {CORE: 20, RATIO: 10}, {CORE: 20, MEM: 700},
)


def _ask_id(ask: dict[str, int]) -> str:
    return "+".join(f"{name.split('-')[-1]}={v}" for name, v in ask.items())


@pytest.mark.parametrize("ask", _ASKS, ids=_ask_id)
@pytest.mark.parametrize("core,ratio", [(0, 0), (0, 1), (1, 0), (100, 100)])
@pytest.mark.parametrize("memory", ["0", "1", "1000", "1001", "16Gi"])
def test_share_left_on_every_card_even_the_ones_that_cannot_fit(
    memory: str, core: int, ratio: int, ask: dict[str, int]
) -> None:
    """``card_left`` for every card (also those that cannot give the request, undeclared
    or one-unit resources, unhealthy cards, cards whose memory is scarcer than their ratio):
    the share left after taking the completed request, exactly (integer thousandths)."""
    request = parse_request(gpu_pod("p", {k: str(v) for k, v in ask.items()}).build())
    assert request is not None
    (treq,) = request.types
    for healthy, held in itertools.product(
        (True, False), ((0, 0, 0), (0, 0, 1), (10, 10, 600), (30, 60, 0), (100, 100, 10**12))
    ):
        card = gpu(0, memory, core=core, health=healthy)
        card["resources"][RATIO] = str(ratio)
        ledger = NodeDeviceLedger(rows=1, cards=1)
        ledger.apply_change(Change("Device", None, device("n", card, gpu(1, "16Gi"))))
        if any(held):
            holder = bound(gpu_pod("h", {}), "n", gpu_alloc(0, held[1], held[2], core=held[0]))
            ledger.apply_change(Change("Pod", None, holder))
        _, left = card_left(ledger, treq, np.arange(1))
        assert left.dtype.kind == "i"  # thousandths, integers like the ledger's share
        for view in ledger.node_view("n", ["gpu"]).cards["gpu"]:
            col = ledger.minors("n", "gpu").index(view.minor)
            card_memory = view.total[2]
            c = ask.get(CORE, 0)
            if RATIO in ask:
                taken = (c, ask[RATIO], ask[RATIO] * card_memory // 100)
            else:
                taken = (c, ask[MEM] * 100 // max(card_memory, 1), ask[MEM])
            want = _share_left(view.total, view.free, taken)
            assert left[0, col] == want, (view, ask, held)


@given(held=st.integers(0, 100), delta=st.sampled_from([-1, 0, 1]))
def test_a_nic_gives_exactly_its_free_part(held: int, delta: int) -> None:
    ledger = NodeDeviceLedger(rows=1, cards=1)
    ledger.apply_change(Change("Device", None, device("n", nic("rdma", 0))))
    if held:
        text = f'{{"rdma":[{{"minor":0,"resources":{{"{RDMA}":"{held}"}}}}]}}'
        ledger.apply_change(Change("Pod", None, bound(gpu_pod("holder", {}), "n", text)))
    ask = 100 - held + delta
    if not 0 < ask <= 100:
        return
    request = parse_request(gpu_pod("p", {RDMA: str(ask)}).build())
    assert request is not None
    (treq,) = request.types
    rows = np.arange(1)
    fits = ask <= 100 - held
    assert bool(card_fits(ledger, treq, rows)[0, 0]) == fits
    card = ledger.node_view("n", ["rdma"]).cards["rdma"][0]
    assert card_amounts(treq, card) == ((ask,) if fits else None)
