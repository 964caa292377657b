"""``simulate --executor dask://HOST:PORT`` on a real Dask cluster: a ``dask scheduler`` and two
``dask worker`` processes on loopback (``dask_cluster.py``).

The proof of issue 31: the same seeds give byte-identical CSVs and plots on the cluster as
locally (plain runs and sweep files); a worker SIGKILLed mid-sweep costs a re-run of its
replay, not a result; a bad input is one error line, before any task; Ctrl-C cancels the
cluster's tasks; an unreachable scheduler is one line within the connect timeout.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import main
from tests.integration.dask_cluster import ROOT, DaskCluster, cli_env, write_trace

pytest.importorskip("distributed", reason="the optional 'dask' extra")

TASK_PREFIX = "koord-replay-"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskCluster]:
    c = DaskCluster(tmp_path_factory.mktemp("dask")).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return write_trace(tmp_path_factory.mktemp("trace"), nodes=6, pods=40)


def _simulate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["simulate", "--no-progress", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _table(out: str) -> list[str]:
    """The printed table without the wall-clock column (the only part that may differ)."""
    return [line.rsplit("  ", 1)[0] if "seed" in line else line for line in out.splitlines()
            if not line.startswith("wrote")]  # fmt: skip


def _same_files(a: Path, b: Path) -> list[str]:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    return names


def _replay_tasks(client: Any) -> list[str]:
    keys = client.run_on_scheduler(lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks])
    return [k for k in keys if k.startswith(TASK_PREFIX)]


def test_results_equal_the_local_executor(
    cluster: DaskCluster, tiny: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = tiny
    argv = ["--nodes", nodes, "--pods", pods, "--seeds", "1-3", "--profiles",
            "binpack,fragmentation"]  # fmt: skip
    code, local_out, _ = _simulate([*argv, "--out", str(tmp_path / "local")], capsys)
    assert code == 0
    code, dask_out, err = _simulate(
        [*argv, "--out", str(tmp_path / "dask"), "--executor", cluster.executor], capsys
    )
    assert code == 0, err
    assert err == f"6 replays on {cluster.executor}: 2 workers, 2 threads\n"
    names = _same_files(tmp_path / "local", tmp_path / "dask")
    assert {"curves.csv", "results.csv"} <= set(names)
    assert _table(dask_out) == _table(local_out)


SWEEP = """\
nodes: {nodes}
traces: [{pods}]
profiles: [spread, fragmentation]
seeds: 5-6
inflate: 1.2
variants:
  strand2:
    GPUFragmentation: {{gradient: {{strandedWeight: 2}}}}
"""


def test_sweep_file_on_the_cluster_equals_local(
    cluster: DaskCluster, tiny: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = tiny
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP.format(nodes=nodes, pods=pods))
    code, local_out, err = _simulate(
        ["--sweep", str(sweep), "--out", str(tmp_path / "local"), "--jobs", "2", "--no-plot"],
        capsys,
    )
    assert code == 0, err
    code, dask_out, err = _simulate(
        ["--sweep", str(sweep), "--out", str(tmp_path / "dask"), "--no-plot",
         "--executor", cluster.executor],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    _same_files(tmp_path / "local", tmp_path / "dask")
    policies = [line.split(" (")[0] for line in dask_out.splitlines() if "(2 seeds)" in line]
    assert policies == ["spread", "fragmentation", "fragmentation+strand2"]  # spread: no GPUFrag.
    assert _table(dask_out) == _table(local_out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--pods", "{dir}/absent.csv"], "absent.csv: cannot read", id="trace-path"),
        pytest.param(["--pods", "{pods}", "--profiles", "{dir}/bad.yaml"], "weird", id="args"),
    ],
)
def test_bad_input_is_one_line_before_any_task(
    cluster: DaskCluster,
    tiny: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    nodes, pods = tiny
    (tmp_path / "bad.yaml").write_text(
        (ROOT / "config/profiles/fragmentation.yaml").read_text().replace("FirstFit", "weird")
    )
    args = [a.format(dir=tmp_path, pods=pods) for a in argv]
    code, out, err = _simulate(
        ["--nodes", nodes, *args, "--seeds", "1-4", "--executor", cluster.executor,
         "--out", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("koord-scheduler: error: ") and message in err
    client = cluster.client()
    try:
        assert _replay_tasks(client) == []
    finally:
        client.close()


def test_unreachable_scheduler_is_one_line_within_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny: tuple[str, str]
) -> None:
    nodes, pods = tiny
    start = time.monotonic()
    code, _, err = _simulate(
        ["--nodes", nodes, "--pods", pods, "--executor", "dask://127.0.0.1:9",
         "--connect-timeout", "2", "--out", str(tmp_path)],
        capsys,
    )  # fmt: skip
    assert code == 2
    assert err.startswith(
        "koord-scheduler: error: --executor dask://127.0.0.1:9: cannot reach the Dask scheduler "
        "within 2 s"
    )
    assert err.count("\n") == 1
    assert time.monotonic() - start < 30


def _default_sigint() -> None:
    """A shell starts a background job with SIGINT ignored, and the child inherits that (and
    then Python installs no KeyboardInterrupt handler): the CLI gets Ctrl-C as a terminal
    gives it, however this test run was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_cli(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "simulate", "--no-progress", *argv],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _wait_for_running(client: Any, deadline_s: float = 120) -> dict[str, list[str]]:
    """Worker address -> our replay tasks it holds, once some worker holds one."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        busy = {
            a: [str(k) for k in keys if str(k).startswith(TASK_PREFIX)]
            for a, keys in client.processing().items()
        }
        if any(busy.values()):
            return busy
        time.sleep(0.1)
    raise TimeoutError("no replay task reached a worker")


def test_ctrl_c_cancels_the_cluster_tasks(cluster: DaskCluster, tmp_path: Path) -> None:
    nodes, pods = write_trace(tmp_path, nodes=60, pods=300)
    proc = _start_cli(
        ["--nodes", nodes, "--pods", pods, "--seeds", "1-6", "--profiles", "binpack",
         "--no-plot", "--executor", cluster.executor, "--out", str(tmp_path / "out")]
    )  # fmt: skip
    client = cluster.client()
    try:
        _wait_for_running(client)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert list((tmp_path / "out").iterdir()) == []  # nothing half written
        deadline = time.monotonic() + 30
        while _replay_tasks(client) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _replay_tasks(client) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client.close()


def test_a_worker_killed_mid_sweep_costs_a_rerun_not_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # replays of a few seconds each, so that the kill lands inside one
    nodes, pods = write_trace(tmp_path, nodes=60, pods=300)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"nodes: {nodes}\ntraces: [{pods}]\nprofiles: [binpack, fragmentation]\nseeds: 1-2\n"
    )
    (tmp_path / "cluster").mkdir()
    cluster = DaskCluster(tmp_path / "cluster").start()  # its own: this test kills a worker
    client = cluster.client()
    try:
        proc = _start_cli(
            ["--sweep", str(sweep), "--no-plot", "--executor", cluster.executor,
             "--out", str(tmp_path / "dask")]
        )  # fmt: skip
        busy = _wait_for_running(client)
        names = cluster.worker_names(client)
        address = next(a for a, keys in busy.items() if keys)
        victim = names[address]
        time.sleep(0.5)  # inside its first replay (imports + the replay: seconds), not before
        cluster.kill_worker(victim)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert len(client.scheduler_info()["workers"]) == 1
        # the scheduler's own record: the worker died with a replay in flight
        removed = [m for _, m in client.get_events(address) if m.get("action") == "remove-worker"]
        assert len(removed) == 1
        assert any(str(k).startswith(TASK_PREFIX) for k in removed[0]["processing-tasks"])
    finally:
        client.close()
        cluster.stop()
    code, _, err = _simulate(
        ["--sweep", str(sweep), "--no-plot", "--jobs", "2", "--out", str(tmp_path / "local")],
        capsys,
    )
    assert code == 0, err
    _same_files(tmp_path / "local", tmp_path / "dask")
