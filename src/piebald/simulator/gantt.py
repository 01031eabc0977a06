"""A simulated step as a Gantt chart (PNG, matplotlib, headless).

One row per GPU, grouped by stage (stages separated by lines and labelled), named with its
rank and type. The compute stream is the tall bar; under it, thinner, the data-parallel
channel (gathers, reduce-scatters, collectives) and the transfers the GPU sends. Colour
says the kind of operation; a legend names them. A pass of a tensor-parallel stage ends in
a segment of its own colour: the share of the pass its tensor group spends communicating
(its all-reduces, which run between the pass's kernels, drawn together). Readable at a
glance up to 64 GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from piebald.figure_files import save_figure
from piebald.simulator.result import TENSOR_COMM, Lane, SimulationResult
from piebald.specs.plan import Plan

__all__ = ["KIND_COLOURS", "plot_gantt"]

# Colour by kind: passes in blues/greens, data-parallel traffic in warm colours, the
# optimizer in purple, transfers in greys (colour-blind-safe pairs where it matters).
KIND_COLOURS = {
    "forward": "#4e79a7",
    "backward": "#59a14f",
    "optimizer": "#b07aa1",
    TENSOR_COMM: "#76b7b2",
    "gather": "#f28e2b",
    "reduce-scatter": "#e15759",
    "all-reduce": "#9c755f",
    "all-gather": "#edc948",
    "send activation": "#8c8c8c",
    "send gradient": "#c7c7c7",
}
_LEGEND = {
    "forward": "forward pass",
    "backward": "backward pass",
    "optimizer": "optimizer step",
    TENSOR_COMM: "tensor-parallel all-reduces and input broadcast (share of the pass)",
    "gather": "ZeRO-3 parameter gather",
    "reduce-scatter": "gradient reduce-scatter",
    "all-reduce": "gradient all-reduce",
    "all-gather": "parameter all-gather",
    "send activation": "activation sent",
    "send gradient": "gradient sent",
}
# Vertical placement inside a row of height 1: (bottom, height) per lane.
_LANE_BOX = {
    Lane.COMPUTE: (0.38, 0.52),
    Lane.DATA_PARALLEL: (0.22, 0.14),
    Lane.P2P: (0.06, 0.14),
}


def plot_gantt(
    plan: Plan,
    result: SimulationResult,
    path: Path,
    *,
    title: str = "",
    force: bool = False,
    flag: str = "--gantt",
) -> None:
    """Draw the step's timeline to ``path`` (PNG, or the format its suffix names); an
    existing file is replaced only with ``force`` (``piebald.figure_files``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = plan.used_ranks  # stage by stage
    row_of = {rank: len(ranks) - 1 - index for index, rank in enumerate(ranks)}
    scale, unit = (1e3, "ms") if result.step_time_s < 10 else (1.0, "s")
    height = max(3.0, 0.32 * len(ranks) + 1.8)
    figure, axes = plt.subplots(figsize=(14, height), dpi=110)
    bars: dict[tuple[int, Lane, str], list[tuple[float, float]]] = defaultdict(list)
    for interval in result.intervals:
        bars[row_of[interval.rank], interval.lane, interval.kind].append(
            (interval.start_s * scale, (interval.end_s - interval.start_s) * scale)
        )
    for (row, lane, kind), spans in bars.items():
        bottom, box = _LANE_BOX[lane]
        axes.broken_barh(
            spans,
            (row + bottom, box),
            facecolors=KIND_COLOURS.get(kind, "#333333"),
            edgecolor="white" if lane is Lane.COMPUTE else "none",
            linewidth=0.3,
        )
    span = result.step_time_s * scale
    if len(ranks) <= 16:  # name the micro-batches where the bars are wide enough
        for interval in result.intervals:
            width = (interval.end_s - interval.start_s) * scale
            if (
                interval.lane is Lane.COMPUTE
                and interval.kind != TENSOR_COMM
                and (width > 0.009 * span)
            ):
                axes.text(
                    (interval.start_s * scale) + width / 2,
                    row_of[interval.rank] + 0.64,
                    interval.label if interval.kind != "optimizer" else "opt",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )
    # Stage separators and labels.
    for index, stage in enumerate(plan.stages):
        rows = [row_of[rank] for rank in stage.ranks]
        top, bottom = max(rows) + 1, min(rows)
        if index > 0:
            axes.axhline(top, color="#333333", linewidth=0.9)
        axes.text(
            1.005,
            (top + bottom) / 2,
            f"stage {index}\nlayers {stage.layer_start}-{stage.layer_end - 1}\n"
            f"ZeRO {stage.zero.value}"
            + (f", tp {stage.tensor_parallel_degree}" if stage.tensor_parallel_degree > 1 else ""),
            transform=axes.get_yaxis_transform(),
            va="center",
            ha="left",
            fontsize=7,
        )
    axes.set_yticks([row + 0.5 for row in row_of.values()])
    axes.set_yticklabels(
        [f"r{rank} {plan.cluster.device_of(rank).name}" for rank in row_of],
        fontsize=7 if len(ranks) > 24 else 8,
    )
    axes.set_ylim(0, len(ranks))
    axes.set_xlim(0, span * 1.002)
    axes.set_xlabel(f"time ({unit})")
    axes.spines[["top", "right"]].set_visible(False)
    used = {interval.kind for interval in result.intervals}
    handles = [
        Patch(facecolor=colour, label=_LEGEND[kind])
        for kind, colour in KIND_COLOURS.items()
        if kind in used
    ]
    axes.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.9 / height - 0.02),
        ncol=min(5, len(handles)),
        fontsize=8,
        frameon=False,
    )
    headline = (
        f"step {result.step_time_s * scale:,.1f} {unit}, {result.tokens_per_s:,.0f} tokens/s, "
        f"bubble {result.bubble_fraction:.0%} ({plan.schedule.value}); tall bars: compute, "
        "thin: data-parallel channel, then transfers sent"
    )
    axes.set_title(f"{title}\n{headline}" if title else headline, fontsize=9)
    figure.tight_layout()
    try:
        save_figure(figure, path, flag=flag, force=force)
    finally:
        plt.close(figure)
