"""GPU partition tables in the allocator (scheduler.devices.partitions through ``allocate``):
Honor/Prefer, Restricted/BestEffort, ringBusBandwidth, best score that fits, bin packing."""

from __future__ import annotations

from typing import Any

import pytest

from apis.device import Device
from apis.partition import (
    ANNOTATION_GPU_PARTITION_SPEC,
    POLICY_HONOR,
    POLICY_PREFER,
    GPUPartition,
    PartitionTable,
)
from apis.quantity import Quantity
from scheduler.devices.allocator import allocate
from scheduler.devices.partitions import (
    ERR_INSUFFICIENT_PARTITIONED,
    ERR_MISSING_PARTITION_TABLE,
    ERR_UNSUPPORTED_GPU_COUNT,
)
from scheduler.devices.request import RequestError, parse_request
from scheduler.devices.scoring import Scorer
from scheduler.framework.status import Code, Status
from tests.unit.devices.helpers import (
    GI,
    bound,
    gpu_alloc,
    gpu_pod,
    hopper_table,
    ledger_of,
    nvswitch_topology,
    topology_node,
)

HOPPER = hopper_table(8)
# Four cards; pairs (0,3) and (1,2) are the best (score 2, 600G), (0,1) and (2,3) next (score 1,
# 300G); one 4-card partition.
SCORED = PartitionTable(
    {
        2: (
            GPUPartition((0, 3), "NVLink", Quantity.parse("600G"), 2),
            GPUPartition((1, 2), "NVLink", Quantity.parse("600G"), 2),
            GPUPartition((0, 1), "NVLink", Quantity.parse("300G"), 1),
            GPUPartition((2, 3), "NVLink", Quantity.parse("300G"), 1),
        ),
        4: (GPUPartition((0, 1, 2, 3), "NVLink", Quantity.parse("300G"), 1),),
    }
)


def run(
    node: Device,
    used: list[int],
    gpus: int | dict[str, Any],
    spec: str | None = None,
) -> list[int] | Status:
    pods = [
        bound(gpu_pod(f"e{m}", {"nvidia.com/gpu": 1}), node.name, gpu_alloc(m, 100, 80 * GI, 100))
        for m in used
    ]
    ledger = ledger_of([node], pods)
    requests = {"nvidia.com/gpu": gpus} if isinstance(gpus, int) else gpus
    annotations = {} if spec is None else {ANNOTATION_GPU_PARTITION_SPEC: spec}
    request = parse_request(gpu_pod("p", requests, annotations).build())
    assert request is not None
    got = allocate(ledger.node_view(node.name, request.device_types), request, Scorer())
    return got if isinstance(got, Status) else [u.minor for u in got]


def status(code: Code, reason: str) -> tuple[Code, tuple[str, ...]]:
    return code, (reason,)


def outcome(got: list[int] | Status) -> object:
    return (got.code, got.reasons) if isinstance(got, Status) else got


UNRESOLVABLE, UNSCHEDULABLE = Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.UNSCHEDULABLE


@pytest.mark.parametrize(
    ("node", "used", "gpus", "spec", "want"),
    [
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [], 2, None,
            [0, 1], id="honor-idle-lowest-partition",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [0], 2, None,
            [2, 3], id="honor-packs-next-to-used-card",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [5], 4, None,
            [0, 1, 2, 3], id="honor-four-in-the-free-half",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [1, 4], 4, None,
            status(UNSCHEDULABLE, ERR_INSUFFICIENT_PARTITIONED), id="honor-none-fits",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [], 3, None,
            status(UNRESOLVABLE, ERR_UNSUPPORTED_GPU_COUNT), id="honor-size-not-in-table",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), None, POLICY_HONOR), [], 2, None,
            status(UNRESOLVABLE, ERR_MISSING_PARTITION_TABLE), id="honor-without-table",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR),
            [0, 1, 2, 3, 4, 5, 6], 3, None,
            status(UNRESOLVABLE, ERR_UNSUPPORTED_GPU_COUNT), id="honor-reason-before-count",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR),
            [0, 1, 2, 3, 4, 5, 6], 2, None,
            status(UNSCHEDULABLE, ERR_INSUFFICIENT_PARTITIONED), id="honor-too-few-free",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_PREFER), [1, 4], 4, None,
            [2, 3, 6, 7], id="prefer-none-fits-usual-choice",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, None), [], 3, None,
            [0, 1, 2], id="prefer-size-not-in-table-usual-choice",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, None), [0], 2, None,
            [2, 3], id="prefer-table-first",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [], 2, None,
            [0, 3], id="best-score-first",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [3], 2, None,
            [1, 2], id="best-score-that-fits",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [0, 1], 2, None,
            [2, 3], id="prefer-falls-to-next-score",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [0, 1], 2,
            '{"allocatePolicy":"BestEffort"}', [2, 3], id="best-effort-next-score",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [0, 1], 2,
            '{"allocatePolicy":"Restricted"}',
            status(UNSCHEDULABLE, ERR_INSUFFICIENT_PARTITIONED), id="restricted-best-score-only",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [], 2,
            '{"allocatePolicy":"BestEffort","ringBusBandwidth":"500G"}', [0, 3],
            id="bandwidth-met",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [0, 1], 2,
            '{"ringBusBandwidth":"500G"}', status(UNSCHEDULABLE, ERR_INSUFFICIENT_PARTITIONED),
            id="bandwidth-not-met-by-free-partitions",
        ),
        pytest.param(
            topology_node("n", 4, None, SCORED, None), [], 4,
            '{"allocatePolicy":"Restricted","ringBusBandwidth":"400G"}',
            status(UNSCHEDULABLE, ERR_INSUFFICIENT_PARTITIONED), id="restricted-bandwidth",
        ),
        pytest.param(
            topology_node("n", 4, None, None, None), [], 2, "{}",
            status(UNRESOLVABLE, ERR_MISSING_PARTITION_TABLE), id="spec-honors-on-any-node",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [],
            {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}, None,
            [0], id="shared-gpu-ignores-partitions",
        ),
        pytest.param(
            topology_node("n", 8, nvswitch_topology(8), HOPPER, POLICY_HONOR), [0, 1, 2], 1,
            None, [3], id="honor-single-card-packs",
        ),
    ],
)
def test_partition_choice(
    node: Device, used: list[int], gpus: int | dict[str, Any], spec: str | None, want: object
) -> None:
    assert outcome(run(node, used, gpus, spec)) == want


def test_invalid_spec_is_a_request_error() -> None:
    pod = gpu_pod("p", {"nvidia.com/gpu": 2}, {ANNOTATION_GPU_PARTITION_SPEC: "nope"}).build()
    with pytest.raises(RequestError, match="invalid GPUPartitionSpec annotation"):
        parse_request(pod)


def test_spec_is_ignored_without_gpus_and_makes_requests_refined() -> None:
    spec = {ANNOTATION_GPU_PARTITION_SPEC: "{}"}
    rdma = parse_request(gpu_pod("p", {"koordinator.sh/rdma": 100}, spec).build())
    assert rdma is not None and rdma.partition is None and rdma.vectorizable
    two = parse_request(gpu_pod("p", {"nvidia.com/gpu": 2}, spec).build())
    assert two is not None and two.partition is not None and not two.vectorizable
    assert two.whole_gpus == 2
