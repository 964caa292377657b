"""Where replays run: ``--executor local`` (this machine) or ``--executor dask://HOST:PORT``.

Role: parse the ``--executor`` value and run a list of ``ReplayJob`` s, returning their
records in job order. ``local`` is the serial loop (``--jobs 1``, with a per-pod bar) or a
process pool (``--jobs N``); ``dask://`` hands the jobs to an existing Dask cluster
(``scheduler.simulator.dask_executor``, imported only then: Dask is the optional ``dask``
extra, and without it the error names the extra).

Invariants: the result is always ``len(jobs)`` records in the jobs' order, whatever order
they finished in, so the CSV and plots of a run do not depend on the executor; ``done`` is
called once per finished replay (the progress bar counts them).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from scheduler.simulator.replay import ProgressFn
from scheduler.simulator.replay_job import ReplayJob, ReplayUsageError, replay_from_paths
from scheduler.simulator.replay_report import RunRecord

__all__ = [
    "DASK_EXTRA_HINT",
    "Executor",
    "ExecutorSpec",
    "LocalExecutor",
    "make_executor",
    "parse_executor",
]

DASK_EXTRA_HINT = "pip install 'koord-py[dask]'"

DoneFn = Callable[[int, int], None]
"""``done(finished, total)`` after each replay."""
PodTickFn = Callable[[ReplayJob, int, int], ProgressFn]
"""For the serial loop: the per-pod progress callback of job ``i`` of ``n``."""


class Executor(Protocol):
    def run(self, jobs: Sequence[ReplayJob], done: DoneFn) -> list[RunRecord]: ...


@dataclass(frozen=True, slots=True)
class ExecutorSpec:
    kind: str  # "local" | "dask"
    address: str = ""  # dask: tcp://HOST:PORT

    def __str__(self) -> str:
        return "local" if self.kind == "local" else f"dask://{self.address.removeprefix('tcp://')}"


def parse_executor(text: str) -> ExecutorSpec:
    """``local`` or ``dask://HOST:PORT`` (a host name, IPv4 or ``[IPv6]``)."""
    value = text.strip()
    if value == "local":
        return ExecutorSpec("local")
    if value.startswith("dask://"):
        hostport = value.removeprefix("dask://").rstrip("/")
        host, sep, port = hostport.rpartition(":")
        bare = host.strip("[]")
        if (
            sep
            and bare
            and port.isdigit()
            and 0 < int(port) < 65536
            and "/" not in hostport
            and all(c.isalnum() or c in ".-_:" for c in bare)
        ):
            return ExecutorSpec("dask", f"tcp://{host}:{int(port)}")
        raise ReplayUsageError(
            f"--executor {text!r}: expected dask://HOST:PORT (the Dask scheduler's address, "
            "e.g. dask://10.0.0.5:8786)"
        )
    raise ReplayUsageError(f"--executor {text!r}: expected 'local' or dask://HOST:PORT")


class LocalExecutor:
    """Today's executor: serial (a bar per pod) or ``workers`` processes on this machine."""

    def __init__(self, workers: int, pod_tick: PodTickFn | None = None) -> None:
        self.workers = max(1, workers)
        self.pod_tick = pod_tick

    def run(self, jobs: Sequence[ReplayJob], done: DoneFn) -> list[RunRecord]:
        records: list[RunRecord] = []
        if self.workers == 1:
            for i, job in enumerate(jobs):
                tick = self.pod_tick(job, i, len(jobs)) if self.pod_tick else None
                records.append(replay_from_paths(job, tick))
                done(i + 1, len(jobs))
            return records
        with ProcessPoolExecutor(max_workers=self.workers) as pool:
            done(0, len(jobs))
            for i, record in enumerate(pool.map(replay_from_paths, jobs)):
                records.append(record)
                done(i + 1, len(jobs))
        return records


def make_executor(
    spec: ExecutorSpec,
    jobs: int,
    connect_timeout: float,
    pod_tick: PodTickFn | None = None,
    info: Callable[[str], None] = lambda _line: None,
) -> Executor:
    """``info`` gets the lines worth telling the user (where the replays go, warnings)."""
    if spec.kind == "local":
        return LocalExecutor(jobs, pod_tick)
    if importlib.util.find_spec("distributed") is None:
        raise ReplayUsageError(
            f"--executor {spec}: Dask is not installed; it is the optional 'dask' extra: "
            f"{DASK_EXTRA_HINT}"
        )
    if jobs != 1:
        raise ReplayUsageError(
            f"--jobs applies to --executor local; on {spec} the cluster runs one replay per "
            "worker thread (start workers with --nthreads 1)"
        )
    from scheduler.simulator.dask_executor import DaskExecutor

    return DaskExecutor(spec.address, str(spec), connect_timeout, info)
