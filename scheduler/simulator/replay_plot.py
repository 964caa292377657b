"""The replay plot: the project's curves beside the FGD paper's, for one trace (PNG).

Role: two panels over the arrived GPU request (% of capacity) — the allocated GPU % (from 50%
on, where the policies part; the gap to 100% at 100% arrival is the unallocated GPU %) and the
fragmented GPU % (0-130%) — with each policy of this run as a solid line (mean over seeds) and
the paper's policies for the same trace (``PaperResults``) as dashed lines.

matplotlib is an optional dependency (the ``trace`` extra): it is imported only here, only
when a plot is drawn, with the non-interactive Agg backend; without it ``plot_curves`` raises
``PlotUnavailable`` with an install hint.

Invariants: writes exactly one file, ``path``; never opens a window; figures are closed.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.simulator.replay_report import ARRIVAL_POINTS, PaperResults, RunRecord

__all__ = ["PlotUnavailable", "plot_curves"]

_PAPER_COLORS = {
    "Random": "#aaaaaa",
    "DotProd": "#9ecae1",
    "Clustering": "#a1d99b",
    "Packing": "#fdae6b",
    "BestFit": "#fc9272",
    "FGD": "#bcbddc",
}
# Our policies: the darker shade of the paper policy they correspond to, where there is one.
_OUR_COLORS = {
    "random": "#555555",
    "bestfit": "#cb181d",
    "dotprod": "#3182bd",
    "clustering": "#31a354",
    "packing": "#e6550d",
    "binpack": "#d94801",
    "spread": "#238b45",
    "fgd": "#6a51a3",
    "fragmentation": "#000000",
}
_EXTRA_COLORS = ("#2171b5", "#8c6d31", "#e7298a", "#17becf")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "the plot needs matplotlib: pip install 'koord-py[trace]' (or matplotlib>=3.8)"
        ) from None
    return plt


def plot_curves(
    path: str | os.PathLike[str],
    trace: str,
    records: Sequence[RunRecord],
    paper: PaperResults | None,
) -> None:
    plt = _pyplot()
    x = np.arange(ARRIVAL_POINTS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=90)
    try:
        panels = (
            ("allocated", "Allocated GPU (% of capacity)"),
            ("fragmented", "Fragmented GPU (% of capacity)"),
        )
        policies = list(dict.fromkeys(r.policy for r in records if r.trace == trace))
        for ax, (metric, label) in zip(axes, panels, strict=True):
            if paper is not None:
                for policy, curve in paper.curves(trace, metric).items():
                    ax.plot(
                        x,
                        curve,
                        linestyle="--",
                        linewidth=1.2,
                        color=_PAPER_COLORS.get(policy, "#999999"),
                        label=f"paper {policy}",
                    )
            for i, policy in enumerate(policies):
                color = _OUR_COLORS.get(policy, _EXTRA_COLORS[i % len(_EXTRA_COLORS)])
                runs = [r for r in records if r.trace == trace and r.policy == policy]
                ys = np.vstack([getattr(r.curves, metric) for r in runs])
                seen = ~np.isnan(ys)
                mean = np.where(seen.any(axis=0), np.where(seen, ys, 0).sum(axis=0), np.nan)
                mean = mean / np.maximum(seen.sum(axis=0), 1)
                ax.plot(x, mean, linewidth=1.8, color=color, label=f"{policy} (ours)")
            ax.set_xlabel("Arrived GPU request (% of capacity)")
            ax.set_ylabel(label)
            ax.set_xlim(0, ARRIVAL_POINTS - 1)
            ax.grid(True, alpha=0.3)
        axes[0].plot(x, np.minimum(x, 100), color="black", linewidth=0.6, label="arrived")
        axes[0].set_xlim(50, ARRIVAL_POINTS - 1)
        axes[0].set_ylim(50, 100)
        axes[1].set_ylim(bottom=0)
        axes[0].legend(fontsize=7, ncol=2, loc="lower right")
        fig.suptitle(f"{trace}: allocated and fragmented GPU as the workload arrives")
        fig.tight_layout()
        _save_small(fig, os.fspath(path))
    finally:
        plt.close(fig)


def _save_small(fig: Any, path: str) -> None:
    """PNG with a 256-colour palette (a third of the size; line plots lose nothing)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    try:
        from PIL import Image  # matplotlib depends on Pillow
    except ImportError:  # pragma: no cover - matplotlib always brings it
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
        return
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256).save(path, optimize=True)
