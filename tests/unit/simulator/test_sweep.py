"""Sweep files (``simulate --sweep``): the matrix they expand to, and one line per bad field."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.replay_job import ReplayUsageError
from scheduler.simulator.sweep import load_sweep
from tests.unit.simulator.test_replay_cli import NODES, PODS


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_a.csv").write_text(PODS)
    (tmp_path / "openb_pod_list_b.csv").write_text(PODS)
    return tmp_path


def _load(path: Path) -> object:
    return load_sweep(str(path), in_tree_registry(), default_plugins())


def test_matrix_order_labels_and_relative_paths(folder: Path) -> None:
    (folder / "sweep.yaml").write_text(
        "nodes: nodes.csv\n"
        "traces: [openb_pod_list_a.csv, openb_pod_list_b.csv]\n"
        "profiles: spread, fragmentation\n"
        "seeds: [3, 1]\n"
        "inflate: 1\n"
        "targetWorkload: learned\n"
        "variants:\n"
        "  strand2: {GPUFragmentation: {gradient: {strandedWeight: 2}}}\n"
        "  coarse: {GPUFragmentation: {gradient: {resolution: 500}}}\n"
    )
    plan = load_sweep(str(folder / "sweep.yaml"), in_tree_registry(), default_plugins())
    assert plan.nodes_path == str(folder / "nodes.csv")
    assert plan.seeds == (3, 1) and plan.inflate == 1.0
    cells = [(j.trace, j.policy, j.seed) for j in plan.jobs]
    policies = ["spread", "fragmentation", "fragmentation+strand2", "fragmentation+coarse"]
    assert cells == [
        (t, p, s) for t in ("openb_pod_list_a", "openb_pod_list_b") for p in policies
        for s in (3, 1)
    ]  # fmt: skip
    assert all(j.learned for j in plan.jobs)
    by_policy = {j.policy: j.config.parse().profiles[0] for j in plan.jobs}
    gradient = by_policy["fragmentation+strand2"].args_for("GPUFragmentation")["gradient"]
    # merged key by key: the profile's other gradient args stay
    assert gradient["strandedWeight"] == 2 and gradient["resolution"] == 100
    base = by_policy["fragmentation"].args_for("GPUFragmentation")["gradient"]
    assert base["strandedWeight"] == 1
    assert "sweep.yaml: variants.strand2 on fragmentation" in next(
        j.config.source for j in plan.jobs if j.policy == "fragmentation+strand2"
    )


def test_a_sweep_runs_into_one_results_table(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "sweep.yaml").write_text(
        "nodes: nodes.csv\ntraces: [openb_pod_list_a.csv]\nprofiles: [binpack]\nseeds: 1-2\n"
        "variants: {spread: {DeviceShare: {scoringStrategy: {type: LeastAllocated}}}}\n"
    )
    out = folder / "out"
    code = main(["simulate", "--sweep", str(folder / "sweep.yaml"), "--out", str(out),
                 "--no-plot"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["trace"], r["policy"], r["seeds"]) for r in rows] == [
        ("openb_pod_list_a", "binpack", "2"),
        ("openb_pod_list_a", "binpack+spread", "2"),
    ]
    assert all(0 <= float(r["unallocated_gpu_pct_mean"]) <= 100 for r in rows)


BASE = "nodes: nodes.csv\ntraces: [openb_pod_list_a.csv]\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(BASE + "tracse: []\n", "tracse: unknown field (known: nodes, tr", id="key"),
        pytest.param("traces: [a.csv]\n", "nodes: missing (required)", id="missing"),
        pytest.param(BASE + "seeds: 5-3\n", "seeds: expected seeds like 42-51", id="seeds"),
        pytest.param(BASE + "seeds: true\n", "seeds: expected seeds like", id="seeds-bool"),
        pytest.param(BASE + "inflate: lots\n", "inflate: expected a finite number", id="inflate"),
        pytest.param(BASE + "inflate: .inf\n", "inflate: expected a finite number", id="inf"),
        pytest.param(BASE + "targetWorkload: x\n", "targetWorkload: expected trace or", id="tw"),
        pytest.param(BASE + "profiles: [1, 2]\n", "profiles: expected a non-empty list", id="pt"),
        pytest.param(BASE + "profiles: [nope]\n", "profiles: unknown profile 'nope'", id="prof"),
        pytest.param("nodes: nodes.csv\ntraces: 7\n", "traces: expected a non-empty", id="tr"),
        pytest.param(BASE + "seeds: 1\nseeds: 2\n", "duplicate key 'seeds'", id="dup"),
        pytest.param(BASE + "seeds: [1\n", "invalid YAML", id="yaml"),
        pytest.param("- a\n", "expected a mapping of nodes, traces", id="list"),
        pytest.param("", "expected a mapping of nodes", id="empty"),
        pytest.param(
            "nodes: absent.csv\ntraces: [openb_pod_list_a.csv]\n", "absent.csv: cannot read",
            id="trace-path",
        ),
        pytest.param(BASE + "variants: [a]\n", "variants: expected a mapping", id="variants"),
        pytest.param(BASE + "variants: {'a b': {X: {}}}\n", "variants.a b: a variant", id="vn"),
        pytest.param(BASE + "variants: {v: 3}\n", "variants.v: expected a mapping", id="vv"),
        pytest.param(
            BASE + "variants: {v: {GPUFragmentation: 3}}\n",
            "variants.v.GPUFragmentation: expected a mapping of args",
            id="vargs",
        ),
        pytest.param(
            BASE + "profiles: [spread]\nvariants: {v: {GPUFragmentation: {}}}\n",
            "variants.v.GPUFragmentation: no profile of this sweep enables or configures it",
            id="unused",
        ),
        pytest.param(
            BASE + "profiles: [fragmentation]\n"
            "variants: {v: {GPUFragmentation: {strategy: Nonsense}}}\n",
            "variants.v on fragmentation: ",
            id="rejected-args",
        ),
    ],
)
def test_bad_sweep_is_one_line_naming_the_field(folder: Path, text: str, message: str) -> None:
    (folder / "sweep.yaml").write_text(text)
    with pytest.raises(ReplayUsageError) as info:
        _load(folder / "sweep.yaml")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(str(folder))  # the file is named


def test_sweep_and_matrix_flags_do_not_mix(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "sweep.yaml").write_text(BASE)
    argv = ["simulate", "--sweep", str(folder / "sweep.yaml"), "--seeds", "1-3"]
    assert main([*argv, "--out", str(folder / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seeds cannot be combined with a sweep file" in err


def test_unreadable_sweep_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--sweep", str(tmp_path / "absent.yaml"), "--out", str(tmp_path)]) == 2
    assert "cannot read the file: No such file or directory" in capsys.readouterr().err


def test_the_shipped_b3_sweep_is_the_held_out_matrix() -> None:
    root = Path(__file__).resolve().parents[3]
    path = root / "config" / "examples" / "sweep-b3-held-out.yaml"
    if not (root.parent / "shared" / "traces" / "alibaba-openb").is_dir():
        pytest.skip("the openb trace is not beside this checkout")
    plan = load_sweep(str(path), in_tree_registry(), default_plugins())
    assert len(plan.jobs) == 6 * 8 * 10
    assert plan.seeds == tuple(range(52, 62)) and plan.inflate == 1.3
    assert plan.expected is not None and Path(plan.expected).is_dir()
