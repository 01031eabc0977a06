"""Block times: the catalog's prices of a Llama block against the Zorse authors' measured
ones, per GPU type, absolute and relative to an A100; and the fit the catalog's fractions
come from.

Reads benchmarks/data/zorse_layer_times.yaml (``zorse_block_times``: Llama rows marked
usable, every fourth micro-batch size held back), fits every (GPU type, dtype)'s GEMM and
attention fractions and the measuring protocol's weight traffic on the calibration rows
(``piebald.profiler.block_fit``), and prices every row with the catalog as shipped plus that
traffic. Per GPU type it prints, for the calibration rows and the held-out rows apart:

* the relative-speed error: (predicted A100 time / predicted time) over (measured A100 time
  / measured time) - 1 per row (forward plus backward), against the A100-40GB at the same
  dtype, sequence and micro-batch size (the A100-80GB for the A100-40GB's own rows, and
  where the 40GB did not measure the shape) -- what a layer split follows;
* the absolute error: predicted / measured - 1 of the same sum.

Then the fitted fractions as catalog fields beside the shipped ones (``--check`` exits 1
when they differ by more than the catalog's rounding), and with ``--chart PNG`` predicted
against measured relative speed per GPU type.

    PYTHONPATH=src .venv/bin/python benchmarks/block_times.py [--check] [--chart out.png]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from piebald.profiler.block_fit import BlockFit, fit_block_times, predicted_times_s
from piebald.specs.devices import (
    BLOCK_SHARE_OF_BENCHMARK_GEMM,
    DEFAULT_MATMUL_EFFICIENCY,
    EFFICIENCY_FIELDS,
    Dtype,
    builtin_catalog,
)
from zorse_block_times import ZorseRow, load_rows

Shape = tuple[Dtype, int, int]  # ZorseRow.shape_key

REFERENCE = "A100-40GB"
REFERENCE_OF_REFERENCE = "A100-80GB"
CATALOG_DIGITS = 3  # the catalog's fractions are written with this many decimals


@dataclass(frozen=True, slots=True, kw_only=True)
class Priced:
    row: ZorseRow
    predicted_s: float  # forward + backward
    measured_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def price_rows(rows: Sequence[ZorseRow], fit: BlockFit) -> list[Priced]:
    """Every row priced by the cost model on its catalog device, plus the fitted protocol
    traffic."""
    out = []
    for row in rows:
        forward_s, backward_s = predicted_times_s(row.time, traffic=fit.traffic)
        out.append(
            Priced(
                row=row,
                predicted_s=forward_s + backward_s,
                measured_s=row.time.forward_s + row.time.backward_s,
            )
        )
    return out


def fit_calibration_rows(rows: Sequence[ZorseRow]) -> BlockFit:
    """The fit of the rows not held out (``zorse_block_times``)."""
    return fit_block_times([row.time for row in rows if not row.held_out])


def _reference(p: Priced, by_gpu_shape: Mapping[tuple[str, Shape], Priced]) -> Priced | None:
    """The A100 row ``p`` is compared with (module docstring); None where there is none."""
    reference = by_gpu_shape.get((REFERENCE, p.row.shape_key))
    if p.row.time.device.name == REFERENCE or reference is None:
        reference = by_gpu_shape.get((REFERENCE_OF_REFERENCE, p.row.shape_key))
    return None if reference is p else reference


def _by_gpu_shape(priced: Sequence[Priced]) -> dict[tuple[str, Shape], Priced]:
    return {(p.row.time.device.name, p.row.shape_key): p for p in priced}


def relative_errors(priced: Sequence[Priced]) -> dict[str, list[float]]:
    """Per GPU type, each row's relative-speed error against the A100 (module docstring)."""
    by_gpu_shape = _by_gpu_shape(priced)
    out: dict[str, list[float]] = defaultdict(list)
    for p in priced:
        reference = _reference(p, by_gpu_shape)
        if reference is None:
            continue
        predicted = reference.predicted_s / p.predicted_s
        measured = reference.measured_s / p.measured_s
        out[p.row.time.device.name].append(predicted / measured - 1.0)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Errors:
    """The median of |error| and the error of largest size (signed) over some rows."""

    median: float
    worst: float

    @classmethod
    def of(cls, errors: Sequence[float]) -> Errors | None:
        if not errors:
            return None
        return cls(median=statistics.median(abs(e) for e in errors), worst=max(errors, key=abs))

    @staticmethod
    def cells(errors: Errors | None) -> str:
        if errors is None:
            return "- | -"
        return f"{errors.median:.1%} | {errors.worst:+.1%}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuErrors:
    """One GPU type's errors on one split of the rows (calibration or held out)."""

    relative: Errors | None
    absolute: Errors | None


SPLITS = ("cal", "held")


def error_table(
    priced: Sequence[Priced],
) -> tuple[list[str], dict[tuple[str, str], GpuErrors]]:
    """The per-GPU table's lines and, per (GPU type, split), its errors."""
    lines = [
        "| GPU | dtypes | rows cal / held | relative cal: median | worst | relative held out: "
        "median | worst | absolute cal: median | worst | absolute held out: median | worst |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    split_rows = {
        "cal": [p for p in priced if not p.row.held_out],
        "held": [p for p in priced if p.row.held_out],
    }
    relative = {split: relative_errors(rows) for split, rows in split_rows.items()}
    summary: dict[tuple[str, str], GpuErrors] = {}
    for name in sorted({p.row.time.device.name for p in priced}):
        mine = {
            split: [p for p in rows if p.row.time.device.name == name]
            for split, rows in split_rows.items()
        }
        for split in SPLITS:
            summary[(name, split)] = GpuErrors(
                relative=Errors.of(relative[split].get(name, [])),
                absolute=Errors.of([p.error for p in mine[split]]),
            )
        dtypes = sorted({p.row.time.dtype.value for p in mine["cal"] + mine["held"]})
        cal, held = summary[(name, "cal")], summary[(name, "held")]
        lines.append(
            f"| {name} | {', '.join(dtypes)} | {len(mine['cal'])} / {len(mine['held'])} | "
            f"{Errors.cells(cal.relative)} | {Errors.cells(held.relative)} | "
            f"{Errors.cells(cal.absolute)} | {Errors.cells(held.absolute)} |"
        )
    return lines, summary


# GPU types without Llama block rows whose best-shape GEMM rate was benchmarked (catalog.yaml
# [MAMF], [MAMF2]): they get the share of the benchmark that a block's kernels reach on the
# A100s, which have both (A100 SXM: [MAMF] 0.869, [AzureA100] flash attention 0.575).
BENCHMARKED = {"RTX-4090": (1.0, None), "MI250X": (0.767, None), "MI300X": (0.514, None)}
A100_BENCHMARK = (0.869, 0.575)
A100_TYPES = ("A100-40GB", "A100-80GB")
# A type without rows in a dtype takes that dtype's fractions from the same die where it has
# rows (clocks, power and memory aside: those are in its peaks and bandwidth): GA100, GV100
# SXM2, GH100.
SAME_DIE = {
    "A100-80GB": "A100-40GB",
    "V100-32GB": "V100-16GB",
    "H200": "H100-NVL",
    "H100-SXM": "H100-NVL",
    "H100-SXM-96GB": "H100-NVL",
    "H100-PCIe": "H100-NVL",
}
# Same-die types whose 16-bit fractions the published runs scale (benchmarks/h100_share.py
# fits and checks them); their fp32 ones are the twin's.
PUBLISHED_FIT = ("H100-SXM", "H100-SXM-96GB", "H200")


def _fields(matmul: float, attention: float | None, *, prefix: str = "") -> dict[str, float]:
    out = {f"{prefix}matmul_efficiency": round(matmul, CATALOG_DIGITS)}
    if attention is not None:
        out[f"{prefix}attention_efficiency"] = round(attention, CATALOG_DIGITS)
    return out


def benchmark_shares(fit: BlockFit) -> tuple[float, float]:
    """The median share of the A100's benchmarked GEMM and attention rates its blocks reach
    in 16 bits."""
    found = [fit.fractions[(name, Dtype.FP16)] for name in A100_TYPES]
    return (
        statistics.median(f.matmul / A100_BENCHMARK[0] for f in found),
        statistics.median(f.attention / A100_BENCHMARK[1] for f in found),
    )


def expected_catalog(fit: BlockFit) -> dict[str, dict[str, float]]:
    """The efficiency fields the catalog should carry, per GPU type, rounded as it writes
    them: fitted where the data has rows, the A100's share of a benchmark where only that
    was measured, the same die's where neither."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (name, dtype), found in sorted(fit.fractions.items()):
        prefix = "fp32_" if dtype is Dtype.FP32 else ""
        out[name].update(_fields(found.matmul, found.attention, prefix=prefix))
    matmul_share, attention_share = benchmark_shares(fit)
    for name, (matmul, attention) in BENCHMARKED.items():
        out[name] = _fields(
            matmul * matmul_share, None if attention is None else attention * attention_share
        )
    for name, twin in SAME_DIE.items():
        out[name] = {**out[twin], **out.get(name, {})}
    return dict(out)


def expected_defaults(fit: BlockFit) -> dict[Dtype, float]:
    """``DEFAULT_MATMUL_EFFICIENCY``: per dtype, the median fitted GEMM fraction (bf16 takes
    the fp16 one)."""
    sixteen = [f.matmul for (_, d), f in fit.fractions.items() if d is not Dtype.FP32]
    thirty_two = [f.matmul for (_, d), f in fit.fractions.items() if d is Dtype.FP32]
    median16 = round(statistics.median(sixteen), 2)
    return {
        Dtype.BF16: median16,
        Dtype.FP16: median16,
        Dtype.FP32: round(statistics.median(thirty_two), 2),
    }


def catalog_differences(fit: BlockFit) -> list[str]:
    """Where the shipped catalog and defaults differ from what the fit gives, one line each."""
    catalog = builtin_catalog()
    out = []
    for name, fields in expected_catalog(fit).items():
        for field in EFFICIENCY_FIELDS:
            if name in PUBLISHED_FIT and not field.startswith("fp32_"):
                continue
            shipped, value = getattr(catalog[name], field), fields.get(field)
            if (shipped is None) != (value is None) or (
                shipped is not None and value is not None and abs(shipped - value) > 1e-9
            ):
                out.append(f"{name}.{field}: catalog {shipped}, fit {value}")
    share = round(benchmark_shares(fit)[0], CATALOG_DIGITS)
    if share != BLOCK_SHARE_OF_BENCHMARK_GEMM:
        out.append(f"BLOCK_SHARE_OF_BENCHMARK_GEMM: {BLOCK_SHARE_OF_BENCHMARK_GEMM}, fit {share}")
    for dtype, value in expected_defaults(fit).items():
        if DEFAULT_MATMUL_EFFICIENCY[dtype] != value:
            out.append(
                f"DEFAULT_MATMUL_EFFICIENCY[{dtype.value}]: {DEFAULT_MATMUL_EFFICIENCY[dtype]}, "
                f"fit {value}"
            )
    return out


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart(priced: Sequence[Priced], path: Path) -> None:
    """Predicted against measured speed relative to the A100, one point per row."""
    plt = pyplot()
    by_gpu_shape = _by_gpu_shape(priced)
    figure, axes = plt.subplots(figsize=(7.5, 6.5))
    names = sorted({p.row.time.device.name for p in priced} - {REFERENCE})
    colours = plt.get_cmap("tab20")
    for i, name in enumerate(names):
        pairs = [
            (p, reference)
            for p in priced
            if p.row.time.device.name == name
            and (reference := _reference(p, by_gpu_shape)) is not None
        ]
        xs = [reference.measured_s / p.measured_s for p, reference in pairs]
        ys = [reference.predicted_s / p.predicted_s for p, reference in pairs]
        axes.scatter(xs, ys, s=12, color=colours(i), label=name)
    axes.set_xscale("log")
    axes.set_yscale("log")
    low, high = 0.05, 3.0
    axes.plot([low, high], [low, high], color="black", linewidth=0.8)
    for factor in (0.9, 1.1):
        axes.plot([low, high], [low * factor, high * factor], ":", color="grey", linewidth=0.8)
    axes.set_xlabel("measured speed relative to an A100 (Zorse block times)")
    axes.set_ylabel("piebald's predicted relative speed")
    axes.set_title("Llama-7B block, forward + backward: predicted vs measured (dotted: ±10%)")
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the catalog != fit")
    parser.add_argument("--chart", type=Path, help="write the relative-speed chart here")
    args = parser.parse_args(argv)
    rows = load_rows()
    fit = fit_calibration_rows(rows)
    priced = price_rows(rows, fit)
    lines, _ = error_table(priced)
    print("\n".join(lines))
    traffic = fit.traffic
    print(
        "\nprotocol weight traffic, bytes per block parameter (fitted on every GPU type's "
        f"calibration rows): forward 16-bit {traffic.forward_16bit:.1f}, fp32 "
        f"{traffic.forward_fp32:.1f}; backward 16-bit {traffic.backward_16bit:.1f}, fp32 "
        f"{traffic.backward_fp32:.1f}"
    )
    matmul_share, attention_share = benchmark_shares(fit)
    print(
        f"\nA100 blocks reach {matmul_share:.3f} of the benchmarked GEMM rate and "
        f"{attention_share:.3f} of the flash-attention rate (applied to {', '.join(BENCHMARKED)})"
    )
    print("\ncatalog fields from the fit (rows fitted to):")
    counts = {name: 0 for name in expected_catalog(fit)}
    for (name, _), found in fit.fractions.items():
        counts[name] += found.num_times
    for name, fields in expected_catalog(fit).items():
        text = ", ".join(f"{field}: {value}" for field, value in fields.items())
        print(f"  {name}: {text}  ({counts[name] or 'no rows'})")
    defaults = ", ".join(f"{d.value} {v}" for d, v in expected_defaults(fit).items())
    print(f"  DEFAULT_MATMUL_EFFICIENCY: {defaults}")
    differences = catalog_differences(fit)
    print("\ncatalog equals the fit" if not differences else "\ncatalog differs from the fit:")
    for line in differences:
        print(f"  {line}")
    if args.chart is not None:
        chart(priced, args.chart)
        print(f"\nchart: {args.chart}")
    return 1 if args.check and differences else 0


if __name__ == "__main__":
    sys.exit(main())
