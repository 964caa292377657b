"""``koord-scheduler simulate --nodes --pods``: arguments, profiles, table, CSV and plot."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.config import load_config
from scheduler.core import Scheduler
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.replay_cli import ReplayUsageError, parse_seeds, resolve_profile

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i},{cpu},262144,{gpus},{model}\n"
    for i, (cpu, gpus, model) in enumerate([(96000, 8, "G2"), (32000, 2, "T4"), (16000, 1, "T4")])
)
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
PODS = POD_HEADER + "".join(
    f"p{i},{cpu},1024,{n},{m},,LS,Running,0,1,0\n"
    for i, (cpu, n, m) in enumerate(
        [(2000, 1, 110)] * 30 + [(1000, 0, 0), (4000, 1, 1000), (2000, 1, 220)] * 5
    )
)  # fmt: skip


@pytest.fixture
def trace(tmp_path: Path) -> tuple[str, str]:
    nodes = tmp_path / "openb_node_list_gpu_node.csv"
    pods = tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return str(nodes), str(pods)


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        pytest.param("42", [42], id="one"),
        pytest.param("42-45", [42, 43, 44, 45], id="range"),
        pytest.param("1,3-4,1", [1, 3, 4], id="list-and-range"),
    ],
)
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["x", "5-3", "4-"], ids=["word", "backwards", "open"])
def test_bad_seeds(text: str) -> None:
    with pytest.raises(ReplayUsageError, match="--seeds"):
        parse_seeds(text)


@pytest.mark.parametrize(
    "name",
    ["binpack", "spread", "fragmentation", "random", "bestfit", "fgd", "dotprod", "clustering",
     "packing"],
    ids=str,
)
def test_profiles_resolve(name: str) -> None:
    policy, path = resolve_profile(name)
    assert policy == name and Path(path).is_file()


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ReplayUsageError, match=r"unknown profile 'nope' .*binpack"):
        resolve_profile("nope")


def test_replay_side_by_side(
    trace: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            "--nodes",
            nodes,
            "--pods",
            pods,
            "--seeds",
            "1-2",
            "--profiles",
            "binpack,fragmentation",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""  # stdout is not a terminal: no progress bar
    lines = captured.out.splitlines()
    assert lines[0].startswith("TRACE openb_pod_list_tiny (45 pods on 3 nodes with 11 GPUs")
    assert lines[2].startswith("binpack (2 seeds)") and lines[3].startswith("fragmentation")
    assert " - " not in lines[2] and " - " not in lines[3]  # every column has a value
    with open(out / "curves.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["policy"], r["seed"]) for r in rows} == {
        ("binpack", "1"),
        ("binpack", "2"),
        ("fragmentation", "1"),
        ("fragmentation", "2"),
    }
    assert (out / "openb_pod_list_tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_prints_the_lower_bound_below_every_policy(
    trace: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("highspy", reason="--bound needs the optional 'bound' extra (highspy)")
    nodes, pods = trace
    argv = ["simulate", "--nodes", nodes, "--pods", pods, "--seeds", "1-2", "--no-plot"]
    code = main([*argv, "--profiles", "binpack,fragmentation", "--out", str(tmp_path), "--bound"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = {line.split("  ")[0]: line for line in captured.out.splitlines()}
    bound_row = next(line for name, line in rows.items() if name.startswith("lower bound"))

    def mean(line: str) -> float:
        return float(line.split("±")[0].split()[-1])

    policies = [line for name, line in rows.items() if name.startswith(("binpack", "fragment"))]
    assert len(policies) == 2
    assert all(mean(bound_row) <= mean(line) + 1e-9 for line in policies)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--pods", "x.csv"], "needs both --nodes", id="no-nodes"),
        pytest.param(["--nodes", "{nodes}", "--pods", "absent.csv"], "cannot read", id="io"),
        pytest.param(
            ["--nodes", "{nodes}", "--pods", "{pods}", "--profiles", "nope"],
            "unknown profile",
            id="profile",
        ),
    ],
)
def test_usage_errors(
    trace: tuple[str, str], argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    args = [a.format(nodes=nodes, pods=pods) for a in argv]
    assert main(["simulate", *args, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("koord-scheduler: error: ") and message in err


def test_scenario_file_still_required_without_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 2
    assert "needs a scenario FILE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name",
    ["binpack", "spread", "fragmentation", "random", "bestfit", "fgd", "dotprod", "clustering",
     "packing"],
    ids=str,
)
def test_profiles_are_complete_scheduler_configurations(name: str) -> None:
    # What `koord-scheduler run --config config/profiles/<name>.yaml` builds.
    _, path = resolve_profile(name)
    config = load_config(path)
    sched = Scheduler(config, InMemoryCluster(), in_tree_registry(), default_plugins())
    try:
        assert list(sched.profiles) == ["koord-scheduler"]
        assert config.percentage_of_nodes_to_score == 100
    finally:
        sched.close()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("delay", "ticks", "expected"),
    [
        pytest.param(
            0.0,
            [(10.0, 50, 100)],
            "\rreplay [###############...............] 50/100 5.0/s ETA 10s\x1b[K",
            id="rate-and-eta",
        ),
        pytest.param(
            0.0,
            [(2.0, 1, 1000)],
            "\rreplay [..............................] 1/1000 0.5/s ETA 33m18s\x1b[K",
            id="minutes",
        ),
        pytest.param(5.0, [(1.0, 10, 100)], "", id="quiet-before-delay"),
        pytest.param(
            0.0,
            [(0.0, 0, 10)],
            "\rreplay [..............................] 0/10 0.0/s ETA ?\x1b[K",
            id="no-rate-yet",
        ),
    ],
)
def test_progress_shows_rate_and_eta(
    delay: float, ticks: list[tuple[float, int, int]], expected: str
) -> None:
    from scheduler.simulator.replay_cli import Progress

    now = [0.0]
    stream = _Tty()
    bar = Progress(stream, True, delay=delay, clock=lambda: now[0])
    for at, done, total in ticks:
        now[0] = at
        bar.draw("replay", done, total, force=True)
    assert stream.getvalue() == expected


def test_progress_is_silent_when_disabled() -> None:
    from scheduler.simulator.replay_cli import Progress

    stream = _Tty()
    bar = Progress(stream, False)
    bar.draw("replay", 1, 2, force=True)
    bar.done()
    assert stream.getvalue() == ""
