"""NodeUnschedulable: kube's cases plus toleration variants, per node and whole cluster."""

from __future__ import annotations

import pytest

from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE
from scheduler.framework.interfaces import BatchFilterPlugin, EnqueueExtensions
from scheduler.framework.status import Code
from scheduler.plugins.nodeunschedulable import ERR_REASON_UNSCHEDULABLE, NodeUnschedulable
from tests.builders import PodBuilder, make_node, make_pod, make_snapshot

KEY = "node.kubernetes.io/unschedulable"


@pytest.mark.parametrize(
    ("pod", "cordoned", "fits"),
    [
        pytest.param(make_pod("p"), True, False, id="no-toleration-cordoned-node"),
        pytest.param(make_pod("p"), False, True, id="normal-node"),
        pytest.param(
            make_pod("p").toleration(KEY, effect="NoSchedule"),
            True,
            True,
            id="tolerates-unschedulable-taint",
        ),
        pytest.param(
            make_pod("p").toleration(KEY, operator="Exists"),
            True,
            True,
            id="exists-any-effect",
        ),
        pytest.param(make_pod("p").toleration(operator="Exists"), True, True, id="tolerate-all"),
        pytest.param(
            make_pod("p").toleration(KEY, effect="NoExecute", operator="Exists"),
            True,
            False,
            id="wrong-effect",
        ),
        pytest.param(
            make_pod("p").toleration(KEY, value="x", effect="NoSchedule"),
            True,
            False,
            id="equal-with-wrong-value",
        ),
        pytest.param(
            make_pod("p").toleration("other", operator="Exists"),
            True,
            False,
            id="other-key",
        ),
    ],
)
def test_filter(pod: PodBuilder, cordoned: bool, fits: bool) -> None:
    snapshot = make_snapshot([make_node("n1").unschedulable(cordoned), make_node("n2")])
    plugin = NodeUnschedulable()
    p = pod.build()
    info = snapshot.get("n1")
    assert info is not None
    status = plugin.filter(CycleState(), p, info)
    if fits:
        assert status is None
    else:
        assert status is not None
        assert status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        assert status.reasons == (ERR_REASON_UNSCHEDULABLE,)
    mask = plugin.filter_nodes(CycleState(), p, snapshot)
    assert mask.tolist() == [fits, True]


def test_mask_follows_node_updates() -> None:
    snapshot = make_snapshot([make_node("n1"), make_node("n2")])
    plugin = NodeUnschedulable()
    pod = make_pod("p").build()
    assert plugin.filter_nodes(CycleState(), pod, snapshot).tolist() == [True, True]
    snapshot.set_node(make_node("n2").unschedulable().build())
    assert plugin.filter_nodes(CycleState(), pod, snapshot).tolist() == [True, False]


def test_protocols_and_events() -> None:
    plugin = NodeUnschedulable()
    assert isinstance(plugin, BatchFilterPlugin)
    assert isinstance(plugin, EnqueueExtensions)
    assert set(plugin.events_to_register()) == {NODE_ADD, NODE_UPDATE}
