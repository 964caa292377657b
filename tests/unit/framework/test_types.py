"""FitError message (golden), the grouped node statuses, Snapshot bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from apis.core import decode_node, decode_pod
from scheduler.framework.status import Code, Status, unresolvable, unschedulable
from scheduler.framework.types import Diagnosis, NodeStatuses, Snapshot, fit_error_message


@pytest.mark.parametrize(
    ("num_nodes", "diagnosis", "expected"),
    [
        pytest.param(
            5,
            Diagnosis(
                node_to_status={
                    "a": unresolvable("node(s) didn't match Pod's node affinity/selector"),
                    "b": unresolvable("node(s) didn't match Pod's node affinity/selector"),
                    "c": unschedulable("Insufficient gpu devices"),
                    "d": unschedulable("Insufficient gpu devices"),
                    "e": unschedulable("Insufficient gpu devices"),
                }
            ),
            "0/5 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
            "3 Insufficient gpu devices.",
            id="spec-example",
        ),
        pytest.param(
            3,
            Diagnosis(
                node_to_status={
                    "a": unschedulable("Insufficient cpu", "Insufficient memory"),
                    "b": unschedulable("Insufficient memory"),
                    "c": unresolvable("node(s) were unschedulable"),
                }
            ),
            "0/3 nodes are available: 1 Insufficient cpu, 1 node(s) were unschedulable, "
            "2 Insufficient memory.",
            id="items-sorted-as-plain-strings",
        ),
        pytest.param(
            4,
            Diagnosis(pre_filter_msg="invalid resource device requests: [koordinator.sh/gpu-core]"),
            "0/4 nodes are available: invalid resource device requests: [koordinator.sh/gpu-core].",
            id="prefilter-stands-alone",
        ),
        pytest.param(
            2,
            Diagnosis(
                node_to_status={"a": unschedulable("Too many pods")},
                post_filter_msg="preemption: not eligible due to preemptionPolicy=Never.",
            ),
            "0/2 nodes are available: 1 Too many pods. "
            "preemption: not eligible due to preemptionPolicy=Never.",
            id="postfilter-appended",
        ),
        pytest.param(0, Diagnosis(), "no nodes available to schedule pods", id="no-nodes"),
    ],
)
def test_fit_error_message(num_nodes: int, diagnosis: Diagnosis, expected: str) -> None:
    assert fit_error_message(num_nodes, diagnosis) == expected


def _grouped() -> tuple[NodeStatuses, dict[str, Status]]:
    """Five nodes as the runtime groups them, and the same as a plain dict."""
    snap = Snapshot()
    for n in ("a", "b", "c", "d", "e"):
        snap.set_node(decode_node({"metadata": {"name": n}}))
    affinity = unresolvable("node(s) didn't match Pod's node affinity/selector").with_plugin("NA")
    gpu = unschedulable("Insufficient gpu devices").with_plugin("DS")
    both = unschedulable("Insufficient cpu", "Insufficient memory").with_plugin("Fit")
    slow = Status(Code.ERROR, ("boom",), plugin="DS")
    grouped = NodeStatuses(
        snap,
        {"c": both},
        [
            (np.array([0, 1]), np.array([0, 0]), [affinity]),
            (np.array([3, 4]), np.array([1, 1]), [slow, gpu]),
        ],
    )
    return grouped, {"c": both, "a": affinity, "b": affinity, "d": gpu, "e": gpu}


def test_grouped_statuses_read_like_the_dict() -> None:
    grouped, plain = _grouped()
    assert len(grouped) == 5
    assert list(grouped.items()) == list(plain.items())  # same order as the per-node dict
    assert grouped.plugins() == {"NA", "DS", "Fit"}  # the unused error status is not counted
    assert grouped.first_error() is None
    assert fit_error_message(5, Diagnosis(node_to_status=grouped)) == fit_error_message(
        5, Diagnosis(node_to_status=plain)
    )
    assert fit_error_message(5, Diagnosis(node_to_status=grouped)) == (
        "0/5 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, "
        "2 Insufficient gpu devices, 2 node(s) didn't match Pod's node affinity/selector."
    )


def test_grouped_first_error_in_dict_order() -> None:
    snap = Snapshot()
    for n in ("a", "b", "c"):
        snap.set_node(decode_node({"metadata": {"name": n}}))
    first = Status(Code.ERROR, ("first",), plugin="X")
    second = Status(Code.ERROR, ("second",), plugin="Y")
    ok = unschedulable("nope").with_plugin("X")
    grouped = NodeStatuses(
        snap,
        {},
        [
            (np.array([0, 1]), np.array([1, 0]), [first, ok]),
            (np.array([2]), np.array([0]), [second]),
        ],
    )
    assert grouped.first_error() is first


def _node(name: str, cpu: str = "4") -> dict[str, object]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "pods": "10"}}}


def _pod(name: str, cpu: str, node: str = "") -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu}}}]},
    }


def test_snapshot_slots_columns_and_reuse() -> None:
    snap = Snapshot(capacity=1)
    for n in ("a", "b", "c"):
        snap.set_node(decode_node(_node(n)))
    assert snap.num_nodes == 3 and snap.capacity >= 3
    snap.add_pod("b", decode_pod(_pod("p1", "1500m", "b")))
    snap.add_pod("b", decode_pod(_pod("p2", "500m", "b")))
    assert list(snap.requested("cpu")) == [0, 2000, 0]
    assert list(snap.pod_count[: snap.size]) == [0, 2, 0]
    # Deleting a node that still has pods keeps an imaginary node until they go.
    snap.remove_node("b")
    assert snap.num_nodes == 2 and "b" in snap.index and snap.get("b") is None
    snap.remove_pod("b", "default/p1")
    snap.remove_pod("b", "default/p2")
    assert "b" not in snap.index
    # The freed slot is reused and starts clean.
    snap.set_node(decode_node(_node("d", "8")))
    assert snap.index["d"] == 1
    assert snap.requested("cpu")[1] == 0 and snap.allocatable("cpu")[1] == 8000
    assert [i.name for i in snap.node_infos()] == ["a", "d", "c"]


def test_snapshot_node_update_replaces_allocatable() -> None:
    snap = Snapshot()
    snap.set_node(
        decode_node(
            {
                "metadata": {"name": "a"},
                "status": {"allocatable": {"cpu": "4", "example.com/foo": "2"}},
            }
        )
    )
    gen = snap.node_generation
    snap.set_node(decode_node(_node("a", "2")))
    assert snap.allocatable("cpu")[0] == 2000
    assert snap.allocatable("example.com/foo")[0] == 0
    assert snap.node_generation > gen
    assert np.array_equal(snap.live_slots(), [0])


def test_status_helpers() -> None:
    s = Status(Code.UNSCHEDULABLE, ("a", "b"))
    assert s.message == "a, b" and s.is_rejected
    assert s.with_plugin("X").plugin == "X"
    assert str(s.with_plugin("X")) == "Unschedulable: X: a, b"


def test_status_heartbeat_does_not_bump_node_generation() -> None:
    snap = Snapshot()
    obj = _node("a")
    snap.set_node(decode_node(obj))
    gen = snap.node_generation
    heartbeat = dict(obj, metadata={"name": "a", "resourceVersion": "99"})
    snap.set_node(decode_node(heartbeat))
    assert snap.node_generation == gen
    snap.set_node(decode_node(dict(obj, metadata={"name": "a", "labels": {"x": "y"}})))
    assert snap.node_generation == gen + 1
