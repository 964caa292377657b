"""``RequestRows`` (DeviceShare's per-shape feasibility and node score, recomputed only for
the rows that changed) == ``feasible_rows`` / ``Scorer.score_rows`` (the full pass), after
every step of random ledger histories: reservations and releases, new nodes (rows and their
capacity grow), Device updates and deletes, unhealthy cards, bound pods."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED
from apis.resources import GPU_MEMORY, RDMA
from scheduler.devices.allocator import allocate, feasible_rows
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import CardUse, DeviceRequest, Holding, parse_request
from scheduler.devices.rowcache import RequestRows
from scheduler.devices.scoring import Scorer
from scheduler.framework.events import Change
from scheduler.framework.plugin_args import LEAST_ALLOCATED, MOST_ALLOCATED
from scheduler.framework.status import Status
from scheduler.plugins.deviceshare.args import DeviceShareArgs
from tests.unit.devices.helpers import GI, device, gpu, gpu_alloc, gpu_pod, ledgers, nic

REQUESTS: list[dict[str, Any]] = [
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory": "4Gi"},
    {"koordinator.sh/gpu-memory": "30Gi"},
    {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100},
    {"nvidia.com/gpu": 1, RDMA: 10},
]


def _request(i: int) -> DeviceRequest:
    request = parse_request(gpu_pod(f"q{i}", REQUESTS[i]).build())
    assert request is not None
    return request


def _check(rows: RequestRows, ledger: NodeDeviceLedger, scorer: Scorer, i: int) -> None:
    request = _request(i)
    fits, scores = rows.feasible(request), rows.scores(request)
    assert fits.tolist() == feasible_rows(ledger, request).tolist()
    assert scores.tolist() == scorer.score_rows(ledger, request).tolist()
    assert not fits.flags.writeable and not scores.flags.writeable


BULK = 40
"""Rows added before each history: ``RequestRows`` recomputes every row when more than 1/8
of them changed, so the refresh of a few rows alone needs a ledger of some size."""

steps = st.lists(
    st.tuples(
        st.sampled_from(["query", "reserve", "release", "add", "delete", "sick", "device"]),
        st.integers(0, 63),
        st.integers(0, len(REQUESTS) - 1),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ledger=ledgers(max_nodes=5),
    history=steps,
    most=st.booleans(),
    limit=st.sampled_from([1, 2, 32]),
)
def test_request_rows_equal_the_full_pass(
    ledger: NodeDeviceLedger, history: list[tuple[str, int, int]], most: bool, limit: int
) -> None:
    scorer = Scorer(DeviceShareArgs(strategy=MOST_ALLOCATED if most else LEAST_ALLOCATED))
    for i in range(BULK):  # enough rows that a few changed ones are refreshed alone
        cards = [gpu(m, "40Gi", health=(i + m) % 5 != 0) for m in range(1 + i % 8)]
        ledger.apply_change(Change("Device", None, device(f"bulk{i}", *cards)))
    rows = RequestRows(ledger, scorer, limit=limit)
    held: list[Holding] = []
    added = 0
    for what, n, i in history:
        names = [ledger.node_name(r) for r in range(ledger.n_rows)]
        node = names[(n * 7) % len(names)]
        if what == "reserve":
            request = _request(i)
            uses = allocate(ledger.node_view(node, request.device_types), request, scorer)
            if not isinstance(uses, Status):
                held.append(ledger.reserve(f"r{len(held)}", node, uses))
        elif what == "release" and held:
            ledger.unreserve(held.pop(n % len(held)))
        elif what == "add":
            # New rows: enough of them in one history to double the row capacity.
            added += 1
            cards = [gpu(m, "40Gi") for m in range(1 + n % 8)]
            ledger.apply_change(Change("Device", None, device(f"new{added}", *cards)))
        elif what == "delete":
            old = ledger.device(node)
            if old is not None:
                ledger.apply_change(Change("Device", old, None))
        elif what == "sick":
            ledger.set_unhealthy(node, frozenset({n % 4}) if i % 2 else None)
        elif what == "device":
            cards = [gpu(m, "80Gi", health=m != n % 3) for m in range(1 + i)]
            cards.append(nic(RDMA, 0))
            ledger.apply_change(Change("Device", ledger.device(node), device(node, *cards)))
        _check(rows, ledger, scorer, i)


@pytest.mark.parametrize("known_by", ["bound-pod", "reservation"])
def test_a_node_that_gains_devices_after_it_is_known_becomes_feasible(known_by: str) -> None:
    """The node has a row (a pod holds on it) before its Device CR comes; the cached rows
    saw it device-less and must see the cards once they come — also after the rows grew
    past their capacity in between (the version counter is copied, not restarted)."""
    ledger = NodeDeviceLedger(rows=2, cards=1)
    for i in range(BULK):
        ledger.apply_change(Change("Device", None, device(f"bulk{i}", gpu(0, "40Gi"))))
    scorer = Scorer(DeviceShareArgs())
    rows = RequestRows(ledger, scorer, limit=32)
    if known_by == "bound-pod":
        pod = gpu_pod("holder", {}).node("late")
        pod.annotation(ANNOTATION_DEVICE_ALLOCATED, gpu_alloc(1, 10, GI))
        ledger.apply_change(Change("Pod", None, pod.build()))
    else:
        ledger.reserve("holder", "late", [CardUse.of("gpu", 1, {GPU_MEMORY: GI})])
    late = ledger.row_of("late")
    assert late is not None and not ledger.has_device("late")
    for i in range(3):
        _check(rows, ledger, scorer, i)
        assert not rows.feasible(_request(i))[late]
    before = ledger.row_version[: ledger.n_rows].copy()
    for i in range(BULK, 3 * BULK):  # the rows double twice
        ledger.apply_change(Change("Device", None, device(f"bulk{i}", gpu(0, "40Gi"))))
    assert (ledger.row_version[: len(before)] == before).all()
    for i in range(3):  # cached again, at the new capacity: still device-less
        _check(rows, ledger, scorer, i)
        assert not rows.feasible(_request(i))[late]
    ledger.apply_change(Change("Device", None, device("late", gpu(0, "80Gi"), gpu(1, "80Gi"))))
    assert ledger.row_version[late] == ledger.tick == ledger.row_version.max()
    for i in range(len(REQUESTS)):
        _check(rows, ledger, scorer, i)
    assert rows.feasible(_request(0))[late]


def test_an_empty_ledger_has_only_the_sentinel() -> None:
    ledger = NodeDeviceLedger()
    rows = RequestRows(ledger, Scorer())
    request = _request(0)
    assert rows.feasible(request).tolist() == [False]
    assert rows.scores(request).tolist() == [0]


def test_views_are_read_only() -> None:
    ledger = NodeDeviceLedger()
    ledger.apply_change(Change("Device", None, device("a", gpu(0))))
    rows = RequestRows(ledger, Scorer())
    with pytest.raises(ValueError):
        rows.feasible(_request(0))[0] = False
    assert np.array_equal(rows.feasible(_request(0)), [True, False])
