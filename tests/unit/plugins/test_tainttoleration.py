"""TaintToleration: kube's filter and score tables, ToleratesTaint rules, whole-cluster forms."""

from __future__ import annotations

import numpy as np
import pytest

from apis.core import Taint, Toleration
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE
from scheduler.framework.interfaces import (
    BatchFilterPlugin,
    BatchScorePlugin,
    EnqueueExtensions,
    PreScorePlugin,
    ScoreNormalizer,
)
from scheduler.framework.status import Code
from scheduler.plugins.tainttoleration import (
    ERR_REASON_UNTOLERATED,
    TaintToleration,
    tolerates_taint,
)
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod, make_snapshot

NS, PNS, NE = "NoSchedule", "PreferNoSchedule", "NoExecute"


# component-helpers TestTolerationToleratesTaint, plus the empty-effect rule.
@pytest.mark.parametrize(
    ("toleration", "taint", "want"),
    [
        pytest.param(
            Toleration("foo", "Exists", "", NS),
            Taint("foo", "", NS),
            True,
            id="exists-same-key-effect-no-value",
        ),
        pytest.param(
            Toleration("foo", "Exists", "", NS),
            Taint("foo", "bar", NS),
            True,
            id="exists-same-key-effect-some-value",
        ),
        pytest.param(
            Toleration("", "Exists", "", NS),
            Taint("foo", "bar", NS),
            True,
            id="exists-empty-key-matches-all-keys",
        ),
        pytest.param(
            Toleration("foo", "Equal", "bar", NS),
            Taint("foo", "bar", NS),
            True,
            id="equal-same-key-value-effect",
        ),
        pytest.param(
            Toleration("foo", "Equal", "value1", NS),
            Taint("foo", "value2", NS),
            False,
            id="equal-different-values",
        ),
        pytest.param(
            Toleration("foo", "Equal", "bar", NE),
            Taint("foo", "bar", NS),
            False,
            id="equal-different-effects",
        ),
        pytest.param(
            Toleration("foo", "Equal", "bar", ""),
            Taint("foo", "bar", NE),
            True,
            id="empty-effect-matches-all-effects",
        ),
        pytest.param(
            Toleration("foo", "", "bar", NS),
            Taint("foo", "bar", NS),
            True,
            id="empty-operator-is-equal",
        ),
        pytest.param(
            Toleration("other", "Exists", "", ""),
            Taint("foo", "bar", NS),
            False,
            id="different-key",
        ),
        pytest.param(
            Toleration("", "Equal", "bar", ""),
            Taint("foo", "bar", NS),
            True,
            id="empty-key-equal-compares-value-only",
        ),
    ],
)
def test_tolerates_taint(toleration: Toleration, taint: Taint, want: bool) -> None:
    assert tolerates_taint(toleration, taint) is want


# kube TestTaintTolerationFilter
FILTER_CASES = [
    pytest.param(
        make_pod("p"),
        make_node("n").taint("dedicated", "user1", NS),
        False,
        id="no-tolerations-tainted-node",
    ),
    pytest.param(
        make_pod("p").toleration("dedicated", "user1", NS),
        make_node("n").taint("dedicated", "user1", NS),
        True,
        id="dedicated-node-user1",
    ),
    pytest.param(
        make_pod("p").toleration("dedicated", "user2", NS),
        make_node("n").taint("dedicated", "user1", NS),
        False,
        id="dedicated-node-other-user",
    ),
    pytest.param(
        make_pod("p").toleration("foo", effect=NS, operator="Exists"),
        make_node("n").taint("foo", "bar", NS),
        True,
        id="exists-operator",
    ),
    pytest.param(
        make_pod("p")
        .toleration("dedicated", "user2", NS)
        .toleration("foo", effect=NS, operator="Exists"),
        make_node("n").taint("dedicated", "user2", NS).taint("foo", "bar", NS),
        True,
        id="multiple-tolerations-all-tolerated",
    ),
    pytest.param(
        make_pod("p").toleration("foo", "bar", PNS),
        make_node("n").taint("foo", "bar", NS),
        False,
        id="effect-mismatch",
    ),
    pytest.param(
        make_pod("p").toleration("foo", "bar"),
        make_node("n").taint("foo", "bar", NS),
        True,
        id="empty-effect-tolerates",
    ),
    pytest.param(
        make_pod("p").toleration("dedicated", "user2", NS),
        make_node("n").taint("dedicated", "user1", PNS),
        True,
        id="prefer-no-schedule-never-filters",
    ),
    pytest.param(
        make_pod("p"),
        make_node("n").taint("dedicated", "user1", PNS),
        True,
        id="no-toleration-prefer-no-schedule",
    ),
    pytest.param(
        make_pod("p"), make_node("n").taint("evict", "now", NE), False, id="no-execute-filters"
    ),
    pytest.param(
        make_pod("p").toleration(operator="Exists"),
        make_node("n").taint("a", "1", NS).taint("b", "2", NE),
        True,
        id="tolerate-everything",
    ),
    pytest.param(make_pod("p"), make_node("n"), True, id="untainted-node"),
]


@pytest.mark.parametrize(("pod", "node", "fits"), FILTER_CASES)
def test_filter(pod: PodBuilder, node: NodeBuilder, fits: bool) -> None:
    snapshot = make_snapshot([node])
    plugin = TaintToleration()
    p = pod.build()
    info = snapshot.get("n")
    assert info is not None
    status = plugin.filter(CycleState(), p, info)
    if fits:
        assert status is None
    else:
        assert status is not None
        assert status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        assert status.reasons == (ERR_REASON_UNTOLERATED,)
    assert plugin.filter_nodes(CycleState(), p, snapshot).tolist() == [fits]


def test_reason_is_current_kube_scheduler_wording() -> None:
    # kubernetes#134740: the taint's key and value no longer appear in the pod status.
    assert ERR_REASON_UNTOLERATED == "node(s) had untolerated taint(s)"


# kube TestTaintTolerationScore (normalized scores)
SCORE_CASES = [
    pytest.param(
        make_pod("p").toleration("foo", "bar", PNS),
        [make_node("nodeA").taint("foo", "bar", PNS), make_node("nodeB").taint("foo", "blah", PNS)],
        [100, 0],
        id="tolerated-taints-score-higher",
    ),
    pytest.param(
        make_pod("p").toleration("cpu-type", "arm64", PNS).toleration("disk-type", "ssd", PNS),
        [
            make_node("nodeA"),
            make_node("nodeB").taint("cpu-type", "arm64", PNS),
            make_node("nodeC").taint("cpu-type", "arm64", PNS).taint("disk-type", "ssd", PNS),
        ],
        [100, 100, 100],
        id="all-tolerated-same-score",
    ),
    pytest.param(
        make_pod("p").toleration("foo", "bar", PNS),
        [
            make_node("nodeA"),
            make_node("nodeB").taint("cpu-type", "arm64", PNS),
            make_node("nodeC").taint("cpu-type", "arm64", PNS).taint("disk-type", "ssd", PNS),
        ],
        [100, 50, 0],
        id="more-intolerable-taints-lower-score",
    ),
    pytest.param(
        make_pod("p").toleration("cpu-type", "arm64", NS).toleration("disk-type", "ssd", NS),
        [
            make_node("nodeA"),
            make_node("nodeB").taint("cpu-type", "arm64", NS),
            make_node("nodeC").taint("cpu-type", "arm64", PNS).taint("disk-type", "ssd", PNS),
        ],
        [100, 100, 0],
        id="only-prefer-no-schedule-counts",
    ),
    pytest.param(
        make_pod("p"),
        [make_node("nodeA"), make_node("nodeB").taint("cpu-type", "arm64", PNS)],
        [100, 0],
        id="default-no-taints-no-tolerations",
    ),
    pytest.param(
        make_pod("p"),
        [make_node("nodeA"), make_node("nodeB")],
        [100, 100],
        id="all-zero-reversed-is-max",
    ),
]


@pytest.mark.parametrize(("pod", "nodes", "want"), SCORE_CASES)
def test_score(pod: PodBuilder, nodes: list[NodeBuilder], want: list[int]) -> None:
    snapshot = make_snapshot(nodes)
    plugin = TaintToleration()
    p = pod.build()
    state = CycleState()
    infos = list(snapshot.node_infos())
    assert plugin.pre_score(state, p, infos) is None
    raw = np.array([plugin.score(state, p, info) for info in infos], dtype=np.int64)
    batch = plugin.score_nodes(state, p, snapshot, snapshot.live_slots())
    assert batch.tolist() == raw.tolist()
    assert plugin.normalize_score(state, p, raw) is None
    assert raw.tolist() == want


def test_score_without_pre_score_falls_back() -> None:
    snapshot = make_snapshot([make_node("a").taint("k", "v", PNS)])
    info = snapshot.get("a")
    assert info is not None
    assert TaintToleration().score(CycleState(), make_pod("p").build(), info) == 1


def test_cached_masks_are_copies_and_follow_node_generation() -> None:
    snapshot = make_snapshot([make_node("a").taint("k", "v", NS), make_node("b")])
    plugin = TaintToleration()
    pod = make_pod("p").build()
    first = plugin.filter_nodes(CycleState(), pod, snapshot)
    first[:] = True  # a caller scribbling on its mask must not poison the cache
    assert plugin.filter_nodes(CycleState(), pod, snapshot).tolist() == [False, True]
    snapshot.set_node(make_node("b").taint("k", "v", NS).build())
    assert plugin.filter_nodes(CycleState(), pod, snapshot).tolist() == [False, False]
    snapshot.set_node(make_node("a").build())
    assert plugin.filter_nodes(CycleState(), pod, snapshot).tolist() == [True, False]


def test_protocols_and_events() -> None:
    plugin = TaintToleration()
    for proto in (
        BatchFilterPlugin,
        BatchScorePlugin,
        PreScorePlugin,
        ScoreNormalizer,
        EnqueueExtensions,
    ):
        assert isinstance(plugin, proto)
    assert set(plugin.events_to_register()) == {NODE_ADD, NODE_UPDATE}
