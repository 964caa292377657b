"""NodeOverlay: what-if views over the ledger (preemption dry runs) that never mutate it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS
from scheduler.devices import (
    CardView,
    NodeDeviceLedger,
    NodeOverlay,
    NodeView,
    Scorer,
    parse_request,
)
from scheduler.devices.request import CardUse, Holding
from scheduler.framework.status import Status
from tests.unit.devices.helpers import (
    GI,
    bound,
    device,
    gpu,
    gpu_alloc,
    gpu_pod,
    ledger_of,
    ledgers,
)

REQUESTS: list[dict[str, Any]] = [
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory": "8Gi"},
    {"koordinator.sh/gpu-memory": "10Gi"},
    {"koordinator.sh/rdma": 30},
]


def _request(spec: dict[str, Any]) -> Any:
    request = parse_request(gpu_pod("x", spec).build())
    assert request is not None
    return request


def _two_pods() -> NodeDeviceLedger:
    half = gpu_alloc(0, 50, 40 * GI, core=50)
    return ledger_of(
        [device("n", gpu(0), gpu(1))],
        [bound(gpu_pod("a", {"nvidia.com/gpu": 1}).uid("a"), "n", half),
         bound(gpu_pod("b", {"nvidia.com/gpu": 1}).uid("b"), "n",
               gpu_alloc(1, 100, 80 * GI, core=100))],
    )


@pytest.mark.parametrize(
    ("remove", "spec", "want"),
    [
        pytest.param((), {"nvidia.com/gpu": 1}, None, id="full-node"),
        pytest.param(("b",), {"nvidia.com/gpu": 1}, (1,), id="evict-the-whole-card-pod"),
        pytest.param(("a",), {"nvidia.com/gpu": 2}, None, id="one-victim-is-not-enough"),
        pytest.param(("a", "b"), {"nvidia.com/gpu": 2}, (0, 1), id="both-victims"),
        pytest.param(("zzz",), {"koordinator.sh/gpu-core": 50,
                                "koordinator.sh/gpu-memory-ratio": 50}, (0,), id="unknown-uid"),
    ],
)
def test_dry_run_preemption(remove: tuple[str, ...], spec: dict[str, Any],
                            want: tuple[int, ...] | None) -> None:
    ledger = _two_pods()
    before = ledger.snapshot_state()
    overlay = NodeOverlay(ledger, "n")
    for uid in remove:
        overlay.remove(uid)
    got = overlay.allocate(_request(spec), Scorer())
    if want is None:
        assert isinstance(got, Status)
    else:
        assert isinstance(got, list) and tuple(sorted(u.minor for u in got)) == want
    assert ledger.snapshot_state() == before


def test_kubelet_held_cards_cannot_be_removed() -> None:
    checkpoints = encode_devices_checkpoints([PodDeviceEntry("k", "c", "nvidia.com/gpu",
                                                             ("GPU-0",))])
    ledger = ledger_of([device("n", gpu(0), annotations={
        ANNOTATION_DEVICES_CHECKPOINTS: checkpoints})])
    overlay = NodeOverlay(ledger, "n")
    assert not overlay.remove("checkpoint:n")
    assert isinstance(overlay.allocate(_request({"nvidia.com/gpu": 1}), Scorer()), Status)


def test_add_is_idempotent_by_uid_and_clone_is_independent() -> None:
    ledger = _two_pods()
    overlay = NodeOverlay(ledger, "n")
    overlay.remove("b")
    use = CardUse.of("gpu", 1, {"koordinator.sh/gpu-core": 30})
    overlay.add("c", [use])
    overlay.add("c", [use])
    copy = overlay.clone()
    copy.remove("c")
    assert overlay.view(["gpu"]).cards["gpu"][1].used[0] == 30
    assert copy.view(["gpu"]).cards["gpu"][1].used[0] == 0
    copy.restore("b")
    assert copy.view(["gpu"]).cards["gpu"][1].used[0] == 100


def _live(view: NodeView) -> dict[str, tuple[CardView, ...]]:
    """The cards of a view, without columns of absent cards nobody holds any more (the
    ledger keeps those as unusable columns until its row is rebuilt)."""
    return {t: tuple(c for c in cards if c.exists or c.in_use) for t, cards in view.cards.items()}


def _no_overcommit(overlay: NodeOverlay, uses: list[CardUse]) -> None:
    """What an overlay allocation took fitted: the cards it took from are within their
    totals (a later ``restore`` of a victim may of course over-commit them)."""
    view = overlay.view(("gpu", "rdma", "fpga"))
    for use in uses:
        c = next(c for c in view.cards[use.device_type] if c.minor == use.minor)
        assert c.healthy and all(u <= t for u, t in zip(c.used, c.total, strict=True)), c


ops = st.lists(
    st.one_of(
        st.tuples(st.just("remove"), st.integers(0, 40)),
        st.tuples(st.just("restore"), st.integers(0, 40)),
        st.tuples(st.just("add"), st.integers(0, len(REQUESTS) - 1)),
        st.tuples(st.just("clone"), st.just(0)),
    ),
    max_size=12,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers(max_nodes=3), st.integers(0, 2), ops)
def test_overlay_is_a_replay_without_the_removed_and_never_mutates(
    ledger: NodeDeviceLedger, node_index: int, sequence: list[tuple[str, int]]
) -> None:
    node = f"n{node_index % ledger.n_rows}"
    before = ledger.snapshot_state()
    versions = ledger.row_version.copy()
    holders = [h.uid for h in ledger.holdings_on(node)]
    overlay = NodeOverlay(ledger, node)
    added: dict[str, Holding] = {}
    removed: set[str] = set()
    for i, (op, arg) in enumerate(sequence):
        if op == "remove" and holders:
            uid = holders[arg % len(holders)]
            overlay.remove(uid)
            removed.add(uid)
        elif op == "restore" and holders:
            uid = holders[arg % len(holders)]
            overlay.restore(uid)
            removed.discard(uid)
        elif op == "add":
            got = overlay.allocate(_request(REQUESTS[arg]), Scorer())
            if isinstance(got, list):
                added[f"new{i}"] = overlay.add(f"new{i}", got)
                _no_overcommit(overlay, got)
        elif op == "clone":
            overlay = overlay.clone()
    # The same node rebuilt from scratch: its Device, the holders not removed, the added.
    device_obj = ledger.device(node)
    kept = [h for h in ledger.holdings_on(node) if h.uid not in removed]
    expected = NodeDeviceLedger.replay([device_obj] if device_obj else [], [],
                                       [*kept, *added.values()])
    types = ("gpu", "rdma", "fpga")
    assert _live(overlay.view(types)) == _live(expected.node_view(node, types))
    assert ledger.snapshot_state() == before
    assert np.array_equal(ledger.row_version, versions)
