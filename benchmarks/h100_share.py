"""The H100 SXM parts' fractions: the H100 NVL's block fit, scaled by one factor fitted on
the published runs, beside a multiplier per framework.

No block times were measured on an H100 SXM; the Zorse data has the H100 NVL, the same
GH100 die at 350-400 W against the SXM's 700 W. The catalog's H100-SXM, H100-SXM-96GB and
H200 take the NVL's fitted GEMM and attention fractions times one scale ``k``, fitted here
on benchmarks/published.yaml together with one multiplier per framework (what its kernels,
hooks and overlap make of the same work): for each ``k`` of a grid the multipliers are the
geometric means of measured / predicted per framework, and ``k`` minimises the squared
log errors that are left. Only frameworks that ran both H100s and A100s can tell ``k``
(within a framework the multiplier cancels): torchtitan, llm-foundry and llm.c.

Each point is also predicted with ``k`` and its framework's multiplier fitted without it
(left out in turn), which is the honest error of the whole procedure.

    PYTHONPATH=src .venv/bin/python benchmarks/h100_share.py [--check]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from block_times import CATALOG_DIGITS, PUBLISHED_FIT
from piebald.specs.devices import DeviceType, builtin_catalog
from published import predict
from published_points import PublishedPoint, catalog_gpu_name, load_points

MEASURED_TWIN = "H100-NVL"
FITTED = PUBLISHED_FIT
SCALES = tuple(round(0.9 + 0.02 * i, 2) for i in range(26))  # 0.90 .. 1.40


def framework_multiplier(ratios: Iterable[float]) -> float:
    """What a framework makes of piebald's prediction: the geometric mean of measured /
    predicted over its runs' predicted / measured ``ratios``."""
    return math.exp(-statistics.fmean(math.log(ratio) for ratio in ratios))


def scaled(device: DeviceType, scale: float) -> DeviceType:
    """``device`` with the NVL's 16-bit fractions times ``scale`` (rounded as the catalog
    writes them)."""
    twin = builtin_catalog()[MEASURED_TWIN]
    assert twin.matmul_efficiency is not None and twin.attention_efficiency is not None
    return replace(
        device,
        matmul_efficiency=round(min(1.0, twin.matmul_efficiency * scale), CATALOG_DIGITS),
        attention_efficiency=round(min(1.0, twin.attention_efficiency * scale), CATALOG_DIGITS),
    )


def ratio_table(points: Sequence[PublishedPoint]) -> dict[str, dict[float, float]]:
    """Per point with a prediction, predicted / measured at every scale (the same at every
    scale for a point on another GPU)."""
    out: dict[str, dict[float, float]] = {}
    for point in points:
        name = catalog_gpu_name(point.gpu_name)
        if name in FITTED:
            device = builtin_catalog()[name]
            ratios = {k: predict(point, device=scaled(device, k)).ratio for k in SCALES}
        else:
            ratio = predict(point).ratio
            ratios = dict.fromkeys(SCALES, ratio)
        if all(r is not None for r in ratios.values()):
            out[point.point_id] = {k: r for k, r in ratios.items() if r is not None}
    return out


def _groups(frameworks: Mapping[str, str], ids: Iterable[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for point_id in ids:
        groups[frameworks[point_id]].append(point_id)
    return groups


def spread(
    table: Mapping[str, Mapping[float, float]],
    frameworks: Mapping[str, str],
    *,
    scale: float,
    ids: Iterable[str],
) -> float:
    """The squared log errors left at ``scale`` once each framework's multiplier is fitted."""
    total = 0.0
    for members in _groups(frameworks, ids).values():
        logs = [math.log(table[i][scale]) for i in members]
        mean = statistics.fmean(logs)
        total += sum((value - mean) ** 2 for value in logs)
    return total


def best_scale(
    table: Mapping[str, Mapping[float, float]], frameworks: Mapping[str, str], *, ids: Iterable[str]
) -> float:
    """The grid scale with the least spread over ``ids`` (ties: the smaller scale)."""
    chosen = list(ids)
    return min(SCALES, key=lambda k: (spread(table, frameworks, scale=k, ids=chosen), k))


@dataclass(frozen=True, slots=True, kw_only=True)
class LeftOut:
    point_id: str
    framework: str
    scale: float  # fitted without the point
    multiplier: float | None  # of the framework's other points; None: it has none
    error: float | None  # predicted x multiplier / measured - 1


def leave_one_out(
    table: Mapping[str, Mapping[float, float]], frameworks: Mapping[str, str]
) -> list[LeftOut]:
    out = []
    for point_id in table:
        others = [i for i in table if i != point_id]
        scale = best_scale(table, frameworks, ids=others)
        same = [table[i][scale] for i in others if frameworks[i] == frameworks[point_id]]
        factor = framework_multiplier(same) if same else None
        out.append(
            LeftOut(
                point_id=point_id,
                framework=frameworks[point_id],
                scale=scale,
                multiplier=factor,
                error=None if factor is None else table[point_id][scale] * factor - 1.0,
            )
        )
    return out


def catalog_differences(scale: float) -> list[str]:
    """Where the shipped GH100 SXM entries differ from the NVL's fractions times ``scale``."""
    catalog = builtin_catalog()
    out = []
    for name in FITTED:
        expected = scaled(catalog[name], scale)
        for field in ("matmul_efficiency", "attention_efficiency"):
            if getattr(catalog[name], field) != getattr(expected, field):
                out.append(
                    f"{name}.{field}: catalog {getattr(catalog[name], field)}, "
                    f"fit {getattr(expected, field)}"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the catalog != fit")
    args = parser.parse_args(argv)
    points = load_points()
    frameworks = {p.point_id: p.framework for p in points}
    table = ratio_table(points)
    scale = best_scale(table, frameworks, ids=table)
    print("| scale | left spread |")
    print("|---:|---:|")
    for k in SCALES:
        left = spread(table, frameworks, scale=k, ids=table)
        print(f"| {k:.2f}{' <-' if k == scale else ''} | {left:.4f} |")
    twin = builtin_catalog()[MEASURED_TWIN]
    fitted = scaled(builtin_catalog()["H100-SXM"], scale)
    print(
        f"\nscale {scale:.2f}: {', '.join(FITTED)} take matmul_efficiency "
        f"{fitted.matmul_efficiency}, attention_efficiency {fitted.attention_efficiency} "
        f"(the NVL's {twin.matmul_efficiency} and {twin.attention_efficiency} times {scale:.2f})"
    )
    print(
        "\n| point | framework | scale without it | multiplier of its framework's others | error |"
    )
    print("|---|---|---:|---:|---:|")
    left = leave_one_out(table, frameworks)
    for item in left:
        factor = "-" if item.multiplier is None else f"{item.multiplier:.3f}"
        error = "-" if item.error is None else f"{item.error:+.1%}"
        print(f"| {item.point_id} | {item.framework} | {item.scale:.2f} | {factor} | {error} |")
    errors = [abs(item.error) for item in left if item.error is not None]
    print(
        f"\nleft out in turn (scale and multiplier refitted without the point): median "
        f"{statistics.median(errors):.1%}, worst {max(errors):.1%} over {len(errors)} points"
    )
    differences = catalog_differences(scale)
    print("\ncatalog equals the fit" if not differences else "\ncatalog differs from the fit:")
    for line in differences:
        print(f"  {line}")
    return 1 if args.check and differences else 0


if __name__ == "__main__":
    sys.exit(main())
