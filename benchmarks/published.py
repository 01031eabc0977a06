"""Predicted against published, measured training throughput (the cost model's measuring stick).

For each point of benchmarks/published.yaml (torchtitan, llm-foundry, Megatron-LM and
llm.c runs on 8 to 128 identical H100s or A100s) this plans the same model, batch and
sequence length on the same cluster with the strategy closest to what was run
(``published_points.plan_choice``: zero-even with full sharding for FSDP, with ZeRO-1 for
llm.c; runs with tensor parallelism as one stage of their TP degree, in the tensor layout
they ran: ``piebald.specs.tensor_layout``) and prints the cost
model's tokens/s per GPU beside the measured figure. Then the median and worst
|predicted / measured - 1| over the expressible points, and the H100 / A100 ratio for
llama-3-8b under FSDP (torchtitan) beside the measured one.

    PYTHONPATH=src .venv/bin/python benchmarks/published.py [--points ID,ID]

Analytical prices only (no profile DB): this measures the cost model as it ships.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace

import piebald
from piebald.cost.plan_fit import first_memory_overflow
from piebald.errors import SpecError
from piebald.planner.search import Infeasible, search
from piebald.planner.strategies import PIEBALD
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import DeviceType
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, ZeroMode, round_robin_routes
from published_points import (
    PublishedPoint,
    build_cluster,
    build_job,
    build_model,
    load_points,
    plan_choice,
    recompute_as_run,
    tensor_layout_as_run,
    tensor_parallel_degree,
)

# The H100 / A100 pair torchtitan measured with the same model, sequence and FSDP recipe.
RATIO_H100 = "tt-8b-8gpu-fsdp-eager"
RATIO_A100 = "tt-a100-8b-64gpu-fsdp"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One point's prediction, or why there is none."""

    point: PublishedPoint
    model_name: str
    predicted_tokens_per_s_per_gpu: float | None
    why_none: str | None  # "not expressible (...)", "infeasible: ...", a missing GPU type
    plan_summary: str  # micro-batch, recompute, ZeRO mode of the plan made
    notes: tuple[str, ...]

    @property
    def ratio(self) -> float | None:
        if self.predicted_tokens_per_s_per_gpu is None:
            return None
        return self.predicted_tokens_per_s_per_gpu / self.point.measured_tokens_per_s_per_gpu


def predict(point: PublishedPoint, *, device: DeviceType | None = None) -> Outcome:
    """Plan ``point`` as it was run and return the cost model's tokens/s per GPU (on
    ``device`` in place of the catalog's entry of its GPU, when given)."""
    try:
        model, model_notes = build_model(point)
    except ValueError as error:
        return _none(point, point.model, f"model not buildable: {error}")
    degree = tensor_parallel_degree(point)
    try:
        cluster, cluster_notes = build_cluster(point, device=device)
    except ValueError as error:
        return _none(point, model.name, str(error))
    choice = plan_choice(point)
    try:
        if degree > 1:
            plan = _one_tensor_parallel_stage(point, cluster, model, degree, choice.zero)
        else:
            plan = piebald.plan(
                cluster, model, build_job(point), strategy=choice.strategy, zero=choice.zero
            )
    except Infeasible as error:
        return _none(point, model.name, f"infeasible: {error}")
    plan, run_notes = as_run(plan, point)
    stage = plan.stages[0]
    predicted = piebald.estimate(plan)
    how = (
        f"one stage, TP {degree} ({stage.tensor_layout.value}), zero {stage.zero.value}"
        if degree > 1
        else f"{choice.strategy}"
        + (f" --zero {choice.zero.value}" if choice.zero is not None else "")
    )
    summary = (
        how + f": {len(plan.stages)} stage(s), micro-batch {sorted(set(stage.micro_batch_size))} x "
        f"{sorted(set(stage.num_micro_batches))}, recompute {stage.recompute}"
    )
    return Outcome(
        point=point,
        model_name=model.name,
        predicted_tokens_per_s_per_gpu=predicted.tokens_per_s / cluster.num_gpus,
        why_none=None,
        plan_summary=summary,
        notes=model_notes + cluster_notes + run_notes,
    )


def _one_tensor_parallel_stage(
    point: PublishedPoint,
    cluster: ClusterSpec,
    model: ModelSpec,
    degree: int,
    zero: ZeroMode | None,
) -> Plan:
    """The run's layout (every published TP point is one pipeline stage): one stage of
    tensor groups of ``degree`` over the cluster, its data parallelism in ``zero`` (FSDP:
    full; Megatron's distributed optimizer, which ``--overlap-param-gather`` implies:
    optimizer; older Megatron: none); the micro-batch the planner picks where the source
    does not say."""
    if zero is None:
        zero = ZeroMode.OPTIMIZER if "param-gather" in point.parallelism else ZeroMode.NONE
    rules = replace(PIEBALD.stage_rules, zero_modes=(zero,), tensor_parallel_degrees=(degree,))
    one_stage = replace(PIEBALD, name="one tensor-parallel stage", max_stages=1, stage_rules=rules)
    return search(cluster, model=model, job=build_job(point), strategy=one_stage).best.plan


def as_run(plan: Plan, point: PublishedPoint) -> tuple[Plan, tuple[str, ...]]:
    """``plan`` (one data-parallel stage) held to the micro-batch size and recomputation the
    run used, where the source states them, and to the tensor layout it ran (the planner
    makes piebald's own): the benchmark tests the cost model, not the planner's choices. A
    run that piebald's memory model says does not fit is still priced, with a note."""
    notes: list[str] = []
    if len(plan.stages) != 1:
        return plan, ("planned with more than one stage: priced as planned",)
    stage = plan.stages[0]
    recompute, note = recompute_as_run(point)
    if note is not None:
        notes.append(note)
    if recompute is not None:
        stage = replace(stage, recompute=recompute)
    if stage.tensor_parallel_degree > 1:
        layout, note = tensor_layout_as_run(point)
        if note is not None:
            notes.append(note)
        stage = replace(stage, tensor_layout=layout)
    n = len(stage.ranks)
    if point.micro_batch is not None:
        # Per tensor group (all of its members run the same sequences).
        per_group = point.global_batch // len(stage.leaders)
        if per_group % point.micro_batch or per_group == 0:
            notes.append(f"micro-batch {point.micro_batch} does not divide {per_group}: as planned")
        else:
            stage = replace(
                stage,
                micro_batch_size=(point.micro_batch,) * n,
                num_micro_batches=(per_group // point.micro_batch,) * n,
            )
    routes = round_robin_routes((stage,))
    held = replace(plan, stages=(stage,), routes=routes, predicted=None)
    if first_memory_overflow(held) is not None:
        notes.append("the run as published does not fit piebald's memory model")
    return held, tuple(notes)


def _none(point: PublishedPoint, model_name: str, why: str) -> Outcome:
    return Outcome(
        point=point,
        model_name=model_name,
        predicted_tokens_per_s_per_gpu=None,
        why_none=why,
        plan_summary="",
        notes=(),
    )


def print_report(outcomes: list[Outcome]) -> None:
    print(
        "| point | GPU | model | seq | GPUs | measured tok/s/GPU | predicted tok/s/GPU | "
        "predicted / measured |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for o in outcomes:
        p = o.point
        predicted = (
            f"{o.predicted_tokens_per_s_per_gpu:,.0f}"
            if o.predicted_tokens_per_s_per_gpu is not None
            else o.why_none
        )
        ratio = f"{o.ratio:.2f}" if o.ratio is not None else "-"
        print(
            f"| {p.point_id} | {p.gpu_name} | {o.model_name} | {p.seq_len} | {p.num_gpus} | "
            f"{p.measured_tokens_per_s_per_gpu:,.0f} | {predicted} | {ratio} |"
        )
    errors = [abs(o.ratio - 1.0) for o in outcomes if o.ratio is not None]
    print()
    if errors:
        median, worst = statistics.median(errors), max(errors)
        print(
            f"|error| over {len(errors)} expressible points: median {median:.0%}, worst {worst:.0%}"
        )
    print(h100_over_a100_line(outcomes))
    print()
    print("Plans made and assumptions:")
    for o in outcomes:
        if o.plan_summary or o.notes:
            print(f"- {o.point.point_id}: {'; '.join((o.plan_summary, *o.notes))}")


def h100_over_a100_line(outcomes: list[Outcome]) -> str:
    """The predicted per-GPU H100 / A100 ratio for llama-3-8b beside the measured one."""
    by_id = {o.point.point_id: o for o in outcomes}
    h100, a100 = by_id.get(RATIO_H100), by_id.get(RATIO_A100)
    if h100 is None or a100 is None:
        return f"H100 / A100 ratio: needs both {RATIO_H100} and {RATIO_A100}"
    measured = h100.point.measured_tokens_per_s_per_gpu / a100.point.measured_tokens_per_s_per_gpu
    h100_predicted, a100_predicted = (
        h100.predicted_tokens_per_s_per_gpu,
        a100.predicted_tokens_per_s_per_gpu,
    )
    predicted = (
        "none"
        if h100_predicted is None or a100_predicted is None
        else f"{h100_predicted / a100_predicted:.2f}"
    )
    return (
        f"llama-3-8b H100 / A100 per GPU ({RATIO_H100} / {RATIO_A100}): predicted "
        f"{predicted}, measured {measured:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", help="comma-separated point ids (default: every point)")
    args = parser.parse_args(argv)
    try:
        points = load_points()
    except SpecError as error:  # a hand-edited published.yaml: one line, not a traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.points:
        known = {p.point_id: p for p in points}
        wanted = [name.strip() for name in args.points.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in known]
        if unknown or not wanted:
            print(
                f"error: --points: got {args.points!r}; expected ids from "
                f"benchmarks/published.yaml: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
        points = tuple(known[name] for name in wanted)
    started = time.perf_counter()
    outcomes = [predict(point) for point in points]
    print_report(outcomes)
    print(f"\n{len(points)} points in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
