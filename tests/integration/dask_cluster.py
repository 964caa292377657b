"""A real Dask cluster for tests: ``dask scheduler`` and ``dask worker`` s as separate processes.

Each runs in its own process group (so a kill takes the whole process with it), on loopback
only, with ``PYTHONPATH`` at this checkout (the workers must unpickle this tree's replay jobs,
not an installed copy's), no dashboard and no nanny (a killed worker stays dead). Every wait
is bounded; ``stop`` ends every process this helper started, by its own handle.
Also: ``write_trace``, a deterministic synthetic openb trace of any size.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0  # a loaded 2-core machine imports distributed slowly


def cli_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


class DaskCluster:
    def __init__(self, directory: Path, workers: int = 2) -> None:
        self.directory = directory
        self.names = [f"w{i + 1}" for i in range(workers)]
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.address = ""

    @property
    def executor(self) -> str:
        return self.address.replace("tcp://", "dask://")

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=self.directory,
            env=cli_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self) -> DaskCluster:
        info = self.directory / "scheduler.json"
        self.scheduler = self._spawn(
            "scheduler",
            ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--scheduler-file", str(info), "--no-dashboard"],
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not info.exists() or not info.read_text().strip():
            self._check_deadline(deadline, "the scheduler wrote no address")
            time.sleep(0.2)
        self.address = json.loads(info.read_text())["address"]
        for name in self.names:
            self.workers[name] = self._spawn(
                name,
                ["distributed.cli.dask_worker", self.address, "--name", name, "--nthreads", "1",
                 "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                 "--local-directory", str(self.directory / name)],
            )  # fmt: skip
        self.wait_for_workers(len(self.names), deadline)
        return self

    def _check_deadline(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            logs = {p.name: p.read_text()[-2000:] for p in self.directory.glob("*.log")}
            raise TimeoutError(f"dask cluster: {what} within {START_TIMEOUT:g} s; logs: {logs}")

    def client(self) -> Any:
        from distributed import Client

        return Client(self.address, timeout=30, set_as_default=False)

    def wait_for_workers(self, n: int, deadline: float) -> None:
        client = self.client()
        try:
            while len(client.scheduler_info()["workers"]) < n:
                self._check_deadline(deadline, f"{n} workers did not join")
                time.sleep(0.2)
        finally:
            client.close()

    def worker_names(self, client: Any) -> dict[str, str]:
        """Worker address -> name."""
        return {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}

    def kill_worker(self, name: str) -> None:
        proc = self.workers[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        procs = [*self.workers.values(), *([self.scheduler] if self.scheduler else [])]
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:  # a worker inside a (cancelled) replay finishes it first: do not wait for that
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)


def write_trace(directory: Path, nodes: int, pods: int, seed: int = 7) -> tuple[str, str]:
    """An openb-shaped node list and pod list (paths); the same arguments, the same files."""
    rng = random.Random(seed)
    node_path = directory / "openb_node_list_synthetic.csv"
    pod_path = directory / f"openb_pod_list_synthetic{pods}.csv"
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(nodes):
        gpus, model = rng.choice([(8, "V100M16"), (4, "T4"), (2, "T4"), (1, "P100"), (8, "G2")])
        rows.append(f"n{i},{gpus * 12000},{gpus * 65536},{gpus},{model}")
    node_path.write_text("\n".join(rows) + "\n")
    rows = [
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time"
    ]
    for i in range(pods):
        n, milli = rng.choice([(1, 250), (1, 500), (1, 1000), (2, 1000), (0, 0), (1, 100)])
        cpu = rng.choice([1000, 2000, 4000, 8000])
        rows.append(f"p{i},{cpu},2048,{n},{milli},,LS,Running,0,1,0")
    pod_path.write_text("\n".join(rows) + "\n")
    return str(node_path), str(pod_path)
