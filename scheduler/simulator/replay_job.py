"""One trace replay as a self-contained task: what an executor ships and runs.

Role: a ``ReplayJob`` names one (trace, policy, seed) replay and carries everything a process
on another machine needs to run it except the trace rows: the policy's configuration as the
plain YAML document (``PolicyDoc``; the parsed configuration holds read-only mappings, which do
not pickle), the plugin registry (factories pickle by reference: every worker runs the same
koord-py) and the replay's settings. ``run_replay(job, nodes, pods)`` turns it into a
``RunRecord``; the executors differ only in how the rows reach it (``replay_from_paths`` reads
them on this machine, once per process; the Dask executor ships them once per worker).

Invariants: a job's result depends only on the job and the rows, never on the process that
runs it; user errors raise ``ReplayUsageError`` (one line, and it pickles, so a remote worker's
error reads the same as a local one); trace files are only read.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.config import ConfigError, Plugins, SchedulerConfiguration, parse_config
from scheduler.config import read_config_document as _read_document
from scheduler.framework.interfaces import PluginFactory
from scheduler.framework.runtime import FrameworkError
from scheduler.simulator.cluster import InMemoryCluster
from scheduler.simulator.replay import (
    ProgressFn,
    arrival,
    capacity_milli,
    node_order,
    prepare_config,
    replay,
    trace_shapes,
)
from scheduler.simulator.replay_report import RunRecord, discretize
from scheduler.simulator.run import simulated_scheduler
from scheduler.simulator.trace import TraceError, TraceNode, TracePod, read_nodes, read_pods

__all__ = [
    "PolicyDoc",
    "ReplayJob",
    "ReplayUsageError",
    "check_policy",
    "read_policy",
    "read_trace_nodes",
    "read_trace_pods",
    "replay_from_paths",
    "run_replay",
]


class ReplayUsageError(ValueError):
    """Bad trace-mode arguments or input; ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class PolicyDoc:
    """A policy's KubeSchedulerConfiguration as plain YAML data; ``source`` names it in
    errors (the file, or the sweep file and variant that produced it)."""

    source: str
    data: Any

    def parse(self) -> SchedulerConfiguration:
        try:
            config = parse_config(self.data, self.source)
        except ConfigError as exc:
            raise ReplayUsageError(str(exc)) from None
        if len(config.profiles) != 1:
            raise ReplayUsageError(f"{self.source}: a replay policy needs exactly one profile")
        return config


@dataclass(frozen=True, slots=True)
class ReplayJob:
    nodes_path: str
    pods_path: str
    trace: str
    policy: str
    config: PolicyDoc
    seed: int
    inflate: float
    learned: bool
    registry: Mapping[str, PluginFactory]
    default_plugins: Plugins | None

    @property
    def label(self) -> str:
        return f"{self.trace} {self.policy} seed {self.seed}"


def read_policy(path: str) -> PolicyDoc:
    """The file's document, validated here (so a bad file fails before any replay)."""
    try:
        doc = PolicyDoc(path, _read_document(path))
    except ConfigError as exc:
        raise ReplayUsageError(str(exc)) from None
    doc.parse()
    return doc


def check_policy(
    doc: PolicyDoc, registry: Mapping[str, PluginFactory], default_plugins: Plugins | None
) -> None:
    """Build the policy's plugins once on an empty cluster: bad plugin args fail here, once,
    not in every replay (on every worker) that uses them."""
    try:
        simulated_scheduler(doc.parse(), InMemoryCluster(), registry, default_plugins, 0).close()
    except FrameworkError as exc:
        raise ReplayUsageError(f"{doc.source}: {exc}") from None


@functools.lru_cache(maxsize=8)
def read_trace_nodes(path: str) -> tuple[TraceNode, ...]:
    try:
        return tuple(read_nodes(path))
    except TraceError as exc:
        raise ReplayUsageError(str(exc)) from None


@functools.lru_cache(maxsize=8)
def read_trace_pods(path: str) -> tuple[TracePod, ...]:
    try:
        return tuple(read_pods(path))
    except TraceError as exc:
        raise ReplayUsageError(str(exc)) from None


def run_replay(
    job: ReplayJob,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    progress: ProgressFn | None = None,
) -> RunRecord:
    ordered = node_order(nodes, job.seed)
    shapes = trace_shapes(pods)
    order = arrival(pods, capacity_milli(ordered), job.seed, job.inflate)
    config = prepare_config(job.config.parse(), None if job.learned else shapes, job.seed)
    try:
        result = replay(
            ordered,
            order,
            config,
            job.registry,
            job.default_plugins,
            shapes,
            seed=job.seed,
            progress=progress,
        )
    except FrameworkError as exc:
        raise ReplayUsageError(f"{job.config.source}: {exc}") from None
    return RunRecord(
        job.trace,
        job.policy,
        job.seed,
        discretize(result),
        len(order),
        result.failed,
        result.seconds,
    )


def replay_from_paths(job: ReplayJob, progress: ProgressFn | None = None) -> RunRecord:
    """The job with its rows read from its paths (cached per process: a process pool reads
    each trace once per process)."""
    return run_replay(
        job, read_trace_nodes(job.nodes_path), read_trace_pods(job.pods_path), progress
    )
