"""What a replay study runs: traces x policies x seeds, as ``ReplayJob`` s in a fixed order.

Role: shared by the command line (``simulate --nodes --pods --profiles --seeds``) and the sweep
file (``simulate --sweep``): resolve profile names to files, parse seed lists, read and check
every input once, and expand the matrix into jobs. A ``Plan`` also carries what the report
needs (the trace files, seeds, inflation, the paper's results folder).

Invariants: every input is read and validated here, on the machine that starts the study,
before any replay runs — a bad trace path or policy is one error, reported once; the job order
is trace, then policy, then seed, as given (the CSV and table follow it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.config import Plugins
from scheduler.framework.interfaces import PluginFactory
from scheduler.simulator.replay_job import (
    PolicyDoc,
    ReplayJob,
    ReplayUsageError,
    check_policy,
    read_policy,
    read_trace_nodes,
    read_trace_pods,
)

__all__ = [
    "DEFAULT_PROFILES",
    "Plan",
    "Policy",
    "build_plan",
    "parse_seeds",
    "resolve_profile",
]

DEFAULT_PROFILES = "binpack,spread,fragmentation"


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    doc: PolicyDoc


@dataclass(frozen=True, slots=True)
class Plan:
    nodes_path: str
    pods_paths: tuple[str, ...]
    seeds: tuple[int, ...]
    inflate: float
    expected: str | None
    jobs: tuple[ReplayJob, ...]


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else ("", "")
                first, last = int(lo), int(hi)
                if last < first:
                    raise ValueError
                seeds.extend(range(first, last + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ReplayUsageError(f"--seeds: bad seed or range {part!r} (e.g. 42-51)") from None
    return list(dict.fromkeys(seeds))


def _profile_dirs() -> list[Path]:
    here = Path(__file__).resolve().parents[2] / "config" / "profiles"
    return [Path("config") / "profiles", here]


def resolve_profile(name: str, what: str = "--profiles") -> tuple[str, str]:
    """(policy name, config path) for a profile name or a config file path."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        if not os.path.isfile(name):
            raise ReplayUsageError(f"{what}: no such file {name!r}")
        return Path(name).stem, name
    for d in _profile_dirs():
        path = d / f"{name}.yaml"
        if path.is_file():
            return name, os.fspath(path)
    known = sorted({p.stem for d in _profile_dirs() if d.is_dir() for p in d.glob("*.yaml")})
    raise ReplayUsageError(
        f"{what}: unknown profile {name!r} (known: {', '.join(known) or 'none found'})"
    )


def read_policies(
    names: Sequence[str],
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
    what: str = "--profiles",
) -> list[Policy]:
    policies = []
    for name in names:
        label, path = resolve_profile(name, what)
        doc = read_policy(path)
        check_policy(doc, registry, default_plugins)
        policies.append(Policy(label, doc))
    return policies


def build_plan(
    nodes_path: str,
    pods_paths: Sequence[str],
    policies: Sequence[Policy],
    seeds: Sequence[int],
    inflate: float,
    learned: bool,
    registry: Mapping[str, PluginFactory],
    default_plugins: Plugins | None,
    expected: str | None = None,
) -> Plan:
    if not (math.isfinite(inflate) and inflate >= 0):  # nan passes `< 0`; inf never ends
        raise ReplayUsageError(f"--inflate: must be a finite number >= 0, got {inflate}")
    labels = [p.name for p in policies]
    twice = sorted({n for n in labels if labels.count(n) > 1})
    if twice:
        raise ReplayUsageError(f"policy {twice[0]!r} appears twice (names label the results)")
    read_trace_nodes(nodes_path)
    for path in pods_paths:
        read_trace_pods(path)
    jobs = tuple(
        ReplayJob(
            nodes_path,
            path,
            Path(path).stem,
            policy.name,
            policy.doc,
            seed,
            inflate,
            learned,
            registry,
            default_plugins,
        )
        for path in pods_paths
        for policy in policies
        for seed in seeds
    )
    return Plan(nodes_path, tuple(pods_paths), tuple(seeds), inflate, expected, jobs)
