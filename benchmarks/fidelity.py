"""Fidelity: piebald's prices against both measured data sets, in one report.

1. **Block times** (benchmarks/data/zorse_layer_times.yaml, ``block_times.py``): per GPU
   type, the relative-speed error against an A100 and the absolute error of a Llama-7B
   block's forward and backward, on the calibration rows and the held-out ones.
2. **Published runs** (benchmarks/published.yaml, ``published.py``): per point the
   predicted / measured tokens/s of the run as it ran; per framework a multiplier (the
   geometric mean of measured / predicted over its points: what the framework's kernels,
   hooks and overlap make of the same work), and each point predicted with the multiplier
   of its framework's *other* points (left out in turn); the H100 / A100 ratio per
   framework with the standard ``H100-SXM`` entry.

With ``--charts DIR`` it writes ``fidelity-blocks.png`` (predicted against measured
relative speed per GPU type) and ``fidelity-published.png`` (predicted / measured per
run, by framework) there.

    PYTHONPATH=src .venv/bin/python benchmarks/fidelity.py [--charts docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from block_times import chart as blocks_chart
from block_times import error_table, fit_calibration_rows, price_rows, pyplot
from h100_share import framework_multiplier
from published import Outcome, predict
from published_points import load_points
from zorse_block_times import load_rows

# Runs of one framework on H100s and A100s with the same model and recipe:
# (framework, H100 point, A100 point).
STANDARD_H100 = "H100-SXM"
H100_A100_PAIRS = (
    ("torchtitan", "tt-8b-8gpu-fsdp-eager", "tt-a100-8b-64gpu-fsdp"),
    ("llm-foundry", "mpt-7b-8xh100", "mpt-7b-8xa100-80"),
    ("llm-foundry", "mpt-13b-8xh100", "mpt-13b-8xa100-80"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeftOut:
    """A point predicted with its framework's multiplier fitted on the framework's other
    points (None where it has no other)."""

    outcome: Outcome
    multiplier: float | None

    @property
    def error(self) -> float | None:
        if self.multiplier is None or self.outcome.ratio is None:
            return None
        return self.outcome.ratio * self.multiplier - 1.0


def multiplier(outcomes: Sequence[Outcome]) -> float | None:
    """The framework multiplier of ``outcomes`` with a prediction (None: none has one)."""
    ratios = [o.ratio for o in outcomes if o.ratio is not None]
    return framework_multiplier(ratios) if ratios else None


def by_framework(outcomes: Sequence[Outcome]) -> dict[str, list[Outcome]]:
    grouped: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        grouped[o.point.framework].append(o)
    return grouped


def leave_one_out(outcomes: Sequence[Outcome]) -> list[LeftOut]:
    grouped = by_framework(outcomes)
    return [
        LeftOut(
            outcome=o,
            multiplier=multiplier(
                [other for other in grouped[o.point.framework] if other is not o]
            ),
        )
        for o in outcomes
    ]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def published_report(outcomes: Sequence[Outcome]) -> list[str]:
    left_out = leave_one_out(outcomes)
    lines = [
        "| point | framework | GPU | predicted / measured | framework multiplier (others) "
        "| error with it |",
        "|---|---|---|---:|---:|---:|",
    ]
    for item in left_out:
        o = item.outcome
        ratio = "-" if o.ratio is None else f"{o.ratio:.2f}"
        factor = "-" if item.multiplier is None else f"{item.multiplier:.3f}"
        lines.append(
            f"| {o.point.point_id} | {o.point.framework} | {o.point.gpu_name} | {ratio} | "
            f"{factor} | {_percent(item.error)} |"
        )
    ratios = [abs(o.ratio - 1.0) for o in outcomes if o.ratio is not None]
    errors = [abs(item.error) for item in left_out if item.error is not None]
    lines.append("")
    lines.append(
        "as run, no multiplier: |predicted / measured - 1| median "
        f"{statistics.median(ratios):.1%}, worst {max(ratios):.1%} over {len(ratios)} points"
    )
    lines.append(
        f"framework multiplier left out in turn: median {statistics.median(errors):.1%}, worst "
        f"{max(errors):.1%} over {len(errors)} points (a framework's only point has no other)"
    )
    lines.append(
        "framework multipliers on all their points: "
        + ", ".join(
            f"{name} {multiplier(points) or float('nan'):.3f} ({len(points)})"
            for name, points in sorted(by_framework(outcomes).items())
        )
    )
    return lines


def h100_a100_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Per pair, the predicted H100 / A100 per-GPU ratio beside the measured one: with the
    H100 entry the run is recorded on, and with the standard ``H100-SXM`` (torchtitan's
    runs were on a 96 GB, 500 W part whose peak no source states)."""
    by_id = {o.point.point_id: o for o in outcomes}
    lines = [
        "| framework | H100 run / A100 run | measured | predicted, as recorded | "
        f"predicted, {STANDARD_H100} |",
        "|---|---|---:|---:|---:|",
    ]
    for framework, h100_id, a100_id in H100_A100_PAIRS:
        h100, a100 = by_id[h100_id], by_id[a100_id]
        measured = (
            h100.point.measured_tokens_per_s_per_gpu / a100.point.measured_tokens_per_s_per_gpu
        )
        standard = predict(replace(h100.point, gpu_name=STANDARD_H100))
        cells = []
        for outcome in (h100, standard):
            if outcome.ratio is None or a100.ratio is None:
                cells.append("-")
                continue
            ratio = measured * outcome.ratio / a100.ratio
            cells.append(f"{ratio:.2f} ({ratio / measured - 1:+.1%})")
        lines.append(
            f"| {framework} | {h100_id} / {a100_id} | {measured:.2f} | {cells[0]} "
            f"({h100.point.gpu_name}) | {cells[1]} |"
        )
    return lines


def published_chart(outcomes: Sequence[Outcome], path: Path) -> None:
    """predicted / measured per run, grouped and coloured by framework."""
    plt = pyplot()
    shown = sorted(
        (o for o in outcomes if o.ratio is not None),
        key=lambda o: (o.point.framework, o.point.point_id),
    )
    frameworks = sorted({o.point.framework for o in shown})
    colours = plt.get_cmap("tab10")
    figure, axes = plt.subplots(figsize=(8, 5.5))
    left_out = {item.outcome.point.point_id: item for item in leave_one_out(outcomes)}
    for i, o in enumerate(shown):
        assert o.ratio is not None
        colour = colours(frameworks.index(o.point.framework))
        axes.barh(i, o.ratio - 1.0, left=1.0, color=colour)
        error = left_out[o.point.point_id].error
        if error is not None:
            axes.plot(1.0 + error, i, "k|", markersize=12, markeredgewidth=2)
    axes.set_yticks(range(len(shown)), [f"{o.point.point_id} ({o.point.gpu_name})" for o in shown])
    axes.invert_yaxis()
    axes.axvline(1.0, color="black", linewidth=0.8)
    for edge in (0.9, 1.1):
        axes.axvline(edge, color="grey", linestyle=":", linewidth=0.8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(i)) for i in range(len(frameworks))]
    axes.legend(handles, frameworks, fontsize=8, loc="lower right")
    axes.set_xlabel(
        "predicted / measured tokens/s per GPU (dotted: ±10%)\n"
        "black tick: times the multiplier fitted on its framework's other runs",
    )
    axes.set_title("Published runs as they ran, priced by piebald's cost model")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--charts", type=Path, help="write the two charts into this folder")
    args = parser.parse_args(argv)
    rows = load_rows()
    priced = price_rows(rows, fit_calibration_rows(rows))
    lines, _ = error_table(priced)
    print("## Block times (Llama-7B block, Zorse measurements)\n")
    print("\n".join(lines))
    points = load_points()
    outcomes = [predict(point) for point in points]
    print("\n## Published runs (benchmarks/published.yaml)\n")
    print("\n".join(published_report(outcomes)))
    print("\n## H100 / A100 per GPU, same framework, model and recipe\n")
    print("\n".join(h100_a100_lines(outcomes)))
    if args.charts is not None:
        args.charts.mkdir(parents=True, exist_ok=True)
        blocks_chart(priced, args.charts / "fidelity-blocks.png")
        published_chart(outcomes, args.charts / "fidelity-published.png")
        print(f"\ncharts written to {args.charts}: fidelity-blocks.png, fidelity-published.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
