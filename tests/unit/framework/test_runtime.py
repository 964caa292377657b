"""The framework runtime: building profiles, running extension points, scores, diagnosis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from apis.core import Pod, decode_node, decode_pod
from scheduler.config import PluginConfig, PluginRef, Plugins, PluginSet, Profile
from scheduler.framework.cycle_state import CycleState
from scheduler.framework.interfaces import Handle, PluginArgsError, QueuedPodInfo
from scheduler.framework.runtime import Framework, FrameworkError
from scheduler.framework.status import SKIP, Code, Status, unresolvable, unschedulable
from scheduler.framework.types import NodeInfo, Snapshot

# -- fake plugins -------------------------------------------------------------------------------


class Sort:
    name = "Sort"

    def less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        return a.timestamp < b.timestamp


class Binder:
    name = "Binder"

    def __init__(self) -> None:
        self.bound: list[tuple[str, str]] = []

    def bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        self.bound.append((pod.name, node_name))
        return None


class SkipBinder:
    name = "SkipBinder"

    def bind(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        return SKIP


class RejectNodes:
    """Per-node filter rejecting the named nodes; PreFilter can be told to skip."""

    name = "RejectNodes"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.reject = set(args.get("nodes", []))
        self.skip = bool(args.get("skip", False))
        self.calls = 0

    def pre_filter(self, state: CycleState, pod: Pod) -> Status | None:
        return SKIP if self.skip else None

    def pre_filter_extensions(self) -> None:
        return None

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        self.calls += 1
        return unschedulable("rejected by name") if node.name in self.reject else None


class BatchOdd:
    """Whole-cluster filter: only odd slots pass; scores = slot number."""

    name = "BatchOdd"

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        return None if node.slot % 2 else unresolvable("even slot")

    def filter_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot) -> Any:
        return np.arange(snapshot.size) % 2 == 1

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        return node.slot

    def score_nodes(self, state: CycleState, pod: Pod, snapshot: Snapshot, slots: Any) -> Any:
        return slots.astype(np.int64)


class Crashy:
    name = "Crashy"

    def filter(self, state: CycleState, pod: Pod, node: NodeInfo) -> Status | None:
        raise RuntimeError("boom")

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        return 1000


class Negative:
    name = "Negative"

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        return -1


class Normalizing:
    """Scores 2 x slot, normalized so the best is 100."""

    name = "Normalizing"

    def score(self, state: CycleState, pod: Pod, node: NodeInfo) -> int:
        return 2 * node.slot

    def normalize_score(self, state: CycleState, pod: Pod, scores: Any) -> Status | None:
        top = int(scores.max()) or 1
        scores[:] = scores * 100 // top
        return None


class Recorder:
    name = "Recorder"

    def __init__(self, log: list[str], fail: bool = False, tag: str = "") -> None:
        self.log, self.fail, self.tag = log, fail, tag
        self.name = f"Recorder{tag}"

    def reserve(self, state: CycleState, pod: Pod, node_name: str) -> Status | None:
        self.log.append(f"reserve{self.tag}")
        return unschedulable("no") if self.fail else None

    def unreserve(self, state: CycleState, pod: Pod, node_name: str) -> None:
        self.log.append(f"unreserve{self.tag}")


def _registry(log: list[str] | None = None) -> dict[str, Any]:
    log = log if log is not None else []

    def bad_args(args: Mapping[str, Any], h: Handle) -> Any:
        raise PluginArgsError("foo: must be a string")

    return {
        "Sort": lambda a, h: Sort(),
        "Binder": lambda a, h: Binder(),
        "SkipBinder": lambda a, h: SkipBinder(),
        "RejectNodes": lambda a, h: RejectNodes(a),
        "BatchOdd": lambda a, h: BatchOdd(),
        "Crashy": lambda a, h: Crashy(),
        "Negative": lambda a, h: Negative(),
        "Normalizing": lambda a, h: Normalizing(),
        "RecorderA": lambda a, h: Recorder(log, tag="A"),
        "RecorderB": lambda a, h: Recorder(log, fail=True, tag="B"),
        "BadArgs": bad_args,
    }


def _set(*names: str, weights: Mapping[str, int] | None = None) -> PluginSet:
    return PluginSet(enabled=tuple(PluginRef(n, (weights or {}).get(n, 0)) for n in names))


def _framework(
    snapshot: Snapshot,
    log: list[str] | None = None,
    config: tuple[PluginConfig, ...] = (),
    **points: PluginSet,
) -> Framework:
    plugins = Plugins(queue_sort=_set("Sort"), bind=points.pop("bind", _set("Binder")), **points)
    profile = Profile(scheduler_name="test", plugins=plugins, plugin_config=config)
    handle = Handle(snapshot, client=None, clock=None)  # type: ignore[arg-type]
    return Framework(profile, _registry(log), handle)


def _snapshot(n: int) -> Snapshot:
    snap = Snapshot()
    for i in range(n):
        snap.set_node(decode_node({"metadata": {"name": f"n{i}"}}))
    return snap


POD = decode_pod({"metadata": {"name": "p"}})


@pytest.mark.parametrize(
    ("points", "config", "message"),
    [
        pytest.param({"filter": _set("Nope")}, (), "unknown plugin 'Nope'", id="unknown-plugin"),
        pytest.param(
            {"reserve": _set("Crashy")},
            (),
            "plugin Crashy does not implement the Reserve extension point",
            id="wrong-extension-point",
        ),
        pytest.param(
            {"filter": _set("BadArgs")},
            (),
            "plugin BadArgs: invalid args: foo: must be a string",
            id="bad-args",
        ),
        pytest.param(
            {"filter": _set("BatchOdd", "BatchOdd")},
            (),
            "plugin BatchOdd enabled twice at filter",
            id="duplicate",
        ),
        pytest.param({"bind": PluginSet()}, (), "at least one bind plugin", id="no-binder"),
        pytest.param(
            {},
            (PluginConfig("Ghost", {}),),
            "pluginConfig for unknown plugin 'Ghost'",
            id="config-for-unknown",
        ),
    ],
)
def test_build_errors(
    points: dict[str, PluginSet], config: tuple[PluginConfig, ...], message: str
) -> None:
    with pytest.raises(FrameworkError) as err:
        _framework(_snapshot(1), config=config, **points)
    assert str(err.value).startswith("profile 'test': ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_filter_exception_becomes_error_with_plugin_name() -> None:
    snap = _snapshot(2)
    fwk = _framework(snap, filter=_set("Crashy"))
    status = fwk.run_filter(CycleState(), POD, snap.info(0))
    assert status is not None and status.code == Code.ERROR
    assert status.plugin == "Crashy" and "boom" in status.message


def test_prefilter_skip_means_filter_not_run() -> None:
    snap = _snapshot(3)
    fwk = _framework(
        snap,
        config=(PluginConfig("RejectNodes", {"nodes": ["n0"], "skip": True}),),
        pre_filter=_set("RejectNodes"),
        filter=_set("RejectNodes"),
    )
    state = CycleState()
    assert fwk.run_pre_filter(state, POD) is None
    assert state.skip_filter == {"RejectNodes"}
    out = fwk.find_feasible(state, POD, snap, 100, 0)
    assert list(out.feasible) == [0, 1, 2]
    assert fwk.plugin("RejectNodes").calls == 0


def test_batch_and_per_node_filters_combine_and_diagnose() -> None:
    snap = _snapshot(6)
    fwk = _framework(
        snap,
        config=(PluginConfig("RejectNodes", {"nodes": ["n3"]}),),
        filter=_set("BatchOdd", "RejectNodes"),
    )
    state = CycleState()
    out = fwk.find_feasible(state, POD, snap, 100, 0)
    assert list(out.feasible) == [1, 5]
    statuses = out.diagnose()
    assert {k: (s.plugin, s.message) for k, s in statuses.items()} == {
        "n0": ("BatchOdd", "even slot"),
        "n2": ("BatchOdd", "even slot"),
        "n4": ("BatchOdd", "even slot"),
        "n3": ("RejectNodes", "rejected by name"),
    }
    # The per-node plugin ran only where the batch mask allowed.
    assert fwk.plugin("RejectNodes").calls == 3


@pytest.mark.parametrize(
    ("num_to_find", "start", "feasible", "processed"),
    [
        pytest.param(2, 0, [1, 3], 4, id="first-two"),
        pytest.param(2, 4, [5, 7], 4, id="rotated"),
        pytest.param(2, 7, [7, 1], 3, id="wraps-around"),
        pytest.param(100, 3, [3, 5, 7, 1], 8, id="all"),
    ],
)
def test_sampling_rotates_and_stops(
    num_to_find: int, start: int, feasible: list[int], processed: int
) -> None:
    snap = _snapshot(8)
    fwk = _framework(snap, filter=_set("BatchOdd"))
    out = fwk.find_feasible(CycleState(), POD, snap, num_to_find, start)
    assert list(out.feasible) == feasible
    assert out.processed == processed


def test_scores_are_normalized_then_weighted() -> None:
    snap = _snapshot(4)
    fwk = _framework(snap, score=_set("BatchOdd", "Normalizing", weights={"Normalizing": 3}))
    totals = fwk.run_score(CycleState(), POD, snap, np.array([1, 2, 3], dtype=np.int64))
    assert not isinstance(totals, Status)
    # BatchOdd: slot (weight 1); Normalizing: 2*slot scaled to 100 at the top (weight 3).
    assert list(totals) == [1 + 3 * 33, 2 + 3 * 66, 3 + 3 * 100]


@pytest.mark.parametrize(
    ("plugin", "score"),
    [
        pytest.param("Crashy", 1000, id="above"),
        # The range check reads int64 scores as uint64 in one pass: a negative one is caught.
        pytest.param("Negative", -1, id="negative"),
    ],
)
def test_score_out_of_range_is_an_error(plugin: str, score: int) -> None:
    snap = _snapshot(2)
    fwk = _framework(snap, score=_set(plugin))
    status = fwk.run_score(CycleState(), POD, snap, np.array([0, 1], dtype=np.int64))
    assert isinstance(status, Status) and status.code == Code.ERROR
    assert f"invalid score {score}" in status.message and status.plugin == plugin


def test_reserve_failure_and_unreserve_in_reverse_order() -> None:
    log: list[str] = []
    snap = _snapshot(1)
    fwk = _framework(snap, log, reserve=_set("RecorderA", "RecorderB"))
    status = fwk.run_reserve(CycleState(), POD, "n0")
    assert status is not None and status.plugin == "RecorderB"
    fwk.run_unreserve(CycleState(), POD, "n0")
    assert log == ["reserveA", "reserveB", "unreserveB", "unreserveA"]


def test_bind_skip_passes_to_next_binder() -> None:
    snap = _snapshot(1)
    fwk = _framework(snap, bind=_set("SkipBinder", "Binder"))
    assert fwk.run_bind(CycleState(), POD, "n0") is None
    assert fwk.plugin("Binder").bound == [("p", "n0")]


def test_all_binders_skip_is_an_error() -> None:
    snap = _snapshot(1)
    fwk = _framework(snap, bind=_set("SkipBinder"))
    status = fwk.run_bind(CycleState(), POD, "n0")
    assert status is not None and status.code == Code.ERROR


def test_multi_point_enables_every_implemented_extension_point() -> None:
    snap = _snapshot(2)
    fwk = _framework(snap, multi_point=_set("BatchOdd"))
    assert fwk.plugins_at("filter") == ["BatchOdd"]
    assert fwk.plugins_at("score") == ["BatchOdd"]
    assert fwk.plugins_at("reserve") == []


class Timings:
    def __init__(self) -> None:
        self.points: list[tuple[str, str, str]] = []

    def extension_point(self, profile: str, ep: str, status: str, seconds: float) -> None:
        assert seconds >= 0
        self.points.append((profile, ep, status))

    def plugin(self, plugin: str, ep: str, status: str, seconds: float) -> None:
        self.points.append((plugin, ep, status))


def test_every_extension_point_is_timed() -> None:
    snap = _snapshot(2)
    plugins = Plugins(queue_sort=_set("Sort"), bind=_set("Binder"), filter=_set("Crashy"))
    timings = Timings()
    fwk = Framework(
        Profile(scheduler_name="t", plugins=plugins),
        _registry(),
        Handle(snap, None, None),
        observer=timings,
    )  # type: ignore[arg-type]
    state = CycleState()
    state.record_metrics = True
    fwk.run_pre_filter(state, POD)
    fwk.run_filter(state, POD, snap.info(0))
    fwk.run_bind(state, POD, "n0")
    assert ("t", "PreFilter", "Success") in timings.points
    assert ("Crashy", "Filter", "Error") in timings.points
    assert ("t", "Bind", "Success") in timings.points
