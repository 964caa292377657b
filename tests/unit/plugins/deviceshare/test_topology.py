"""DeviceShare on nodes with a GPU interconnect and partition tables: the whole-cluster Filter
refines nodes that honor tables, and the node Score prefers well-connected free cards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.core import Pod
from apis.partition import ANNOTATION_GPU_PARTITION_SPEC, POLICY_HONOR
from scheduler.devices.partitions import ERR_INSUFFICIENT_PARTITIONED
from scheduler.framework.status import Code
from tests.unit.devices.helpers import (
    GI,
    bound,
    gpu_alloc,
    gpu_pod,
    hopper_table,
    info,
    nvswitch_topology,
    pairs_topology,
    plugin_of,
    prefilter,
    topology_node,
)


def used(node: str, *minors: int) -> list[Pod]:
    return [
        bound(gpu_pod(f"{node}-{m}", {"nvidia.com/gpu": 1}), node, gpu_alloc(m, 100, 80 * GI, 100))
        for m in minors
    ]


@pytest.mark.parametrize(
    ("gpus", "annotations", "want"),
    [
        pytest.param(4, {}, [False, True, True], id="honor-node-refined"),
        pytest.param(2, {}, [True, True, True], id="pairs-fit-everywhere"),
        pytest.param(4, {ANNOTATION_GPU_PARTITION_SPEC: "{}"}, [False, False, True],
                     id="spec-needs-a-table"),
    ],
)
def test_filter_forms_agree(gpus: int, annotations: dict[str, str], want: list[bool]) -> None:
    # honor: cards 1 and 4 used, so no 4-card block is free though 6 cards are;
    # prefer: same cards used, no table; free: an idle Hopper box with its table.
    nodes = [
        topology_node("honor", 8, nvswitch_topology(8), hopper_table(), POLICY_HONOR),
        topology_node("prefer", 8, nvswitch_topology(8)),
        topology_node("free", 8, nvswitch_topology(8), hopper_table()),
    ]
    plugin, snapshot = plugin_of(nodes, used("honor", 1, 4) + used("prefer", 1, 4))
    pod = gpu_pod("p", {"nvidia.com/gpu": gpus}, annotations).build()
    state, status = prefilter(plugin, pod)
    assert status is None
    mask = plugin.filter_nodes(state, pod, snapshot)
    per_node = [
        plugin.filter(state, pod, info(snapshot, n.name)) is None for n in nodes
    ]
    assert mask.tolist() == per_node == want


def test_filter_reasons_leave_honoring_nodes_to_filter() -> None:
    nodes = [
        topology_node("honor", 8, nvswitch_topology(8), hopper_table(), POLICY_HONOR),
        topology_node("plain", 2),
    ]
    plugin, snapshot = plugin_of(nodes, used("honor", 1, 4))
    pod = gpu_pod("p", {"nvidia.com/gpu": 4}).build()
    state, _ = prefilter(plugin, pod)
    codes, statuses = plugin.filter_reasons(state, pod, snapshot, snapshot.live_slots())
    assert codes.tolist()[0] == -1
    assert statuses[codes.tolist()[1]].reasons == ("Insufficient gpu devices",)
    status = plugin.filter(state, pod, info(snapshot, "honor"))
    assert status is not None and status.code == Code.UNSCHEDULABLE
    assert status.reasons == (ERR_INSUFFICIENT_PARTITIONED,)


def test_score_prefers_the_node_whose_free_cards_are_connected() -> None:
    # Both nodes have 2 of 4 cards free; "paired" has a free NVLink pair (2,3), "scattered"
    # has 0 and 2 (PCIe across sockets: System). "unknown" publishes no interconnect.
    nodes = [
        topology_node("scattered", 4, pairs_topology(4)),
        topology_node("paired", 4, pairs_topology(4)),
        topology_node("unknown", 4),
    ]
    plugin, snapshot = plugin_of(
        nodes, used("scattered", 1, 3) + used("paired", 0, 1) + used("unknown", 0, 1)
    )
    pod = gpu_pod("p", {"nvidia.com/gpu": 2}).build()
    state, _ = prefilter(plugin, pod)
    slots = snapshot.live_slots()
    scores = plugin.score_nodes(state, pod, snapshot, slots).tolist()
    per_node = [plugin.score(state, pod, info(snapshot, n.name)) for n in nodes]
    assert scores == per_node
    base = per_node[2]  # no interconnect: the plain LeastAllocated score
    # NVLink 12 links ranks 70 + 30 * 12 // 18 = 90; the PCIe pair across sockets 10.
    assert per_node[:2] == [(base + 10) // 2, (base + 90) // 2]
    # Reserve gives the pair the Score step saw.
    assert plugin.reserve(state, pod, "paired") is None
    entry = plugin.entry(state)
    assert entry is not None and entry.holding is not None
    assert sorted(u.minor for u in entry.holding.uses) == [2, 3]


def test_single_card_scores_are_unchanged() -> None:
    nodes = [topology_node("a", 4, pairs_topology(4)), topology_node("b", 4)]
    plugin, snapshot = plugin_of(nodes)
    pod = gpu_pod("p", {"nvidia.com/gpu": 1}).build()
    state, _ = prefilter(plugin, pod)
    scores = plugin.score_nodes(state, pod, snapshot, snapshot.live_slots())
    assert np.unique(scores).size == 1


def test_outcome_cache_follows_the_ledger() -> None:
    # One node with the NVLink pair (2,3) and card 5 free; the first pod takes the pair.
    nodes = [topology_node("n", 6, pairs_topology(6))]
    plugin, snapshot = plugin_of(nodes, used("n", 0, 1, 4))
    slots = snapshot.live_slots()
    first = gpu_pod("a", {"nvidia.com/gpu": 2}).uid("uid-a").build()
    state, _ = prefilter(plugin, first)
    before = plugin.score_nodes(state, first, snapshot, slots).tolist()
    assert plugin.reserve(state, first, "n") is None
    entry = plugin.entry(state)
    assert entry is not None and entry.holding is not None
    assert sorted(u.minor for u in entry.holding.uses) == [2, 3]
    second = gpu_pod("b", {"nvidia.com/gpu": 2}).uid("uid-b").build()
    state2, _ = prefilter(plugin, second)
    # Only card 5 is free now: allocate fails, the score is the plain one (not the cached 90).
    after = plugin.score_nodes(state2, second, snapshot, slots).tolist()
    assert after == [plugin.score(state2, second, info(snapshot, "n"))]
    assert not plugin.filter_nodes(state2, second, snapshot).any()
    assert before != after


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["pairs", "switch", "none"]),
            st.booleans(),  # table
            st.booleans(),  # Honor
            st.sets(st.integers(0, 7), max_size=6),  # cards in use
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 4),
    st.sampled_from([None, "{}", '{"allocatePolicy":"Restricted","ringBusBandwidth":"400G"}']),
)
def test_both_forms_agree_on_random_topology_clusters(
    specs: list[tuple[str, bool, bool, set[int]]], count: int, spec: str | None
) -> None:
    nodes, pods = [], []
    for i, (kind, table, honor, busy) in enumerate(specs):
        topology = {"pairs": pairs_topology(8), "switch": nvswitch_topology(8), "none": None}[kind]
        nodes.append(topology_node(f"n{i}", 8, topology, hopper_table() if table else None,
                                   POLICY_HONOR if honor else None))
        pods += used(f"n{i}", *sorted(busy))
    plugin, snapshot = plugin_of(nodes, pods)
    annotations = {} if spec is None else {ANNOTATION_GPU_PARTITION_SPEC: spec}
    pod = gpu_pod("p", {"nvidia.com/gpu": count}, annotations).build()
    state, status = prefilter(plugin, pod)
    assert status is None
    mask = plugin.filter_nodes(state, pod, snapshot).tolist()
    per_node = [plugin.filter(state, pod, info(snapshot, n.name)) is None for n in nodes]
    assert mask == per_node
    slots = snapshot.live_slots()
    fresh, _ = prefilter(plugin, pod)  # a new cycle: the per-node form computes from scratch
    scores = plugin.score_nodes(state, pod, snapshot, slots).tolist()
    assert scores == [plugin.score(fresh, pod, info(snapshot, n.name)) for n in nodes]
