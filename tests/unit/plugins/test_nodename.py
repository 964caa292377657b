"""NodeName: kube's cases, per node and whole cluster."""

from __future__ import annotations

import pytest

from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE
from scheduler.framework.interfaces import BatchFilterPlugin, EnqueueExtensions
from scheduler.framework.status import Code
from scheduler.plugins.nodename import ERR_REASON, NodeName
from tests.builders import make_node, make_pod, make_snapshot


@pytest.mark.parametrize(
    ("node_name", "want"),
    [
        pytest.param("", [True, True], id="no-host-specified"),
        pytest.param("foo", [True, False], id="host-matches"),
        pytest.param("bar", [False, True], id="host-does-not-match"),
        pytest.param("missing", [False, False], id="unknown-node"),
    ],
)
def test_filter(node_name: str, want: list[bool]) -> None:
    snapshot = make_snapshot([make_node("foo"), make_node("bar")])
    pod_builder = make_pod("p")
    if node_name:
        pod_builder.node(node_name)
    pod = pod_builder.build()
    plugin = NodeName()
    got = []
    for info in snapshot.node_infos():
        status = plugin.filter(CycleState(), pod, info)
        if status is not None:
            assert status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            assert status.reasons == (ERR_REASON,)
        got.append(status is None)
    assert got == want
    assert plugin.filter_nodes(CycleState(), pod, snapshot).tolist() == want


def test_reason_text() -> None:
    assert ERR_REASON == "node(s) didn't match the requested node name"


def test_protocols_and_events() -> None:
    plugin = NodeName()
    assert isinstance(plugin, BatchFilterPlugin)
    assert isinstance(plugin, EnqueueExtensions)
    assert set(plugin.events_to_register()) == {NODE_ADD, NODE_UPDATE}
