"""Replay curves (the paper's discretization), the comparison table, the CSV, paper data."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from scheduler.simulator.replay import ReplayResult
from scheduler.simulator.replay_report import (
    ARRIVAL_POINTS,
    Curves,
    PaperResults,
    RunRecord,
    discretize,
    read_csv,
    render_table,
    summarize,
    write_csv,
)


def _result(arrived: list[int], allocated: list[int], cap: int = 1000) -> ReplayResult:
    n = len(arrived)
    return ReplayResult(
        cap,
        np.array(arrived, np.int64),
        np.array(allocated, np.int64),
        np.array(allocated, np.float64) / 10,
        np.arange(1, n + 1, dtype=np.int64),
        ["n"] * n,
    )


def test_discretize_means_the_pods_at_each_percent() -> None:
    # Arrived 10 milli = 1%: two pods land on 1% (allocated 10 and 0 more -> mean of 10, 10).
    curves = discretize(_result([10, 10, 20, 1000], [10, 10, 15, 900]))
    assert curves.allocated[1] == pytest.approx(1.0)
    assert curves.allocated[2] == pytest.approx(1.5)
    assert curves.occupied[1] == pytest.approx(1.5)  # pods 1 and 2
    assert curves.unallocated[100] == pytest.approx(10.0)
    # 3% has no pod: the neighbours within 1 (2%) stand in; 50% has none at all.
    assert curves.allocated[3] == pytest.approx(1.5)
    assert math.isnan(curves.allocated[50])
    assert len(curves.allocated) == ARRIVAL_POINTS


def test_rounding_is_half_to_even() -> None:
    curves = discretize(_result([5, 15], [5, 15]))  # 0.5% -> 0, 1.5% -> 2
    assert curves.allocated[0] == pytest.approx(0.5)
    assert curves.allocated[2] == pytest.approx(1.5)


def _record(policy: str, seed: int, unalloc100: float) -> RunRecord:
    alloc = np.full(ARRIVAL_POINTS, 50.0)
    alloc[100] = 100.0 - unalloc100
    return RunRecord(
        "openb_pod_list_default",
        policy,
        seed,
        Curves(alloc, np.full(ARRIVAL_POINTS, 3.0), np.full(ARRIVAL_POINTS, 7.0)),
        10,
        2,
        1.5,
    )


def _paper(tmp_path: Path) -> PaperResults:
    d = tmp_path / "expected"
    d.mkdir(exist_ok=True)
    (d / "derived_unalloc_at_arrival100.csv").write_text(
        "workload,policy,n_seeds,unalloc_gpu_pct_at_arrival100_mean,std,median,min,max,"
        "unalloc_gpu_pct_at_arrival130_mean\n"
        "openb_pod_list_default,FGD,10,4.773,0.106,4.77,4.62,4.94,4.609\n"
        "openb_pod_list_default,Random,10,13.697,0.332,13.75,13.21,14.13,12.53\n"
        "openb_pod_list_gpushare40,FGD,10,6.039,0.074,6.045,5.92,6.18,5.852\n"
    )
    header = "workload,sc_policy,tune,seed," + ",".join(str(x) for x in range(ARRIVAL_POINTS))
    rows = [
        f"openb_pod_list_default,06-FGD,1.3,{seed}," + ",".join(str(v) for v in [seed] * 131)
        for seed in (42, 44)
    ]
    (d / "analysis_allo_discrete.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    return PaperResults(d)


def test_summary_and_table(tmp_path: Path) -> None:
    records = [_record("binpack", 1, 6.0), _record("binpack", 2, 8.0), _record("frag", 1, 4.0)]
    summary = summarize(records)
    s = summary["openb_pod_list_default"]["binpack"]
    assert s.seeds == 2 and s.unallocated == pytest.approx((7.0, math.sqrt(2)))
    text = render_table(summary, _paper(tmp_path), {"openb_pod_list_default": "tiny"})
    lines = text.splitlines()
    assert lines[0] == "TRACE openb_pod_list_default (tiny)"
    assert lines[1].split()[:3] == ["POLICY", "UNALLOCATED", "GPU"]
    assert "binpack (2 seeds)" in lines[2] and "7.00 ± 1.41" in lines[2]
    assert "frag (1 seed)" in lines[3] and "4.00 ± 0.00" in lines[3]
    # The paper's rows, in the paper's order.
    assert lines[4].startswith("paper Random") and "13.70 ± 0.33" in lines[4]
    assert lines[5].startswith("paper FGD") and "4.77 ± 0.11" in lines[5]


def test_paper_curves_are_means_over_seeds(tmp_path: Path) -> None:
    curves = _paper(tmp_path).curves("openb_pod_list_default", "allocated")
    assert set(curves) == {"FGD"}
    assert curves["FGD"][100] == pytest.approx(43.0)
    assert _paper(tmp_path).curves("other", "allocated") == {}


def test_missing_paper_files_give_nothing(tmp_path: Path) -> None:
    paper = PaperResults(tmp_path)
    assert paper.unallocated_at_100("openb_pod_list_default") == {}
    assert paper.curves("openb_pod_list_default", "fragmented") == {}


def test_csv_long_format(tmp_path: Path) -> None:
    path = tmp_path / "curves.csv"
    write_csv(path, [_record("binpack", 1, 6.0)])
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == ARRIVAL_POINTS
    assert rows[100]["unallocated_gpu_pct"] == "6.000"
    assert rows[0].keys() == {
        "trace",
        "policy",
        "seed",
        "arrival_pct",
        "allocated_gpu_pct",
        "unallocated_gpu_pct",
        "fragmented_gpu_pct",
        "occupied_nodes",
    }


def test_csv_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "curves.csv"
    records = [_record("binpack", 1, 6.0), _record("frag", 2, 4.0)]
    write_csv(path, records)
    back = read_csv(path)
    assert [(r.trace, r.policy, r.seed) for r in back] == [
        (r.trace, r.policy, r.seed) for r in records
    ]
    for a, b in zip(records, back, strict=True):
        assert np.allclose(a.curves.allocated, b.curves.allocated)
        assert np.allclose(a.curves.fragmented, b.curves.fragmented)
