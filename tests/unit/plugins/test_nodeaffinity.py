"""NodeAffinity: kube's TestNodeAffinity / TestNodeAffinityPriority tables, operators, args."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.framework.cycle_state import CycleState
from scheduler.framework.events import NODE_ADD, NODE_UPDATE
from scheduler.framework.interfaces import (
    BatchFilterPlugin,
    BatchScorePlugin,
    EnqueueExtensions,
    PluginArgsError,
    PreFilterPlugin,
    PreScorePlugin,
    ScoreNormalizer,
)
from scheduler.framework.status import Code, Status
from scheduler.plugins.nodeaffinity import (
    ERR_REASON_CONFLICT,
    ERR_REASON_ENFORCED,
    ERR_REASON_POD,
    NodeAffinity,
    parse_args,
    parse_int64,
)
from tests.builders import PodBuilder, make_node, make_pod, make_snapshot

NAME = "metadata.name"
POD = (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_POD)
ENFORCED = (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_ENFORCED)
CONFLICT = (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_CONFLICT)
SKIP = (Code.SKIP, "")


def _pair(status: Status | None) -> tuple[Code, str] | None:
    return None if status is None else (status.code, status.message)


def _added(required: list[dict[str, Any]] | None = None, preferred: Any = None) -> dict[str, Any]:
    added: dict[str, Any] = {}
    if required is not None:
        added["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    if preferred is not None:
        added["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"addedAffinity": added}


def _in(key: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": list(values)}


# (pod, node labels, node name, args, want PreFilter, want Filter, run PreFilter)
FILTER_CASES = [
    pytest.param(
        make_pod("p").node_selector(foo="bar"), {}, "n", {}, None, POD, True, id="missing-labels"
    ),
    pytest.param(
        make_pod("p").node_selector(foo="bar"),
        {"foo": "bar"},
        "n",
        {},
        None,
        None,
        True,
        id="same-labels",
    ),
    pytest.param(
        make_pod("p").node_selector(foo="bar"),
        {"foo": "bar", "baz": "blah"},
        "n",
        {},
        None,
        None,
        True,
        id="node-labels-superset",
    ),
    pytest.param(
        make_pod("p").node_selector(foo="bar", baz="blah"),
        {"foo": "bar"},
        "n",
        {},
        None,
        POD,
        True,
        id="node-labels-subset",
    ),
    pytest.param(
        make_pod("p").node_affinity_in("foo", ["bar", "value2"]),
        {"foo": "bar"},
        "n",
        {},
        None,
        None,
        True,
        id="in-matches",
    ),
    pytest.param(
        make_pod("p").node_affinity_expr("kernel-version", "Gt", ["0204"]),
        {"kernel-version": "0206"},
        "n",
        {},
        None,
        None,
        True,
        id="gt-matches",
    ),
    pytest.param(
        make_pod("p").node_affinity_not_in("mem-type", ["DDR", "DDR2"]),
        {"mem-type": "DDR3"},
        "n",
        {},
        None,
        None,
        True,
        id="notin-matches",
    ),
    pytest.param(
        make_pod("p").node_affinity_expr("GPU", "Exists"),
        {"GPU": "NVIDIA-GRID-K1"},
        "n",
        {},
        None,
        None,
        True,
        id="exists-matches",
    ),
    pytest.param(
        make_pod("p").node_affinity_in("foo", ["value1", "value2"]),
        {"foo": "bar"},
        "n",
        {},
        None,
        POD,
        True,
        id="in-does-not-match",
    ),
    pytest.param(
        make_pod("p").required_term(),
        {"foo": "bar"},
        "n",
        {},
        None,
        POD,
        True,
        id="empty-term-matches-nothing",
    ),
    pytest.param(
        make_pod("p").required_terms_empty(),
        {"foo": "bar"},
        "n",
        {},
        None,
        POD,
        True,
        id="no-terms-matches-nothing",
    ),
    pytest.param(make_pod("p"), {"foo": "bar"}, "n", {}, SKIP, None, True, id="no-affinity-skip"),
    pytest.param(
        make_pod("p").preferred(1, "foo", ["bar"]),
        {},
        "n",
        {},
        SKIP,
        None,
        True,
        id="preferred-only-skips-filter",
    ),
    pytest.param(
        make_pod("p")
        .node_affinity_expr("GPU", "Exists")
        .node_affinity_not_in("GPU", ["AMD", "INTER"]),
        {"GPU": "NVIDIA-GRID-K1"},
        "n",
        {},
        None,
        None,
        True,
        id="anded-match",
    ),
    pytest.param(
        make_pod("p").node_affinity_expr("GPU", "Exists").node_affinity_in("GPU", ["AMD", "INTER"]),
        {"GPU": "NVIDIA-GRID-K1"},
        "n",
        {},
        None,
        POD,
        True,
        id="anded-no-match",
    ),
    pytest.param(
        make_pod("p")
        .required_term([("foo", "In", ["bar", "value2"])])
        .required_term([("diffkey", "In", ["wrong", "value2"])]),
        {"foo": "bar"},
        "n",
        {},
        None,
        None,
        True,
        id="ored-terms-match",
    ),
    pytest.param(
        make_pod("p").node_selector(foo="bar").node_affinity_expr("foo", "Exists"),
        {"foo": "bar"},
        "n",
        {},
        None,
        None,
        True,
        id="selector-and-affinity",
    ),
    pytest.param(
        make_pod("p").node_selector(foo="bar").node_affinity_expr("foo", "Exists"),
        {"foo": "barrrrrr"},
        "n",
        {},
        None,
        POD,
        True,
        id="affinity-ok-selector-not",
    ),
    pytest.param(
        make_pod("p").node_affinity_not_in("foo", ["invalid value: ___@#$%^"]),
        {"foo": "bar"},
        "n",
        {},
        None,
        POD,
        True,
        id="invalid-value-never-matches",
    ),
    pytest.param(
        make_pod("p").node_affinity_not_in("invalid key", ["x"]),
        {},
        "n",
        {},
        None,
        POD,
        True,
        id="invalid-key-never-matches",
    ),
    pytest.param(
        make_pod("p").required_term(fields=[(NAME, "In", ["node1"])]),
        {},
        "node1",
        {},
        None,
        None,
        True,
        id="match-fields-in-matches",
    ),
    pytest.param(
        make_pod("p").required_term(fields=[(NAME, "In", ["node1"])]),
        {},
        "node2",
        {},
        None,
        POD,
        True,
        id="match-fields-in-no-match",
    ),
    pytest.param(
        make_pod("p").required_term(fields=[(NAME, "NotIn", ["node1"])]),
        {},
        "node2",
        {},
        None,
        None,
        True,
        id="match-fields-notin",
    ),
    pytest.param(
        make_pod("p").required_term(fields=[(NAME, "In", ["node1", "node2"])]),
        {},
        "node2",
        {},
        None,
        POD,
        True,
        id="match-fields-needs-one-value",
    ),
    pytest.param(
        make_pod("p")
        .required_term(fields=[(NAME, "In", ["node1"]), (NAME, "In", ["node2"])])
        .required_term([("foo", "In", ["bar"])]),
        {"foo": "bar"},
        "node2",
        {},
        None,
        None,
        True,
        id="fields-fail-expressions-term-matches",
    ),
    pytest.param(
        make_pod("p").required_term([("foo", "In", ["bar"])], [(NAME, "In", ["node1"])]),
        {"foo": "bar"},
        "node2",
        {},
        None,
        POD,
        True,
        id="one-term-fields-fail",
    ),
    pytest.param(
        make_pod("p").required_term([("foo", "In", ["bar"])], [(NAME, "In", ["node1"])]),
        {"foo": "bar"},
        "node1",
        {},
        None,
        None,
        True,
        id="one-term-both-match",
    ),
    pytest.param(
        make_pod("p")
        .required_term(fields=[(NAME, "In", ["node1"])])
        .required_term([("foo", "In", ["not-match-to-bar"])]),
        {"foo": "bar"},
        "node2",
        {},
        None,
        POD,
        True,
        id="two-terms-none-match",
    ),
    pytest.param(
        make_pod("p")
        .required_term(fields=[(NAME, "In", ["node1"])])
        .required_term(fields=[(NAME, "In", ["node2"])]),
        {},
        "node2",
        {},
        None,
        None,
        True,
        id="two-node-name-terms",
    ),
    pytest.param(
        make_pod("p").required_term(fields=[(NAME, "In", ["node1"]), (NAME, "In", ["node2"])]),
        {"foo": "bar"},
        "node2",
        {},
        CONFLICT,
        POD,
        True,
        id="conflicting-fields",
    ),
    pytest.param(
        make_pod("p").node_affinity_in("zone", ["foo"]),
        {"zone": "foo"},
        "node2",
        _added([{"matchFields": [_in(NAME, "node2")]}]),
        None,
        None,
        True,
        id="matches-added-and-pod-affinity",
    ),
    pytest.param(
        make_pod("p").node_affinity_in("zone", ["bar"]),
        {"zone": "foo"},
        "node2",
        _added([{"matchFields": [_in(NAME, "node2")]}]),
        None,
        POD,
        True,
        id="matches-added-not-pod-affinity",
    ),
    pytest.param(
        make_pod("p"),
        {"zone": "foo"},
        "node2",
        _added([{"matchExpressions": [_in("zone", "bar")]}]),
        None,
        ENFORCED,
        True,
        id="does-not-match-added-affinity",
    ),
    pytest.param(
        make_pod("p").node_selector(foo="bar"),
        {"foo": "bar", "baz": "blah"},
        "n",
        {},
        None,
        None,
        False,
        id="selector-without-pre-filter",
    ),
    pytest.param(
        make_pod("p")
        .node_affinity_expr("GPU", "Exists")
        .node_affinity_not_in("GPU", ["AMD", "INTER"]),
        {"GPU": "NVIDIA-GRID-K1"},
        "n",
        {},
        None,
        None,
        False,
        id="affinity-without-pre-filter",
    ),
]


@pytest.mark.parametrize(
    ("pod", "labels", "node_name", "args", "want_pre", "want", "run_pre"), FILTER_CASES
)
def test_filter(
    pod: PodBuilder,
    labels: dict[str, str],
    node_name: str,
    args: dict[str, Any],
    want_pre: tuple[Code, str] | None,
    want: tuple[Code, str] | None,
    run_pre: bool,
) -> None:
    plugin = NodeAffinity(parse_args(args))
    p = pod.build()
    snapshot = make_snapshot([make_node(node_name).labels(labels), make_node("zz-other")])
    info = snapshot.get(node_name)
    assert info is not None
    state = CycleState()
    if run_pre:
        assert _pair(plugin.pre_filter(state, p)) == want_pre
    assert _pair(plugin.filter(state, p, info)) == want
    if want_pre is None or want_pre[0] != Code.SKIP:
        assert bool(plugin.filter_nodes(state, p, snapshot)[info.slot]) is (want is None)


@pytest.mark.parametrize(
    ("op", "value", "node_value", "want"),
    [
        pytest.param("Gt", "5", "6", True, id="gt-true"),
        pytest.param("Gt", "5", "5", False, id="gt-equal"),
        pytest.param("Lt", "5", "4", True, id="lt-true"),
        pytest.param("Lt", "-5", "-6", False, id="lt-negative-value-is-invalid-label-value"),
        pytest.param("Gt", "1", "+2", True, id="node-value-with-plus-sign"),
        pytest.param("Gt", "1", "2.0", False, id="node-value-not-an-int"),
        pytest.param("Gt", "1", "1_000", False, id="underscores-not-allowed"),
        pytest.param("Gt", "1", "99999999999999999999", False, id="node-value-overflows-int64"),
        pytest.param("Lt", "10", None, False, id="lt-missing-label"),
        pytest.param("Exists", None, None, False, id="exists-missing"),
        pytest.param("DoesNotExist", None, None, True, id="does-not-exist-missing"),
        pytest.param("DoesNotExist", None, "x", False, id="does-not-exist-present"),
        pytest.param("NotIn", "a", None, True, id="notin-missing-key"),
        pytest.param("In", "", "", True, id="in-empty-value"),
        pytest.param("In", "", None, False, id="in-empty-value-missing-key"),
    ],
)
def test_operators(op: str, value: str | None, node_value: str | None, want: bool) -> None:
    pod = make_pod("p").node_affinity_expr("k", op, [value] if value is not None else []).build()
    node = make_node("n")
    if node_value is not None:
        node.label("k", node_value)
    snapshot = make_snapshot([node])
    plugin = NodeAffinity()
    info = snapshot.get("n")
    assert info is not None
    state = CycleState()
    plugin.pre_filter(state, pod)
    assert (plugin.filter(state, pod, info) is None) is want
    assert plugin.filter_nodes(state, pod, snapshot).tolist() == [want]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0", 0),
        ("-12", -12),
        ("+7", 7),
        ("0204", 204),
        (" 1", None),
        ("1e3", None),
        ("٣", None),
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", None),
        ("", None),
    ],
)
def test_parse_int64_is_go_strconv(text: str, want: int | None) -> None:
    assert parse_int64(text) == want


LABEL1 = {"foo": "bar"}
LABEL2 = {"key": "value"}
LABEL3 = {"az": "az1"}
LABEL4 = {"abc": "az11", "def": "az22"}
LABEL5 = {"foo": "bar", "key": "value", "az": "az1"}


def _affinity1(p: PodBuilder) -> PodBuilder:
    return p.preferred(2, "foo", ["bar"])


def _affinity2(p: PodBuilder) -> PodBuilder:
    return (
        p.preferred(2, "foo", ["bar"])
        .preferred(4, "key", ["value"])
        .preferred_term(
            5, [("foo", "In", ["bar"]), ("key", "In", ["value"]), ("az", "In", ["az1"])]
        )
    )


AFFINITY1_ARGS = {
    "addedAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 2, "preference": {"matchExpressions": [_in("foo", "bar")]}}
        ]
    }
}

# kube TestNodeAffinityPriority: (pod, nodes, args, want normalized, run PreScore)
SCORE_CASES = [
    pytest.param(
        make_pod("p"),
        [("node1", LABEL1), ("node2", LABEL2), ("node3", LABEL3)],
        {},
        [0, 0, 0],
        False,
        id="no-affinity-same-priority",
    ),
    pytest.param(
        _affinity1(make_pod("p")),
        [("node1", LABEL4), ("node2", LABEL2), ("node3", LABEL3)],
        {},
        [0, 0, 0],
        True,
        id="no-node-matches",
    ),
    pytest.param(
        _affinity1(make_pod("p")),
        [("node1", LABEL1), ("node2", LABEL2), ("node3", LABEL3)],
        {},
        [100, 0, 0],
        True,
        id="only-node1-matches",
    ),
    pytest.param(
        _affinity2(make_pod("p")),
        [("node1", LABEL1), ("node5", LABEL5), ("node2", LABEL2)],
        {},
        [18, 100, 36],
        True,
        id="different-priorities",
    ),
    pytest.param(
        make_pod("p"),
        [("node1", LABEL1), ("node2", LABEL2)],
        AFFINITY1_ARGS,
        [100, 0],
        True,
        id="added-affinity",
    ),
    pytest.param(
        _affinity1(make_pod("p")),
        [("node1", LABEL1), ("node2", LABEL2), ("node3", LABEL5)],
        {
            "addedAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 3, "preference": {"matchExpressions": [_in("key", "value")]}}
                ]
            }
        },
        [40, 60, 100],
        True,
        id="added-affinity-and-pod-affinity",
    ),
    pytest.param(
        _affinity2(make_pod("p")),
        [("node1", LABEL1), ("node5", LABEL5), ("node2", LABEL2)],
        {},
        [18, 100, 36],
        False,
        id="without-pre-score",
    ),
]


@pytest.mark.parametrize(("pod", "nodes", "args", "want", "run_pre"), SCORE_CASES)
def test_score(
    pod: PodBuilder,
    nodes: list[tuple[str, dict[str, str]]],
    args: dict[str, Any],
    want: list[int],
    run_pre: bool,
) -> None:
    plugin = NodeAffinity(parse_args(args))
    p = pod.build()
    snapshot = make_snapshot([make_node(n).labels(lbl) for n, lbl in nodes])
    infos = list(snapshot.node_infos())
    state = CycleState()
    if run_pre:
        assert plugin.pre_score(state, p, infos) is None
    raw = np.array([plugin.score(state, p, i) for i in infos], dtype=np.int64)
    assert plugin.score_nodes(state, p, snapshot, snapshot.live_slots()).tolist() == raw.tolist()
    assert plugin.normalize_score(state, p, raw) is None
    assert raw.tolist() == want


def test_pre_score_skips_without_preferred_terms() -> None:
    status = NodeAffinity().pre_score(CycleState(), make_pod("p").build(), [])
    assert status is not None and status.code == Code.SKIP


def test_pre_score_errors_on_broken_preferred_term() -> None:
    pod = make_pod("p").preferred(2, "invalid key", ["bar"]).build()
    status = NodeAffinity().pre_score(CycleState(), pod, [])
    assert status is not None and status.code == Code.ERROR
    assert "invalid key" in status.message


def test_mask_follows_label_changes() -> None:
    snapshot = make_snapshot([make_node("a").label("zone", "x"), make_node("b")])
    plugin = NodeAffinity()
    pod = make_pod("p").node_selector(zone="x").build()
    state = CycleState()
    plugin.pre_filter(state, pod)
    first = plugin.filter_nodes(state, pod, snapshot)
    assert first.tolist() == [True, False]
    first[:] = False
    assert plugin.filter_nodes(state, pod, snapshot).tolist() == [True, False]
    snapshot.set_node(make_node("b").label("zone", "x").build())
    assert plugin.filter_nodes(state, pod, snapshot).tolist() == [True, True]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        pytest.param({"addedAfinity": {}}, "unknown field", id="unknown-arg"),
        pytest.param({"addedAffinity": []}, "expected a mapping", id="not-a-mapping"),
        pytest.param(
            {"addedAffinity": {"requiredDuringSchedulingRequiredDuringExecution": {}}},
            "unknown field",
            id="unknown-affinity-field",
        ),
        pytest.param(
            _added([{"matchExpressions": [{"key": "a", "operator": "Bad"}]}]),
            r"addedAffinity\.requiredDuringScheduling.*operator",
            id="bad-operator",
        ),
        pytest.param(
            _added([{"matchExpressions": [_in("invalid key", "x")]}]),
            "invalid label key",
            id="bad-key",
        ),
        pytest.param(
            _added(preferred=[{"weight": 0, "preference": {}}]), "weight", id="bad-weight"
        ),
    ],
)
def test_args_errors(args: dict[str, Any], match: str) -> None:
    with pytest.raises(PluginArgsError, match=match):
        parse_args(args)


def test_added_required_affinity_does_not_skip_pre_filter() -> None:
    plugin = NodeAffinity(parse_args(_added([{"matchExpressions": [_in("zone", "a")]}])))
    assert plugin.pre_filter(CycleState(), make_pod("p").build()) is None


def test_protocols_and_events() -> None:
    plugin = NodeAffinity()
    for proto in (
        PreFilterPlugin,
        BatchFilterPlugin,
        PreScorePlugin,
        BatchScorePlugin,
        ScoreNormalizer,
        EnqueueExtensions,
    ):
        assert isinstance(plugin, proto)
    assert plugin.pre_filter_extensions() is None
    assert set(plugin.events_to_register()) == {NODE_ADD, NODE_UPDATE}
