"""The pure rules of preemption: PDB accounting, the node order, the args, the nominator."""

from __future__ import annotations

import re
from typing import Any

import pytest

from apis.core import DecodeError, Pod
from apis.disruption import PodDisruptionBudget, decode_pdb
from scheduler.framework.interfaces import PluginArgsError
from scheduler.framework.nominator import Nominator
from scheduler.plugins.defaultpreemption import DefaultPreemptionArgs
from scheduler.plugins.defaultpreemption.args import parse_args
from scheduler.plugins.defaultpreemption.plugin import Candidate, pick_one_node, split_by_pdb
from tests.builders import make_pod


def _pod(name: str, priority: int = 0, start: str = "", **labels: str) -> Pod:
    b = make_pod(name).priority(priority)
    if start:
        b = b.start_time(start)
    for k, v in labels.items():
        b = b.label(k, v)
    return b.build()


def _pdb(allowed: int, selector: dict[str, Any] | None, disrupted: tuple[str, ...] = ()) -> Any:
    obj: dict[str, Any] = {
        "metadata": {"name": "b", "namespace": "default"},
        "spec": {} if selector is None else {"selector": selector},
        "status": {"disruptionsAllowed": allowed, "disruptedPods": dict.fromkeys(disrupted, "t")},
    }
    return decode_pdb(obj)


@pytest.mark.parametrize(
    ("pdb", "pods", "violating"),
    [
        pytest.param(_pdb(0, {"matchLabels": {"app": "a"}}), ["a1", "b1"], ["a1"], id="no-budget"),
        pytest.param(
            _pdb(1, {"matchLabels": {"app": "a"}}), ["a1", "a2"], ["a2"], id="spent-in-order"
        ),
        pytest.param(_pdb(0, None), ["a1"], [], id="no-selector-matches-nothing"),
        pytest.param(_pdb(0, {}), ["a1"], [], id="empty-selector-matches-nothing"),
        pytest.param(
            _pdb(0, {"matchLabels": {"app": "a"}}, ("a1",)), ["a1", "a2"], ["a2"],
            id="already-disrupted-spends-nothing",
        ),
        pytest.param(
            _pdb(0, {"matchExpressions": [{"key": "app", "operator": "In", "values": ["b"]}]}),
            ["a1", "b1"], ["b1"], id="expressions",
        ),
    ],
)
def test_split_by_pdb(pdb: PodDisruptionBudget, pods: list[str], violating: list[str]) -> None:
    records = [_pod(n, app=n[0]) for n in pods]
    bad, fine = split_by_pdb(records, [pdb])
    assert [p.name for p in bad] == violating
    assert [p.name for p in fine] == [n for n in pods if n not in violating]


def test_a_pdb_of_another_namespace_does_not_protect() -> None:
    pdb = decode_pdb({
        "metadata": {"name": "b", "namespace": "other"},
        "spec": {"selector": {"matchLabels": {"app": "a"}}},
    })
    bad, _ = split_by_pdb([_pod("a1", app="a")], [pdb])
    assert bad == []


def _c(node: str, *victims: tuple[int, str], violations: int = 0) -> Candidate:
    pods = tuple(_pod(f"{node}-{i}", p, s) for i, (p, s) in enumerate(victims))
    ordered = tuple(sorted(pods, key=lambda p: (-p.priority, p.start_time)))
    return Candidate(node, ordered, violations)


T1, T2 = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("candidates", "winner"),
    [
        pytest.param([_c("a", (1, T1)), _c("b")], "b", id="no-victims-wins"),
        pytest.param(
            [_c("a", (1, T1), violations=1), _c("b", (5, T1), (5, T1))], "b",
            id="fewest-pdb-violations",
        ),
        pytest.param([_c("a", (5, T1)), _c("b", (1, T1), (1, T1))], "b", id="lowest-top-priority"),
        pytest.param(
            [_c("a", (5, T1), (4, T1)), _c("b", (5, T1), (1, T1))], "b", id="smallest-priority-sum"
        ),
        pytest.param(
            [_c("a", (5, T1), (0, T1), (0, T1)), _c("b", (5, T1), (0, T1))], "b",
            id="fewest-victims",
        ),
        pytest.param([_c("a", (5, T1)), _c("b", (5, T2))], "b", id="latest-start"),
        pytest.param([_c("a", (5, T1)), _c("b", (5, T1))], "a", id="first-found"),
        pytest.param(
            [_c("a", (-5, T1)), _c("b", (-3, T1))], "a", id="negative-priorities-sum-correctly"
        ),
    ],
)
def test_pick_one_node(candidates: list[Candidate], winner: str) -> None:
    best = pick_one_node(candidates)
    assert best is not None and best.node == winner


@pytest.mark.parametrize(
    ("args", "n", "expected"),
    [
        pytest.param({}, 5000, 500, id="ten-percent"),
        pytest.param({}, 50, 50, id="absolute-capped-by-nodes"),
        pytest.param({}, 300, 100, id="absolute-floor"),
        pytest.param({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 7}, 50, 7,
                     id="absolute-only"),
    ],
)
def test_num_candidates(args: dict[str, Any], n: int, expected: int) -> None:
    assert parse_args(args).num_candidates(n) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"minCandidateNodesPercentage": 101}, "must be in [0, 100]"),
        ({"minCandidateNodesAbsolute": -1}, "must be >= 0"),
        ({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 0}, "both be zero"),
        ({"minCandidateNodes": 1}, "unknown field(s) minCandidateNodes"),
        ({"minCandidateNodesAbsolute": "3"}, "must be an integer"),
    ],
)
def test_bad_args_are_one_clear_error(args: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginArgsError, match=re.escape(message)):
        parse_args(args)
    assert parse_args({}) == DefaultPreemptionArgs()


def test_nominator_keeps_an_in_memory_nomination_through_status_less_updates() -> None:
    nominator = Nominator()
    p = _pod("p", 5)
    nominator.add(p, "n1")
    nominator.update(p, p)  # an update that predates our status write
    assert nominator.node_of(p.uid) == "n1"
    moved = make_pod("p").priority(5).nominated("n2").build()
    nominator.update(p, moved)
    assert nominator.node_of(p.uid) == "n2" and nominator.nominated_pods("n1") == []
    assert nominator.nodes_for(_pod("q", 5)) == {"n2"}
    assert nominator.nodes_for(_pod("q", 6)) == set()  # lower-priority nominations yield
    nominator.remove(p.uid)
    assert not nominator


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {}}, "metadata.name: must be non-empty"),
        ({"metadata": {"name": "b"}, "status": {"disruptionsAllowed": "1"}},
         "status.disruptionsAllowed: expected an integer"),
        ({"metadata": {"name": "b"}, "spec": {"selector": {"matchExpressions": [
            {"key": "a", "operator": "Near"}]}}}, "unknown operator"),
    ],
)
def test_pdb_decode_errors_name_the_field(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(DecodeError, match=re.escape(message)):
        decode_pdb(obj)


def test_preemption_policy_is_validated() -> None:
    with pytest.raises(DecodeError, match=r"spec\.preemptionPolicy: unknown policy 'Sometimes'"):
        make_pod("p").preemption_policy("Sometimes").build()
