"""Pictures for people: the strategy comparison as a bar chart. matplotlib, headless."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from piebald.figure_files import save_figure

if TYPE_CHECKING:
    from piebald.api import Comparison

__all__ = ["plot_comparison"]


def plot_comparison(
    comparison: Comparison,
    path: Path,
    *,
    title: str,
    force: bool = False,
    flag: str = "--plot",
) -> None:
    """Bars of predicted tokens/s per strategy, the upper bound as a dashed line,
    infeasible strategies marked as such; an existing file is replaced only with
    ``force`` (``piebald.figure_files``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = comparison.rows
    names = [row.strategy for row in rows]
    values = [row.tokens_per_s for row in rows]
    colours = ["#2a7ab0" if row.strategy == "piebald" else "#9aa5b1" for row in rows]
    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=120)
    bars = axes.bar(names, values, color=colours)
    bound = comparison.upper_bound_tokens_per_s
    axes.axhline(bound, color="#c0392b", linestyle="--", linewidth=1.2)
    axes.text(
        len(rows) - 0.5,
        bound,
        f"upper bound {bound:,.0f}",
        color="#c0392b",
        ha="right",
        va="bottom",
        fontsize=8,
    )
    for bar, row in zip(bars, rows, strict=True):
        label = f"{row.tokens_per_s / bound:.0%}" if row.feasible else "does not fit"
        axes.text(
            bar.get_x() + bar.get_width() / 2,
            max(bar.get_height(), bound * 0.01),
            label,
            ha="center",
            va="bottom",
            fontsize=8,
        )
    axes.set_ylabel("predicted tokens/s")
    axes.set_title(title, fontsize=10)
    axes.set_ylim(0, bound * 1.12)
    axes.tick_params(axis="x", labelrotation=30)
    axes.spines[["top", "right"]].set_visible(False)
    figure.text(
        0.01,
        0.01,
        "baselines: the same search restricted to what each system can "
        "express, as modelled; % of the upper bound",
        fontsize=7,
        color="#555",
    )
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    try:
        save_figure(figure, path, flag=flag, force=force)
    finally:
        plt.close(figure)
