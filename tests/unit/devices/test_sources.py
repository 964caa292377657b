"""What describes a node in the ledger (``scheduler.devices.sources``): its Device CR, else the
cards of its gpushare capacity (``aliyun.com/gpu-mem`` / ``aliyun.com/gpu-count``), and the
operator's ``unhealthy-gpu-<node>`` ConfigMap (issue 27, items 1 and 3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from apis.allocation import MAX_AMOUNT
from apis.core import Node, Pod
from apis.gpushare import MemoryUnit, UnhealthyGPUs
from scheduler.devices.ledger import NodeDeviceLedger
from scheduler.devices.request import ANNOTATION
from scheduler.framework.events import UNHEALTHY_GPUS_KIND, Change
from tests.builders import make_node, make_pod
from tests.unit.devices.helpers import GI, device, gpu, verify

MI = 1 << 20


def gs_node(name: str, units: int | None, count: int | None) -> Node:
    return make_node(name).cpu("64").gpushare(units, count).build()


def placed(name: str, node: str, idx: int, units: int) -> Pod:
    """A pod gpushare's extender placed before the switch (its annotations only)."""
    return (
        make_pod(name)
        .limit({"aliyun.com/gpu-mem": str(units)})
        .annotation("ALIYUN_COM_GPU_MEM_IDX", str(idx))
        .annotation("ALIYUN_COM_GPU_MEM_POD", str(units))
        .node(node)
        .build()
    )


def cards(ledger: NodeDeviceLedger, node: str) -> dict[int, tuple[bool, bool, int, int]]:
    """minor -> (exists, healthy, total memory, free memory)."""
    view = ledger.node_view(node, ("gpu",))
    return {c.minor: (c.exists, c.healthy, c.total[2], c.free[2]) for c in view.cards["gpu"]}


def fed(*changes: Change, unit: MemoryUnit = MemoryUnit.GiB) -> NodeDeviceLedger:
    ledger = NodeDeviceLedger(rows=2, cards=2, gpushare_unit=unit)
    for change in changes:
        ledger.apply_change(change)
    verify(ledger)
    return ledger


def unhealthy(node: str, *minors: int) -> UnhealthyGPUs:
    return UnhealthyGPUs(node, frozenset(minors))


@pytest.mark.parametrize(
    ("units", "count", "want"),
    [
        pytest.param(32, 2, {0: 16 * GI, 1: 16 * GI}, id="two-cards"),
        pytest.param(33, 2, {0: 16 * GI, 1: 16 * GI}, id="integer-division"),
        pytest.param(32, 0, {}, id="count-0"),
        pytest.param(1, 2, {}, id="less-than-a-unit-per-card"),
        pytest.param(32, None, {}, id="no-count"),
        pytest.param(None, 2, {}, id="no-memory"),
    ],
)
def test_a_node_without_device_cr_gets_the_cards_of_its_gpushare_capacity(
    units: int | None, count: int | None, want: dict[int, int]
) -> None:
    """Before: every such node answered "Insufficient gpu devices" (no card at all)."""
    ledger = fed(Change("Node", None, gs_node("n", units, count)))
    got = cards(ledger, "n")
    assert {m: c[2] for m, c in got.items()} == want
    assert all(c[0] and c[1] and c[3] == c[2] for c in got.values())
    assert ledger.has_device("n") == bool(want)


def test_the_unit_is_the_scheduler_gpushare_unit_even_when_set_later() -> None:
    node = gs_node("n", 512, 1)
    assert cards(fed(Change("Node", None, node), unit=MemoryUnit.MiB), "n") == {
        0: (True, True, 512 * MI, 512 * MI)
    }
    ledger = fed(Change("Node", None, node))
    assert cards(ledger, "n")[0][2] == 512 * GI
    ledger.gpushare_unit = MemoryUnit.MiB  # DeviceShare's gpushareMemoryUnit, applied late
    assert cards(ledger, "n")[0][2] == 512 * MI
    verify(ledger)


def test_pods_gpushare_placed_count_on_their_derived_card_in_any_order() -> None:
    node, old = gs_node("n", 32, 2), placed("old", "n", 1, 6)
    for changes in (
        (Change("Node", None, node), Change("Pod", None, old)),
        (Change("Pod", None, old), Change("Node", None, node)),
    ):
        ledger = fed(*changes)
        assert cards(ledger, "n") == {
            0: (True, True, 16 * GI, 16 * GI),
            1: (True, True, 16 * GI, 10 * GI),
        }
        replayed = NodeDeviceLedger.replay([], [old], nodes=[node])
        assert replayed.snapshot_state() == ledger.snapshot_state()


def test_a_gpushare_pod_moved_or_resized_follows_its_annotations() -> None:
    """A bound gpushare pod whose placement changes (another card, other units) holds what
    its annotations say now; the same annotations again change nothing."""
    node = gs_node("n", 32, 2)
    first = placed("p", "n", 0, 6)
    ledger = fed(Change("Node", None, node), Change("Pod", None, first))
    holding = ledger.holding(first.uid)
    assert holding is not None and ledger.held_from_the_cluster(first.uid) is holding
    assert holding.source == ANNOTATION  # the cluster's word, not a reservation of ours
    before = ledger.tick
    ledger.apply_change(Change("Pod", first, first))  # a resync: nothing to lay out again
    assert ledger.tick == before
    assert ledger.holding(first.uid) is holding  # not even a new holding object
    moved = placed("p", "n", 1, 6)
    ledger.apply_change(Change("Pod", first, moved))
    assert cards(ledger, "n") == {0: (True, True, 16 * GI, 16 * GI),
                                  1: (True, True, 16 * GI, 10 * GI)}
    resized = placed("p", "n", 1, 4)
    ledger.apply_change(Change("Pod", moved, resized))
    assert cards(ledger, "n")[1] == (True, True, 16 * GI, 12 * GI)
    assert ledger.holdings_on("n") == [ledger.holding(first.uid)]
    verify(ledger)
    assert ledger.snapshot_state() == NodeDeviceLedger.replay([], [resized], nodes=[node]
                                                              ).snapshot_state()


@pytest.mark.parametrize("index", ["x", "-1", ""])
def test_malformed_gpushare_annotations_are_counted_each_time_and_hold_nothing(
    index: str,
) -> None:
    node = gs_node("n", 32, 2)
    good = placed("p", "n", 1, 6)
    bad = (make_pod("p").limit({"aliyun.com/gpu-mem": "6"})
           .annotation("ALIYUN_COM_GPU_MEM_IDX", index)
           .annotation("ALIYUN_COM_GPU_MEM_POD", "6").node("n").build())
    ledger = fed(Change("Node", None, node), Change("Pod", None, good))
    ledger.annotation_errors = 5
    with capture_logs() as logs:
        ledger.apply_change(Change("Pod", good, bad))  # what it held is released
    assert ledger.annotation_errors == 6
    assert [(e["event"], e["pod"], e["uid"], e["node"]) for e in logs] == [
        ("malformed gpushare annotations on a bound pod", "default/p", bad.uid, "n")]
    assert "ALIYUN_COM_GPU_MEM_IDX" in logs[0]["error"]
    assert ledger.holding(good.uid) is None
    assert cards(ledger, "n")[1] == (True, True, 16 * GI, 16 * GI)
    ledger.apply_change(Change("Pod", bad, bad))
    assert ledger.annotation_errors == 7


def test_capacity_changes_replace_the_cards_and_keep_the_holdings() -> None:
    old = placed("old", "n", 1, 6)
    ledger = fed(Change("Node", None, gs_node("n", 32, 2)), Change("Pod", None, old))
    # The device plugin restarts with other cards: the picture follows, the pod stays.
    ledger.apply_change(Change("Node", gs_node("n", 32, 2), gs_node("n", 24, 3)))
    assert cards(ledger, "n") == {
        0: (True, True, 8 * GI, 8 * GI),
        1: (True, True, 8 * GI, 2 * GI),
        2: (True, True, 8 * GI, 8 * GI),
    }
    verify(ledger)
    # The capacity disappears: no card left to place on, the pod's holding still there.
    ledger.apply_change(Change("Node", gs_node("n", 24, 3), gs_node("n", None, None)))
    assert cards(ledger, "n") == {1: (False, False, 0, 0)}
    assert ledger.holding(old.uid) is not None and not ledger.has_device("n")
    verify(ledger)
    # Back, then the node is deleted.
    ledger.apply_change(Change("Node", gs_node("n", None, None), gs_node("n", 32, 2)))
    assert cards(ledger, "n")[0] == (True, True, 16 * GI, 16 * GI)
    ledger.apply_change(Change("Node", gs_node("n", 32, 2), None))
    assert not ledger.has_device("n") and set(cards(ledger, "n")) == {1}
    verify(ledger)


def test_an_unchanged_capacity_is_not_laid_out_again() -> None:
    ledger = fed(Change("Node", None, gs_node("n", 32, 2)))
    version = int(ledger.row_version[ledger.row_of("n") or 0])
    heartbeat = make_node("n").cpu("64").gpushare(32, 2).label("beat", "1").build()
    ledger.apply_change(Change("Node", gs_node("n", 32, 2), heartbeat))
    assert int(ledger.row_version[ledger.row_of("n") or 0]) == version


def test_a_device_cr_takes_over_and_allocations_are_kept() -> None:
    old = placed("old", "n", 1, 6)
    ledger = fed(Change("Node", None, gs_node("n", 32, 2)), Change("Pod", None, old))
    cr = device("n", gpu(0, "24Gi"), gpu(1, "24Gi"), gpu(2, "24Gi"))
    ledger.apply_change(Change("Device", None, cr))
    assert cards(ledger, "n") == {
        0: (True, True, 24 * GI, 24 * GI),
        1: (True, True, 24 * GI, 18 * GI),
        2: (True, True, 24 * GI, 24 * GI),
    }
    assert ledger.device("n") is cr
    # A capacity change while the CR is there changes nothing.
    version = int(ledger.row_version[ledger.row_of("n") or 0])
    ledger.apply_change(Change("Node", gs_node("n", 32, 2), gs_node("n", 64, 4)))
    assert int(ledger.row_version[ledger.row_of("n") or 0]) == version
    verify(ledger)
    # The CR goes (koordlet removed): the capacity's cards describe the node again.
    ledger.apply_change(Change("Device", cr, None))
    assert cards(ledger, "n")[1] == (True, True, 16 * GI, 10 * GI) and len(cards(ledger, "n")) == 4
    replayed = NodeDeviceLedger.replay([], [old], nodes=[gs_node("n", 64, 4)])
    assert replayed.snapshot_state() == ledger.snapshot_state()


def test_unhealthy_configmap_takes_cards_away_until_it_is_deleted() -> None:
    """Before: the ConfigMap was ignored and pods were placed on the cards it names."""
    old = placed("old", "n", 1, 6)
    marks = unhealthy("n", 1, 7)  # 7: no such card, ignored
    ledger = fed(
        Change("Node", None, gs_node("n", 32, 2)),
        Change("Pod", None, old),
        Change(UNHEALTHY_GPUS_KIND, None, marks),
    )
    # An unhealthy card has no capacity, its users stay.
    assert cards(ledger, "n") == {
        0: (True, True, 16 * GI, 16 * GI),
        1: (True, False, 0, 0),
    }
    assert ledger.holding(old.uid) is not None
    replayed = NodeDeviceLedger.replay([], [old], nodes=[gs_node("n", 32, 2)], unhealthy=[marks])
    assert replayed.snapshot_state() == ledger.snapshot_state()
    # Changed to another card, then deleted: healthy again.
    ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, marks, unhealthy("n", 0)))
    assert [c[1] for c in cards(ledger, "n").values()] == [False, True]
    ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, unhealthy("n", 0), None))
    assert [c[1] for c in cards(ledger, "n").values()] == [True, True]
    verify(ledger)


def test_unhealthy_marks_apply_to_device_crs_and_to_nodes_seen_later() -> None:
    ledger = fed(Change(UNHEALTHY_GPUS_KIND, None, unhealthy("n", 0)))
    assert ledger.row_of("n") is None  # a ConfigMap alone makes no row
    ledger.apply_change(Change("Device", None, device("n", gpu(0, "16Gi"), gpu(1, "16Gi"))))
    assert [c[1] for c in cards(ledger, "n").values()] == [False, True]
    verify(ledger)


def test_unhealthy_configmap_with_bad_entries_is_logged_once_and_the_rest_honoured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    marks = UnhealthyGPUs("n", frozenset({1}), ("gpus: 'x' is not a card index",))
    ledger = fed(
        Change("Node", None, gs_node("n", 32, 2)), Change(UNHEALTHY_GPUS_KIND, None, marks)
    )
    assert [c[1] for c in cards(ledger, "n").values()] == [True, False]
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if "unhealthy-gpu" in ln]
    assert len(lines) == 1 and "'x' is not a card index" in lines[0], lines


def test_hostile_capacity_derives_nothing_or_a_bounded_card_and_is_said_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Anyone who may patch a node's status writes these: 10**9 cards would widen every row
    of the ledger, 10**30 GiB raised OverflowError out of the event handler."""
    wide = gs_node("n", 10**9, 10**9)
    ledger = fed(Change("Node", None, wide), Change("Node", wide, wide))
    assert cards(ledger, "n") == {} and not ledger.has_device("n")
    out = capsys.readouterr()
    said = [ln for ln in (out.out + out.err).splitlines() if "beyond any node" in ln]
    assert len(said) == 1, said
    ledger.apply_change(Change("Node", wide, gs_node("n", 10**30, 1)))
    assert cards(ledger, "n") == {0: (True, True, MAX_AMOUNT, MAX_AMOUNT)}
    verify(ledger)


NODES = ("n0", "n1")
source_ops = st.one_of(
    st.tuples(st.just("capacity"), st.sampled_from(NODES), st.integers(0, 40), st.integers(0, 4)),
    st.tuples(st.just("node-gone"), st.sampled_from(NODES)),
    st.tuples(st.just("cr"), st.sampled_from(NODES), st.lists(st.sampled_from((8, 16)),
                                                              min_size=1, max_size=3)),
    st.tuples(st.just("cr-gone"), st.sampled_from(NODES)),
    st.tuples(st.just("unhealthy"), st.sampled_from(NODES), st.frozensets(st.integers(0, 3))),
    st.tuples(st.just("unhealthy-gone"), st.sampled_from(NODES)),
    st.tuples(st.just("pod"), st.integers(0, 5), st.sampled_from(NODES), st.integers(0, 3),
              st.integers(1, 8)),
    st.tuples(st.just("pod-gone"), st.integers(0, 5)),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(source_ops, max_size=30))
def test_random_sources_keep_invariants_and_rebuild_equals_incremental(
    sequence: list[tuple[Any, ...]],
) -> None:
    """Capacity changes, Device CRs coming and going, unhealthy marks and gpushare pods in any
    order: the ledger's invariants hold after every step, and a rebuild from the objects as
    they are now equals the incremental ledger (a pod never loses its card on the way)."""
    ledger = NodeDeviceLedger(rows=1, cards=1)
    nodes: dict[str, Node] = {}
    crs: dict[str, Any] = {}
    marks: dict[str, UnhealthyGPUs] = {}
    pods: dict[int, Pod] = {}
    for op in sequence:
        kind, *args = op
        if kind == "capacity":
            name, units, count = args
            new = gs_node(name, units, count)
            ledger.apply_change(Change("Node", nodes.get(name), new))
            nodes[name] = new
        elif kind == "node-gone" and args[0] in nodes:
            ledger.apply_change(Change("Node", nodes.pop(args[0]), None))
        elif kind == "cr":
            name, sizes = args
            cr = device(name, *(gpu(m, f"{s}Gi") for m, s in enumerate(sizes)))
            ledger.apply_change(Change("Device", crs.get(name), cr))
            crs[name] = cr
        elif kind == "cr-gone" and args[0] in crs:
            ledger.apply_change(Change("Device", crs.pop(args[0]), None))
        elif kind == "unhealthy":
            new_marks = unhealthy(args[0], *args[1])
            ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, marks.get(args[0]), new_marks))
            marks[args[0]] = new_marks
        elif kind == "unhealthy-gone" and args[0] in marks:
            ledger.apply_change(Change(UNHEALTHY_GPUS_KIND, marks.pop(args[0]), None))
        elif kind == "pod" and args[0] not in pods:
            i, node, idx, units = args
            pods[i] = placed(f"p{i}", node, idx, units)
            ledger.apply_change(Change("Pod", None, pods[i]))
        elif kind == "pod-gone" and args[0] in pods:
            ledger.apply_change(Change("Pod", pods.pop(args[0]), None))
        verify(ledger)
        for pod in pods.values():  # every gpushare pod still holds its memory on its card
            holding = ledger.holding(pod.uid)
            assert holding is not None and holding.node == pod.node_name
    replayed = NodeDeviceLedger.replay(
        crs.values(), pods.values(), nodes=nodes.values(), unhealthy=marks.values()
    )
    assert replayed.snapshot_state() == ledger.snapshot_state()
