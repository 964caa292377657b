"""Replays on an existing Dask cluster (``--executor dask://HOST:PORT``).

Role: the only module importing Dask (``distributed``, the optional ``dask`` extra). It
connects a client to a scheduler the user started (``dask scheduler`` / ``dask worker``, or a
``LocalCluster``), ships each trace's parsed rows in the task graph (about 0.3 MB and 70 ms
to unpickle per openb trace, under 1% of a replay even if a worker fetches them for every
replay, and no shared filesystem needed — docs/benchmarks.md), submits one task per replay
and collects the records as they finish.

Invariants:

- Records come back in the jobs' order (``run`` fills slot ``i`` for job ``i``), so the CSV
  is byte-identical to a local run of the same jobs.
- A worker lost mid-replay is Dask's business: its scheduler runs the task again elsewhere
  (up to its ``distributed.scheduler.allowed-failures``); a half replay never returns, since a
  task's result is the whole record. Task exceptions are not retried: a replay is
  deterministic, so it would fail again.
- The first failed replay stops the run: the other tasks are cancelled and the error is one
  line (``ReplayUsageError``); nothing is written. So is Ctrl-C (the futures are cancelled
  before ``KeyboardInterrupt`` goes on). The client is always closed.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from distributed import Client, Future, KilledWorker, as_completed

from scheduler.simulator.replay_job import (
    ReplayJob,
    ReplayUsageError,
    read_trace_nodes,
    read_trace_pods,
    run_replay,
)
from scheduler.simulator.replay_report import RunRecord

__all__ = ["DaskExecutor"]

DoneFn = Callable[[int, int], None]


class DaskExecutor:
    def __init__(
        self,
        address: str,
        label: str,
        connect_timeout: float,
        info: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.address, self.label, self.timeout, self.info = address, label, connect_timeout, info

    def run(self, jobs: Sequence[ReplayJob], done: DoneFn) -> list[RunRecord]:
        if not jobs:
            return []
        client = self._connect()
        futures: list[Future[RunRecord]] = []
        rows: dict[str, Future[Any]] = {}
        try:
            self._describe(client, len(jobs))
            token = uuid.uuid4().hex[:12]
            rows = self._ship(client, jobs, token)
            for i, job in enumerate(jobs):
                futures.append(
                    client.submit(
                        run_replay,
                        job,
                        rows[job.nodes_path],
                        rows[job.pods_path],
                        key=f"koord-replay-{token}-{i:06d}",
                        pure=False,
                        retries=0,
                    )
                )
            index = {f.key: i for i, f in enumerate(futures)}
            records: list[RunRecord | None] = [None] * len(jobs)
            done(0, len(jobs))
            for finished, future in enumerate(as_completed(futures, loop=client.loop), 1):
                i = index[future.key]
                records[i] = self._result(future, jobs[i])
                done(finished, len(jobs))
            return [r for r in records if r is not None]
        except BaseException:  # a failed replay, Ctrl-C: nothing may keep running for us
            if futures or rows:
                client.cancel([*futures, *rows.values()], force=True)
            raise
        finally:
            client.close()

    def _connect(self) -> Client:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                client = Client(self.address, timeout=self.timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise ReplayUsageError(
                f"--executor {self.label}: cannot reach the Dask scheduler within "
                f"{self.timeout:g} s ({_first_line(exc)})"
            ) from None
        for warning in caught:  # e.g. version mismatches: one line each, not a table
            self.info(f"warning: {self.label}: {_first_line(warning.message)}")
        try:
            client.wait_for_workers(1, timeout=self.timeout)
        except (OSError, TimeoutError):
            client.close()
            raise ReplayUsageError(
                f"--executor {self.label}: no Dask worker joined within {self.timeout:g} s "
                "(start some with: dask worker ADDRESS --nthreads 1)"
            ) from None
        return client

    def _describe(self, client: Client, replays: int) -> None:
        workers = client.scheduler_info()["workers"].values()
        threads = sum(int(w.get("nthreads", 1)) for w in workers)
        self.info(
            f"{_count(replays, 'replay')} on {self.label}: {_count(len(workers), 'worker')}, "
            f"{_count(threads, 'thread')}"
        )
        if any(int(w.get("nthreads", 1)) > 1 for w in workers):
            self.info(
                f"warning: {self.label}: workers with several threads run replays under one "
                "GIL; start them with --nthreads 1 (and --nworkers N per machine)"
            )

    @staticmethod
    def _ship(client: Client, jobs: Sequence[ReplayJob], token: str) -> dict[str, Future[Any]]:
        """Each trace file's rows as the result of a task (read here, so a bad path is
        reported once, before any task). Not ``scatter``: scattered data lives only on the
        workers that hold it — Dask's memory manager drops the extra replicas of a broadcast —
        and dies with them; a task's result is recomputed from the graph when lost."""
        rows: dict[str, Any] = {}
        for job in jobs:
            if job.nodes_path not in rows:
                rows[job.nodes_path] = read_trace_nodes(job.nodes_path)
            if job.pods_path not in rows:
                rows[job.pods_path] = read_trace_pods(job.pods_path)
        return {
            path: client.submit(_rows, value, key=f"koord-trace-{token}-{i:03d}", pure=False)
            for i, (path, value) in enumerate(rows.items())
        }

    def _result(self, future: Future[RunRecord], job: ReplayJob) -> RunRecord:
        try:
            record: RunRecord = future.result()
        except ReplayUsageError:
            raise
        except KilledWorker:
            raise ReplayUsageError(
                f"{self.label}: replay {job.label} was running on every worker Dask lost "
                "until it gave up (its allowed-failures); no results were written"
            ) from None
        except ImportError as exc:
            raise ReplayUsageError(
                f"{self.label}: a worker cannot run replay {job.label}: {_first_line(exc)} "
                "(every worker needs the same koord-py installed)"
            ) from None
        except Exception as exc:
            raise ReplayUsageError(
                f"{self.label}: replay {job.label} failed on a worker: "
                f"{type(exc).__name__}: {_first_line(exc)}"
            ) from None
        return record


def _rows(value: Any) -> Any:
    """A task whose result is its argument: the trace rows as recomputable task output."""
    return value


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__
