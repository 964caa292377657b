"""NodeDeviceLedger: events, reservations, idempotence, Device lifecycle, checkpoints, and a
property test over random sequences (no over-commit, rebuild == incremental)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apis.allocation import ANNOTATION_DEVICE_ALLOCATED, DeviceAllocation, encode_allocations
from apis.checkpoint import PodDeviceEntry, encode_devices_checkpoints
from apis.core import Pod
from apis.device import ANNOTATION_DEVICES_CHECKPOINTS, Device
from apis.partition import ANNOTATION_GPU_PARTITIONS, POLICY_HONOR
from apis.topology import ANNOTATION_GPU_TOPOLOGY
from scheduler.devices.allocator import allocate
from scheduler.devices.ledger import NodeDeviceLedger, _Table
from scheduler.devices.request import (
    RESERVED,
    CardUse,
    Holding,
    parse_request,
    uses_from_annotation,
)
from scheduler.devices.scoring import Scorer
from scheduler.devices.topology import NodeMeta
from scheduler.framework.events import Change
from tests.unit.devices.helpers import (
    GI,
    bound,
    device,
    gpu,
    gpu_pod,
    gpus,
    hopper_table,
    ledger_of,
    nic,
    pairs_topology,
    topology_node,
    verify,
)

HALF = ('{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50",'
        '"koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}')
HALF_USE = CardUse.of("gpu", 1, {"koordinator.sh/gpu-core": 50,
                                 "koordinator.sh/gpu-memory": 40 * GI,
                                 "koordinator.sh/gpu-memory-ratio": 50})


def card(ledger: NodeDeviceLedger, node: str, minor: int, device_type: str = "gpu"
         ) -> dict[str, Any]:
    cards: dict[int, Any] = ledger.snapshot_state()["nodes"][node]["cards"][device_type]
    return dict(cards[minor])


def used(ledger: NodeDeviceLedger, node: str, minor: int) -> tuple[int, ...]:
    return tuple(card(ledger, node, minor)["used"])


def test_device_add_sets_totals_and_unhealthy_is_zero() -> None:
    ledger = ledger_of([device("n", gpu(0, "16Gi"), gpu(1, health=False), nic("rdma", 0))])
    assert card(ledger, "n", 0)["total"] == (100, 100, 16 * GI)
    assert card(ledger, "n", 1)["total"] == (0, 0, 0)
    assert card(ledger, "n", 1)["exists"] and not card(ledger, "n", 1)["healthy"]
    assert card(ledger, "n", 0, "rdma")["total"] == (100,)
    verify(ledger)


POD_EVENTS: list[Any] = [
    pytest.param("delete", (0, 0, 0), id="deleted-releases"),
    pytest.param("succeeded", (0, 0, 0), id="succeeded-releases"),
    pytest.param("failed", (0, 0, 0), id="failed-releases"),
    pytest.param("no-annotation", (0, 0, 0), id="annotation-removed-releases"),
    pytest.param("terminating", (50, 50, 40 * GI), id="terminating-still-holds"),
    pytest.param("unassigned", (50, 50, 40 * GI), id="unassigned-update-ignored"),
]


@pytest.mark.parametrize(("event", "want"), POD_EVENTS)
def test_pod_events(event: str, want: tuple[int, ...]) -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    raw = dict(pod.raw)
    if event == "delete":
        ledger.apply_change(Change("Pod", pod, None))
    else:
        if event in ("succeeded", "failed"):
            raw["status"] = {"phase": event.capitalize()}
        elif event == "no-annotation":
            raw["metadata"] = {**raw["metadata"], "annotations": {}}
        elif event == "terminating":
            raw["metadata"] = {**raw["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}
        else:
            raw["spec"] = {**raw["spec"], "nodeName": ""}
        from apis.core import decode_pod

        ledger.apply_change(Change("Pod", pod, decode_pod(raw)))
    assert used(ledger, "n", 1) == want
    verify(ledger)


def test_reserve_then_bind_event_counts_once() -> None:
    ledger = ledger_of([gpus("n", 2)])
    holding = ledger.reserve("default/p", "n", [HALF_USE], HALF)
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger.apply_change(Change("Pod", None, pod))
    ledger.apply_change(Change("Pod", pod, pod))
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    assert ledger.snapshot_state()["holders"]["default/p"][1] == "annotation"
    ledger.unreserve(holding)  # a late unreserve must not drop the bound pod's devices
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    verify(ledger)


def test_bind_event_with_equivalent_text_counts_once() -> None:
    ledger = ledger_of([gpus("n", 2)])
    ledger.reserve("default/p", "n", [HALF_USE], "")
    reordered = json.dumps({"gpu": [{"resources": {"koordinator.sh/gpu-memory-ratio": "50",
                                                   "koordinator.sh/gpu-core": "50",
                                                   "koordinator.sh/gpu-memory": "40Gi"},
                                     "minor": 1}]})
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", reordered)
    ledger.apply_change(Change("Pod", None, pod))
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)
    verify(ledger)


def test_bind_elsewhere_replaces_reservation() -> None:
    ledger = ledger_of([gpus("a", 2), gpus("b", 2)])
    holding = ledger.reserve("default/p", "a", [HALF_USE], HALF)
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "b", HALF)
    ledger.apply_change(Change("Pod", None, pod))
    assert used(ledger, "a", 1) == (0, 0, 0)
    assert used(ledger, "b", 1) == (50, 50, 40 * GI)
    ledger.unreserve(holding)
    assert used(ledger, "b", 1) == (50, 50, 40 * GI)
    verify(ledger)


def test_unreserve_and_release_reservation() -> None:
    ledger = ledger_of([gpus("n", 2)])
    holding = ledger.reserve("u1", "n", [HALF_USE])
    ledger.unreserve(holding)
    assert used(ledger, "n", 1) == (0, 0, 0)
    ledger.reserve("u2", "n", [HALF_USE])
    ledger.release_reservation("u2")
    assert used(ledger, "n", 1) == (0, 0, 0)
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u3"), "n", HALF)
    ledger.apply_change(Change("Pod", None, pod))
    ledger.release_reservation("u3")  # not a reservation: kept
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)


def test_uid_change_under_same_name_releases_old() -> None:
    old = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u1"), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [old])
    new = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}).uid("u2"), "n")
    ledger.apply_change(Change("Pod", old, new))
    assert used(ledger, "n", 1) == (0, 0, 0)
    assert ledger.snapshot_state()["holders"] == {}


def test_unhealthy_keeps_usage_and_recovers() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    ledger.apply_change(Change("Device", gpus("n", 2), device("n", gpu(0), gpu(1, health=False))))
    c = card(ledger, "n", 1)
    assert c["total"] == (0, 0, 0) and c["used"] == (50, 50, 40 * GI) and c["free"] == (0, 0, 0)
    ledger.apply_change(Change("Device", None, gpus("n", 2)))
    assert card(ledger, "n", 1)["free"] == (50, 50, 40 * GI)
    verify(ledger)


def test_device_deleted_and_recreated_keeps_usage() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    crd = gpus("n", 2)
    ledger = ledger_of([crd], [pod])
    ledger.apply_change(Change("Device", crd, None))
    state = ledger.snapshot_state()["nodes"]["n"]
    assert not state["device"]
    assert list(state["cards"]["gpu"]) == [1]  # only the held card remains, unusable
    c = card(ledger, "n", 1)
    assert not c["exists"] and c["total"] == (0, 0, 0) and c["used"] == (50, 50, 40 * GI)
    assert not ledger.has_device("n")
    ledger.apply_change(Change("Device", None, crd))
    c = card(ledger, "n", 1)
    assert c["exists"] and c["free"] == (50, 50, 40 * GI)
    verify(ledger)
    assert ledger.snapshot_state() == NodeDeviceLedger.replay([crd], [pod]).snapshot_state()


def test_usage_of_a_card_missing_from_the_device() -> None:
    alloc = HALF.replace('"minor":1', '"minor":7')
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", alloc)
    ledger = ledger_of([gpus("n", 2)], [pod])
    c = card(ledger, "n", 7)
    assert not c["exists"] and c["used"] == (50, 50, 40 * GI)
    verify(ledger)


def _checkpoint(*ids: str) -> dict[str, str]:
    entries = [PodDeviceEntry("pod-x", "c", "nvidia.com/gpu", ids)]
    return {ANNOTATION_DEVICES_CHECKPOINTS: encode_devices_checkpoints(entries)}


def test_checkpoint_devices_count_as_fully_used() -> None:
    crd = device("n", gpu(0), gpu(1), gpu(2), annotations=_checkpoint("GPU-1", "GPU-9"))
    ledger = ledger_of([crd])
    assert used(ledger, "n", 1) == (100, 100, 80 * GI)
    assert card(ledger, "n", 1)["free"] == (0, 0, 0)
    assert used(ledger, "n", 0) == (0, 0, 0)
    ledger.apply_change(Change("Device", crd, device("n", gpu(0), gpu(1), gpu(2))))
    assert used(ledger, "n", 1) == (0, 0, 0)
    verify(ledger)


def test_malformed_annotations_are_counted_not_raised() -> None:
    crd = device("n", gpu(0), annotations={ANNOTATION_DEVICES_CHECKPOINTS: "[{"})
    bad = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", '{"gpu":[{"minor":"x"}]}')
    ledger = ledger_of([crd], [bad])
    assert ledger.annotation_errors == 2
    assert used(ledger, "n", 0) == (0, 0, 0)
    verify(ledger)


def test_malformed_annotation_keeps_our_reservation() -> None:
    ledger = ledger_of([gpus("n", 2)])
    ledger.reserve("default/p", "n", [HALF_USE], HALF)
    bad = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", "not json")
    ledger.apply_change(Change("Pod", None, bad))
    assert ledger.annotation_errors == 1
    assert used(ledger, "n", 1) == (50, 50, 40 * GI)


def test_unknown_types_and_resources_are_ignored() -> None:
    raw = ('{"xpu":[{"minor":0,"resources":{"x":"1"}}],"rdma":[{"minor":0,"resources":'
           '{"koordinator.sh/rdma":"10","other":"5"}}]}')
    assert uses_from_annotation(raw) == (CardUse.of("rdma", 0, {"koordinator.sh/rdma": 10}),)


def test_grows_rows_and_cards() -> None:
    devices = [gpus(f"n{i}", 1 + i % 12) for i in range(40)]
    ledger = ledger_of(devices)
    assert ledger.n_rows == 40
    assert ledger.table("gpu").cards >= 12
    verify(ledger)
    assert ledger.snapshot_state() == NodeDeviceLedger.replay(devices, []).snapshot_state()


def test_node_view_overlay_releases_removed_holdings() -> None:
    pod = bound(gpu_pod("p", {"koordinator.sh/gpu": 50}), "n", HALF)
    ledger = ledger_of([gpus("n", 2)], [pod])
    holding = ledger.holding(pod.uid)
    assert holding is not None
    view = ledger.node_view("n", ["gpu"], [holding])
    assert view.cards["gpu"][1].free == (100, 100, 80 * GI)
    assert ledger.node_view("n", ["gpu"]).cards["gpu"][1].free == (50, 50, 40 * GI)


# ---------------------------------------------------------------------------------------------
# Property: random sequences of device updates, reserves, unreserves, binds and deletions.

NODES = ["n0", "n1", "n2"]
MINORS = range(5)
REQUESTS: list[dict[str, Any]] = [
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
    {"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory": "4Gi"},
    {"koordinator.sh/gpu-memory": "10Gi"},
    {"koordinator.sh/gpu.shared": 2, "koordinator.sh/gpu-memory-ratio": 60},
    {"koordinator.sh/rdma": 30},
]


def _device(node: str, present: frozenset[int], sick: frozenset[int],
            kubelet: frozenset[int] = frozenset()) -> Device:
    cards = [gpu(m, f"{(16, 40, 80)[(NODES.index(node) + m) % 3]}Gi", health=m not in sick)
             for m in sorted(present)]
    cards += [nic("rdma", m, health=m not in sick) for m in sorted(present) if m < 2]
    annotations = None
    if kubelet:
        entries = [PodDeviceEntry("kubelet-pod", "c", "nvidia.com/gpu",
                                  tuple(f"GPU-{m}" for m in sorted(kubelet)))]
        annotations = {ANNOTATION_DEVICES_CHECKPOINTS: encode_devices_checkpoints(entries)}
    return device(node, *cards, annotations=annotations)


ops = st.one_of(
    st.tuples(st.just("device"), st.sampled_from(NODES), st.frozensets(st.sampled_from(MINORS)),
              st.frozensets(st.sampled_from(MINORS)), st.frozensets(st.sampled_from(MINORS))),
    st.tuples(st.just("repeat"), st.integers(0, 7)),
    st.tuples(st.just("delete_device"), st.sampled_from(NODES)),
    st.tuples(st.just("reserve"), st.integers(0, 7), st.sampled_from(NODES),
              st.integers(0, len(REQUESTS) - 1)),
    st.tuples(st.just("unreserve"), st.integers(0, 7)),
    st.tuples(st.just("bind"), st.integers(0, 7)),
    st.tuples(st.just("delete_pod"), st.integers(0, 7)),
    st.tuples(st.just("terminal"), st.integers(0, 7)),
    st.tuples(st.just("malformed"), st.integers(0, 7), st.sampled_from(NODES)),
)


class _Model:
    """The cluster the ledger watches, plus our open reservations."""

    def __init__(self) -> None:
        self.ledger = NodeDeviceLedger(rows=1, cards=1)
        self.devices: dict[str, Device] = {}
        self.pods: dict[str, Pod] = {}
        self.reserved: dict[str, tuple[Pod, Holding]] = {}
        self.scorer = Scorer()
        self.versions: dict[str, tuple[int, Any]] = {}

    def emit(self, kind: str, old: Any, new: Any) -> None:
        self.ledger.apply_change(Change(kind, old, new))

    def step(self, op: tuple[Any, ...]) -> None:
        name = op[0]
        if name == "device":
            d = _device(op[1], op[2], op[3], op[4])
            self.emit("Device", self.devices.get(op[1]), d)
            self.devices[op[1]] = d
        elif name == "delete_device" and op[1] in self.devices:
            self.emit("Device", self.devices.pop(op[1]), None)
        elif name == "reserve":
            self._reserve(f"p{op[1]}", op[2], REQUESTS[op[3]])
        elif name == "unreserve" and f"p{op[1]}" in self.reserved:
            _, holding = self.reserved.pop(f"p{op[1]}")
            self.ledger.unreserve(holding)
        elif name == "bind" and f"p{op[1]}" in self.reserved:
            self._bind(f"p{op[1]}")
        elif name == "delete_pod":
            reserved = self.reserved.pop(f"p{op[1]}", None)
            if reserved is not None:  # deleted while its bind is in flight
                self.emit("Pod", reserved[0], None)
            pod = self.pods.pop(f"default/p{op[1]}", None)
            if pod is not None:
                self.emit("Pod", pod, None)
        elif name == "terminal" and f"default/p{op[1]}" in self.pods:
            old = self.pods[f"default/p{op[1]}"]
            new = dataclasses.replace(old, phase="Succeeded")
            self.pods[old.key] = new
            self.emit("Pod", old, new)
        elif name == "repeat" and f"default/p{op[1]}" in self.pods:
            # The same pod event again (a relist, a resync): idempotent by uid.
            before = self.ledger.snapshot_state()
            pod = self.pods[f"default/p{op[1]}"]
            self.emit("Pod", pod, pod)
            assert self.ledger.snapshot_state() == before
        elif name == "malformed" and f"p{op[1]}" not in self.reserved:
            pod = bound(gpu_pod(f"p{op[1]}", {"nvidia.com/gpu": 1}), op[2], '{"gpu":3}')
            self.emit("Pod", self.pods.get(pod.key), pod)
            self.pods[pod.key] = pod

    def _reserve(self, name: str, node: str, requests: dict[str, Any]) -> None:
        if name in self.reserved or f"default/{name}" in self.pods:
            return
        pod = gpu_pod(name, requests).build()
        request = parse_request(pod)
        assert request is not None
        view = self.ledger.node_view(node, request.device_types)
        uses = allocate(view, request, self.scorer)
        if isinstance(uses, list):
            holding = self.ledger.reserve(pod.uid, node, uses)
            self.reserved[name] = (pod, holding)
            for use in uses:  # what we took fitted: no card is over-committed
                c = card(self.ledger, node, use.minor, use.device_type)
                assert all(u <= t for u, t in zip(c["used"], c["total"], strict=True)), c

    def _bind(self, name: str) -> None:
        pod, holding = self.reserved.pop(name)
        allocations: dict[str, list[DeviceAllocation]] = {}
        for use in holding.uses:
            allocations.setdefault(use.device_type, []).append(
                DeviceAllocation.from_ints(use.minor, dict(use.resources)))
        text = encode_allocations(allocations)
        raw = dict(pod.raw)
        raw["metadata"] = {**raw["metadata"],
                           "annotations": {ANNOTATION_DEVICE_ALLOCATED: text}}
        raw["spec"] = {**raw["spec"], "nodeName": holding.node}
        from apis.core import decode_pod

        new = decode_pod(raw)
        self.pods[new.key] = new
        self.emit("Pod", None, new)

    def check(self) -> None:
        verify(self.ledger)
        state = self.ledger.snapshot_state()
        kubelet = {(n, u.device_type, u.minor) for n, _, uses in state["checkpoints"].values()
                   for u in uses}
        for name, node in state["nodes"].items():
            row = self.ledger.row_of(name)
            assert row is not None
            # Readers cache per row: a row whose picture changed has a new version.
            seen = self.versions.get(name)
            if seen is not None and seen[1] != node:
                assert int(self.ledger.row_version[row]) != seen[0], name
            self.versions[name] = (int(self.ledger.row_version[row]), node)
            for device_type, cards in node["cards"].items():
                for minor, c in cards.items():
                    # A card the kubelet gave away under one of our pods is the world's
                    # over-commit, not ours (``_reserve`` checks what we take).
                    if c["healthy"] and (name, device_type, minor) not in kubelet:
                        assert all(u <= t for u, t in zip(c["used"], c["total"], strict=True)), c
                        assert all(u + f == t for u, f, t in
                                   zip(c["used"], c["free"], c["total"], strict=True)), c
        reservations = [h for _, h in self.reserved.values()]
        assert all(h.source == RESERVED for h in reservations)
        rebuilt = NodeDeviceLedger.replay(self.devices.values(), self.pods.values(), reservations)
        assert rebuilt.snapshot_state() == state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=40))
def test_random_sequences_keep_invariants(sequence: list[tuple[Any, ...]]) -> None:
    model = _Model()
    for op in sequence:
        model.step(op)
        model.check()


# -- the node's GPU meta: interconnect, partition table, policy ---------------------------------


def test_node_meta_is_decoded_once_per_device_and_follows_it() -> None:
    topo = pairs_topology(4)
    crd = topology_node("n", 4, topo, hopper_table(4), POLICY_HONOR)
    ledger = ledger_of([crd, gpus("plain", 2)])
    row = ledger.row_of("n")
    meta = ledger.node_meta("n")
    assert meta.gpu_topology == topo and meta.honor_partitions
    assert meta.partitions == hopper_table(4)
    assert ledger.node_view("n", ("gpu",)).meta is meta
    assert ledger.topology_rows == ledger.table_rows == ledger.honor_rows == {row}
    assert ledger.node_meta("plain") == NodeMeta() and not ledger.node_meta("missing").gpu_topology
    # The Device drops its table and label: the node follows; deleted: nothing is left.
    ledger.apply_change(Change("Device", crd, topology_node("n", 4, topo)))
    assert ledger.table_rows == ledger.honor_rows == set() and ledger.topology_rows == {row}
    ledger.apply_change(Change("Device", crd, None))
    assert ledger.topology_rows == set() and ledger.node_meta("n") == NodeMeta()


def test_malformed_topology_and_table_are_counted_and_ignored() -> None:
    crd = device(
        "n", gpu(0),
        annotations={
            ANNOTATION_GPU_TOPOLOGY: "{",
            ANNOTATION_GPU_PARTITIONS: '{"2":[{"minors":[0]}]}',
        },
    )
    ledger = ledger_of([crd])
    assert ledger.annotation_errors == 2
    assert ledger.node_meta("n") == NodeMeta()
    assert ledger.topology_rows == ledger.table_rows == set()


@given(
    st.integers(1, 3).flatmap(
        lambda n_res: st.tuples(
            st.just(n_res),
            st.lists(st.integers(0, 200), min_size=n_res * 8, max_size=n_res * 8),
            st.lists(st.integers(0, 300), min_size=n_res * 8, max_size=n_res * 8),
            st.lists(st.integers(0, 300), min_size=n_res * 8, max_size=n_res * 8),
            st.sets(st.integers(0, 7), min_size=1),
        )
    )
)
def test_refreshing_only_the_changed_cards_equals_the_full_refresh(
    case: tuple[int, list[int], list[int], list[int], set[int]],
) -> None:
    """``_Table.refresh_used`` (a holding's cards, totals unchanged) leaves free, share and the
    row's sums exactly as the general ``refresh`` does."""
    n_res, totals, used_before, used_after, changed = case
    tables = [_Table(n_res, 2, 8) for _ in range(2)]
    for tbl in tables:
        tbl.total[:, 1, :] = np.array(totals).reshape(n_res, 8)
        tbl.used[:, 1, :] = np.array(used_before).reshape(n_res, 8)
        tbl.refresh(1, range(8))
        for col in changed:
            tbl.used[:, 1, col] = np.array(used_after).reshape(n_res, 8)[:, col]
    full, fast = tables
    full.refresh(1, sorted(changed))
    fast.refresh_used(1, sorted(changed))
    for name in ("free", "share", "sum_total", "sum_alloc"):
        assert np.array_equal(getattr(full, name), getattr(fast, name)), name
