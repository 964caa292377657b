"""The replay's meter: allocated, fragmented (against the definition) and occupied."""

from __future__ import annotations

import pytest

from apis.core import decode_node
from apis.device import Device
from scheduler.plugins.gpufragmentation.measure import PodShape, Workload, node_fragmentation
from scheduler.simulator.fragmentation import FragmentationMeter
from scheduler.simulator.trace import TraceNode, device_object, node_object

SHAPES = {PodShape(4000, 500, 1): 0.5, PodShape(8000, 1000, 1): 0.3, PodShape(2000): 0.2}
NODES = [
    TraceNode("a", 16000, 1024, 2, "T4"),
    TraceNode("b", 96000, 1024, 8, "G2"),
    TraceNode("c", 64000, 1024, 0, ""),
]


def _meter() -> FragmentationMeter:
    devices = {}
    for n in NODES:
        obj = device_object(n)
        if obj is not None:
            devices[n.name] = Device.from_dict(obj)
    return FragmentationMeter(
        [decode_node(node_object(n)) for n in NODES], devices, Workload.of(SHAPES)
    )


def test_empty_cluster() -> None:
    meter = _meter()
    assert meter.capacity_milli == 10_000
    assert (meter.allocated_milli, meter.occupied_nodes) == (0, 0)
    # Only the cpu-only shape (0.2) sees idle GPUs as fragments on an empty cluster.
    assert meter.fragmented_milli == pytest.approx(0.2 * 10_000)


@pytest.mark.parametrize(
    ("placements", "allocated", "occupied", "cards"),
    [
        pytest.param([("a", 4000, [(0, 50, 50)])], 500, 1, {"a": [500, 1000]}, id="share"),
        pytest.param(
            [("a", 4000, [(0, 50, 50)]), ("a", 8000, [(1, 100, 100)])],
            1500,
            1,
            {"a": [500, 0]},
            id="share-then-whole",
        ),
        pytest.param([("c", 2000, [])], 0, 1, {}, id="cpu-only-on-a-cpu-node"),
        pytest.param(
            [("b", 32000, [(m, 100, 100) for m in range(4)]), ("a", 12000, [])],
            4000,
            2,
            {"a": [1000, 1000], "b": [0] * 4 + [1000] * 4},
            id="two-nodes",
        ),
    ],
)
def test_placements(
    placements: list[tuple[str, int, list[tuple[int, int, int]]]],
    allocated: int,
    occupied: int,
    cards: dict[str, list[int]],
) -> None:
    meter = _meter()
    for node, cpu, uses in placements:
        meter.place(node, cpu, uses)
    assert (meter.allocated_milli, meter.occupied_nodes) == (allocated, occupied)
    cpu_used = {n.name: 0 for n in NODES}
    for node, cpu, _ in placements:
        cpu_used[node] += cpu
    expected = 0.0
    for n in NODES:
        free = cards.get(n.name, [1000] * n.gpus)
        expected += node_fragmentation(n.cpu_milli - cpu_used[n.name], free, n.model, SHAPES)
    assert meter.fragmented_milli == pytest.approx(expected)
