"""Curves, tables and CSV of trace replays, and the FGD paper's results to compare with.

Role: reduce a replay (one reading per arriving pod) to the paper's curves — for each arrived
GPU request from 0% to 130% of capacity (rounded to whole percents, half to even as pandas
does), the mean over the pods at that percent of the allocated GPU % (and so the unallocated
GPU %, ``100 - allocated``), the fragmented GPU % and the occupied nodes; a percent no pod
landed on takes the mean of its neighbours within 1 (``merge_alloc_discrete``). Then: the
comparison table (mean ± sample std over seeds of the unallocated GPU % at 100% arrival, per
policy, beside the paper's numbers for the same trace), and a long-format CSV of the curves.

``PaperResults`` reads the artifact's cached results (``fgd_expected_results/``:
``analysis_allo_discrete.csv``, ``analysis_frag_discrete.csv``,
``derived_unalloc_at_arrival100.csv``) from a path given at run time; nothing of it is copied.

Invariants: curves have ``ARRIVAL_POINTS`` entries (NaN where the run never got there);
rendering never fails on missing paper data (those columns are left out).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.simulator.replay import ReplayResult

__all__ = [
    "ARRIVAL_POINTS",
    "PAPER_POLICIES",
    "Curves",
    "PaperResults",
    "RunRecord",
    "discretize",
    "mean_std",
    "read_csv",
    "render_table",
    "summarize",
    "write_csv",
    "write_summary_csv",
]

ARRIVAL_POINTS = 131
"""Arrived GPU request 0%, 1%, ..., 130% of capacity."""
PAPER_POLICIES = ("Random", "DotProd", "Clustering", "Packing", "BestFit", "FGD")
_PAPER_CURVE_NAMES = {
    "01-Random": "Random",
    "02-DotProd": "DotProd",
    "03-GpuClustering": "Clustering",
    "04-GpuPacking": "Packing",
    "05-BestFit": "BestFit",
    "06-FGD": "FGD",
}

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Curves:
    """Per arrival percent 0..130: allocated GPU %, fragmented GPU %, occupied nodes."""

    allocated: F64
    fragmented: F64
    occupied: F64

    @property
    def unallocated(self) -> F64:
        out: F64 = 100.0 - self.allocated
        return out


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One replay, reduced: what the table, the CSV and the plot need."""

    trace: str
    policy: str
    seed: int
    curves: Curves
    pods: int
    failed: int
    seconds: float


def _bucket(values: F64, pct: F64, x: int) -> float:
    sel = pct == x
    if not sel.any():
        sel = np.abs(pct - x) <= 1
        if not sel.any():
            return math.nan
    return float(values[sel].mean())


def discretize(result: ReplayResult) -> Curves:
    cap = float(result.capacity_milli) or 1.0
    pct = np.round(result.arrived / cap * 100.0)
    allocated = result.allocated / cap * 100.0
    fragmented = result.fragmented / cap * 100.0
    occupied = result.occupied.astype(np.float64)
    points = range(ARRIVAL_POINTS)
    return Curves(
        np.array([_bucket(allocated, pct, x) for x in points]),
        np.array([_bucket(fragmented, pct, x) for x in points]),
        np.array([_bucket(occupied, pct, x) for x in points]),
    )


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return math.nan, math.nan
    std = float(np.std(clean, ddof=1)) if len(clean) > 1 else 0.0
    return float(np.mean(clean)), std


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    seeds: int
    unallocated: tuple[float, float]
    fragmented: tuple[float, float]
    occupied: tuple[float, float]
    failed: float
    seconds: float


def summarize(records: Iterable[RunRecord], at: int = 100) -> dict[str, dict[str, Summary]]:
    """trace -> policy -> mean ± std over seeds at arrival ``at``% (policies in run order)."""
    grouped: dict[str, dict[str, list[RunRecord]]] = {}
    for r in records:
        grouped.setdefault(r.trace, {}).setdefault(r.policy, []).append(r)
    out: dict[str, dict[str, Summary]] = {}
    for trace, by_policy in grouped.items():
        out[trace] = {}
        for policy, runs in by_policy.items():
            out[trace][policy] = Summary(
                policy,
                len(runs),
                mean_std([float(r.curves.unallocated[at]) for r in runs]),
                mean_std([float(r.curves.fragmented[at]) for r in runs]),
                mean_std([float(r.curves.occupied[at]) for r in runs]),
                float(np.mean([r.failed for r in runs])),
                float(np.mean([r.seconds for r in runs])),
            )
    return out


class PaperResults:
    """The FGD artifact's cached results (read lazily from ``directory``)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        self._curves: dict[str, dict[tuple[str, str], F64]] = {}

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def unallocated_at_100(self, trace: str) -> dict[str, tuple[float, float]]:
        """Policy -> (mean, std) of the unallocated GPU % at 100% arrival, paper order."""
        path = self._path("derived_unalloc_at_arrival100.csv")
        found: dict[str, tuple[float, float]] = {}
        if not os.path.exists(path):
            return found
        with open(path, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                if row.get("workload") == trace:
                    found[row["policy"]] = (
                        float(row["unalloc_gpu_pct_at_arrival100_mean"]),
                        float(row["std"]),
                    )
        return {p: found[p] for p in PAPER_POLICIES if p in found}

    def curves(self, trace: str, metric: str) -> dict[str, F64]:
        """Policy -> mean curve over seeds (0..130) of ``metric``: "allocated" or
        "fragmented" (% of capacity)."""
        name = {
            "allocated": "analysis_allo_discrete.csv",
            "fragmented": "analysis_frag_discrete.csv",
        }[metric]
        if metric not in self._curves:
            self._curves[metric] = self._load(self._path(name))
        out: dict[str, F64] = {}
        for (t, policy), curve in self._curves[metric].items():
            if t == trace:
                out[policy] = curve
        return out

    @staticmethod
    def _load(path: str) -> dict[tuple[str, str], F64]:
        sums: dict[tuple[str, str], list[F64]] = {}
        if not os.path.exists(path):
            return {}
        with open(path, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                policy = _PAPER_CURVE_NAMES.get(row.get("sc_policy", ""), row.get("sc_policy", ""))
                values = np.array(
                    [_float(row.get(str(x))) for x in range(ARRIVAL_POINTS)], np.float64
                )
                sums.setdefault((row.get("workload", ""), policy), []).append(values)
        return {k: np.nanmean(np.vstack(v), axis=0) for k, v in sums.items()}


def _float(raw: str | None) -> float:
    try:
        return float(raw) if raw not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _pm(ms: tuple[float, float], digits: int = 2) -> str:
    mean, std = ms
    return "-" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def render_table(
    summaries: Mapping[str, Mapping[str, Summary]],
    paper: PaperResults | None,
    header: Mapping[str, str] | None = None,
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> str:
    """The comparison table per trace (plain text, aligned); ``bounds`` (trace -> mean ± std
    of the lower bound on unallocated GPU %) adds a last row per trace."""
    lines: list[str] = []
    for trace, by_policy in summaries.items():
        if lines:
            lines.append("")
        lines.append(
            f"TRACE {trace}" + (f" ({header[trace]})" if header and trace in header else "")
        )
        rows = [
            [
                "POLICY",
                "UNALLOCATED GPU % @100",
                "FRAGMENTED GPU % @100",
                "OCCUPIED NODES @100",
                "FAILED PODS",
                "SECONDS/SEED",
            ]
        ]
        for s in by_policy.values():
            rows.append(
                [
                    f"{s.policy} ({s.seeds} seed{'s' if s.seeds != 1 else ''})",
                    _pm(s.unallocated),
                    _pm(s.fragmented),
                    _pm(s.occupied, 0),
                    f"{s.failed:.0f}",
                    f"{s.seconds:.1f}",
                ]
            )
        ref = paper.unallocated_at_100(trace) if paper is not None else {}
        for policy, ms in ref.items():
            rows.append([f"paper {policy}", _pm(ms), "", "", "", ""])
        if bounds is not None and trace in bounds:
            rows.append(["lower bound (no placement beats)", _pm(bounds[trace]), "", "", "", ""])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "trace",
    "policy",
    "seed",
    "arrival_pct",
    "allocated_gpu_pct",
    "unallocated_gpu_pct",
    "fragmented_gpu_pct",
    "occupied_nodes",
)


def write_csv(path: str | os.PathLike[str], records: Iterable[RunRecord]) -> None:
    """Long format: one row per trace, policy, seed and arrival percent."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in records:
            c = r.curves
            for x in range(ARRIVAL_POINTS):
                if math.isnan(c.allocated[x]):
                    continue
                w.writerow(
                    [
                        r.trace,
                        r.policy,
                        r.seed,
                        x,
                        f"{c.allocated[x]:.3f}",
                        f"{c.unallocated[x]:.3f}",
                        f"{c.fragmented[x]:.3f}",
                        f"{c.occupied[x]:.1f}",
                    ]
                )


SUMMARY_COLUMNS = (
    "trace",
    "policy",
    "seeds",
    "unallocated_gpu_pct_mean",
    "unallocated_gpu_pct_std",
    "fragmented_gpu_pct_mean",
    "fragmented_gpu_pct_std",
    "occupied_nodes_mean",
    "occupied_nodes_std",
    "failed_pods_mean",
)


def write_summary_csv(
    path: str | os.PathLike[str], summaries: Mapping[str, Mapping[str, Summary]]
) -> None:
    """The comparison table as one row per trace and policy (mean and std over seeds at
    100% arrival). Wall-clock seconds are left out: the file depends on the seeds only."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(SUMMARY_COLUMNS)
        for trace, by_policy in summaries.items():
            for s in by_policy.values():
                w.writerow(
                    [
                        trace,
                        s.policy,
                        s.seeds,
                        *(f"{v:.3f}" for v in (*s.unallocated, *s.fragmented, *s.occupied)),
                        f"{s.failed:.1f}",
                    ]
                )


def read_csv(path: str | os.PathLike[str]) -> list[RunRecord]:
    """The curves of ``write_csv`` back (pods, failures and seconds are not in the file: 0)."""
    points: dict[tuple[str, str, int], dict[int, tuple[float, float, float]]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            key = (row["trace"], row["policy"], int(row["seed"]))
            points.setdefault(key, {})[int(row["arrival_pct"])] = (
                float(row["allocated_gpu_pct"]),
                float(row["fragmented_gpu_pct"]),
                float(row["occupied_nodes"]),
            )
    records = []
    for (trace, policy, seed), by_x in points.items():
        columns = np.full((3, ARRIVAL_POINTS), math.nan)
        for x, values in by_x.items():
            columns[:, x] = values
        records.append(
            RunRecord(trace, policy, seed, Curves(columns[0], columns[1], columns[2]), 0, 0, 0.0)
        )
    return records
