"""``--executor``: parsing, the local executor's order, and Dask as an optional extra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from scheduler.cli import main
from scheduler.plugins.registry import default_plugins, in_tree_registry
from scheduler.simulator.executors import (
    ExecutorSpec,
    LocalExecutor,
    make_executor,
    parse_executor,
)
from scheduler.simulator.replay_job import ReplayUsageError
from scheduler.simulator.replay_plan import Plan, build_plan, read_policies
from tests.unit.simulator.test_replay_cli import NODES, PODS


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        pytest.param("local", ExecutorSpec("local"), id="local"),
        pytest.param("dask://10.0.0.5:8786", ExecutorSpec("dask", "tcp://10.0.0.5:8786"), id="ip"),
        pytest.param(
            "dask://sched-0.lab:8786/", ExecutorSpec("dask", "tcp://sched-0.lab:8786"), id="host"
        ),
        pytest.param("dask://[::1]:8786", ExecutorSpec("dask", "tcp://[::1]:8786"), id="ipv6"),
    ],
)
def test_parse_executor(text: str, spec: ExecutorSpec) -> None:
    assert parse_executor(text) == spec
    assert str(spec) == text.rstrip("/")


@pytest.mark.parametrize(
    "text",
    ["", "lokal", "dask://", "dask://host", "dask://host:0", "dask://host:65536", "dask://:1",
     "dask://h:80/path", "dask://h;rm:80", "tcp://h:80"],
)  # fmt: skip
def test_bad_executor_is_one_line(text: str) -> None:
    with pytest.raises(ReplayUsageError, match=r"^--executor .*(local|dask://HOST:PORT)"):
        parse_executor(text)


def test_without_dask_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(ReplayUsageError) as info:
        make_executor(parse_executor("dask://127.0.0.1:8786"), 1, 10.0)
    assert str(info.value) == (
        "--executor dask://127.0.0.1:8786: Dask is not installed; it is the optional 'dask' "
        "extra: pip install 'koord-py[dask]'"
    )


def test_jobs_belongs_to_the_local_executor() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(ReplayUsageError, match="--jobs applies to --executor local"):
        make_executor(parse_executor("dask://127.0.0.1:8786"), 2, 10.0)


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    registry, defaults = in_tree_registry(), default_plugins()
    policies = read_policies(["binpack", "spread"], registry, defaults)
    return build_plan(
        str(tmp_path / "nodes.csv"), [str(tmp_path / "pods.csv")], policies, [3, 1], 1.3,
        False, registry, defaults,
    )  # fmt: skip


def test_local_pool_equals_serial_in_job_order(plan: Plan) -> None:
    ticks: list[tuple[int, int]] = []
    serial = LocalExecutor(1).run(plan.jobs, lambda d, t: ticks.append((d, t)))
    assert ticks == [(1, 4), (2, 4), (3, 4), (4, 4)]
    pooled = LocalExecutor(2).run(plan.jobs, lambda d, t: None)
    assert [(r.policy, r.seed) for r in pooled] == [
        ("binpack", 3), ("binpack", 1), ("spread", 3), ("spread", 1)
    ]  # fmt: skip
    for a, b in zip(serial, pooled, strict=True):
        assert (a.policy, a.seed, a.pods, a.failed) == (b.policy, b.seed, b.pods, b.failed)
        np.testing.assert_array_equal(a.curves.allocated, b.curves.allocated)
        np.testing.assert_array_equal(a.curves.fragmented, b.curves.fragmented)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--executor", "garbage"], "--executor 'garbage': expected 'local'", id="ex"),
        pytest.param(["--connect-timeout", "0"], "--connect-timeout: must be > 0", id="timeout"),
        pytest.param(["--jobs", "0"], "--jobs: must be >= 1, got 0", id="jobs"),
        pytest.param(["--inflate", "nan"], "--inflate: must be a finite number", id="nan"),
        pytest.param(["--inflate", "inf"], "--inflate: must be a finite number", id="inf"),
        pytest.param(["--profiles", "binpack,binpack"], "policy 'binpack' appears twice", id="2x"),
    ],
)
def test_cli_rejects_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    code = main(["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods",
                 str(tmp_path / "pods.csv"), "--out", str(tmp_path / "out"), *argv])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err
