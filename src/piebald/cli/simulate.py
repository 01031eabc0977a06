"""``piebald simulate``: execute a plan's step event by event, compare with the planner's
prediction, and draw it (Perfetto trace, Gantt PNG). Also the table of the verification
``piebald plan --simulate`` runs on its top candidates (``piebald.api.search_plans``).

Prices: with ``--profiles DIR``, compute and links from that profile DB (as ``plan
--profiles`` prices them); otherwise the numbers the plan file records in ``cost_inputs``
(a plan made with ``--profiles``), so the simulation and the prediction it is compared
with use the numbers the planner used; otherwise the analytic model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from piebald.cli.common import console, errors, load_checked_plan, profile_warnings, user_errors
from piebald.figure_files import check_figure_file
from piebald.outputs import check_output_file
from piebald.report.describe import describe_plan
from piebald.specs.plan import Plan

if TYPE_CHECKING:
    from piebald.api import PlanEstimate, SimulationReport, SimulationResult, Verification

__all__ = [
    "EXIT_DEADLOCK",
    "priced_by",
    "print_verification",
    "result_to_dict",
    "simulate",
]

EXIT_DEADLOCK = 4
GIB = 2.0**30


def result_to_dict(result: SimulationResult, *, estimate: PlanEstimate) -> dict[str, Any]:
    predicted = estimate.prediction()
    deadlock = result.deadlock
    return {
        "step_time_s": None if deadlock else result.step_time_s,
        "tokens_per_s": result.tokens_per_s,
        "bubble_fraction": result.bubble_fraction,
        "pipeline_s": result.pipeline_s,
        "peak_memory_bytes": {str(s.rank): s.peak_memory_bytes for s in result.ranks},
        "deadlock": None
        if deadlock is None
        else {
            "cycle": list(deadlock.cycle),
            "waits": [
                {"rank": w.rank, "operation": w.operation, "waits_for": list(w.waits_for)}
                for w in deadlock.waits
            ],
            "stalled_at_s": result.step_time_s,
        },
        "predicted": {
            "step_time_s": predicted.step_time_s,
            "tokens_per_s": predicted.tokens_per_s,
            "peak_memory_bytes": {str(r): b for r, b in predicted.peak_memory_bytes.items()},
        },
        "ranks": [
            {
                "rank": s.rank,
                "stage": s.stage,
                "device": s.device,
                "busy_s": s.busy_s,
                "blocked_s": s.blocked_s,
                "idle_s": s.idle_s,
            }
            for s in result.ranks
        ],
    }


def _ranks_table(plan: Plan, result: SimulationResult, estimate: PlanEstimate) -> Table:
    predicted = estimate.prediction().peak_memory_bytes
    table = Table(
        title=f"{plan.model.name} on {plan.cluster.name}: simulated step, per GPU",
        caption="busy: compute; blocked: waiting for its own data-parallel traffic; "
        "idle: waiting for other stages (bubble) or done early",
    )
    for name in ("stage", "rank", "GPU", "busy", "blocked", "idle", "peak memory (sim / est)"):
        table.add_column(name, justify="left" if name == "GPU" else "right")
    step = result.step_time_s or 1.0
    for stats in sorted(result.ranks, key=lambda s: (s.stage, s.rank)):
        table.add_row(
            str(stats.stage),
            str(stats.rank),
            stats.device,
            f"{stats.busy_s / step:.0%}",
            f"{stats.blocked_s / step:.0%}",
            f"{stats.idle_s / step:.0%}",
            f"{stats.peak_memory_bytes / GIB:.1f} / {predicted[stats.rank] / GIB:.1f} GiB",
        )
    return table


def _check_outputs(*, trace: Path | None, gantt: Path | None, force: bool) -> None:
    """Before the simulation: both outputs can be written (and may be replaced)."""
    if trace is not None:
        check_output_file(trace, flag="--trace", force=force)
    if gantt is not None:
        check_figure_file(gantt, flag="--gantt", force=force)


def priced_by(report: SimulationReport, profiles: Path | None) -> str:
    """A line saying where the prices of ``report`` come from."""
    from piebald.api import PriceBasis  # loaded by simulate_report, which made ``report``

    if report.basis is PriceBasis.PROFILE_DB:
        return f"priced from the profile DB {profiles}" + (
            " (not the one the plan was made with)" if report.other_db else ""
        )
    if report.basis is PriceBasis.RECORDED:
        assert report.plan.cost_inputs is not None
        db = report.plan.cost_inputs.profile_db
        return (
            f"priced by the analytic cost model (the profile DB {db} the plan was made with "
            "measured none of its GPU types or links)"
            if report.plan.cost_inputs.measured_nothing
            else f"priced from the measurements the plan records (profile DB {db})"
        )
    return "priced by the analytic cost model"


@user_errors
def simulate(
    plan_file: Annotated[Path, typer.Option("--plan", help="A plan JSON file.")],
    trace: Annotated[
        Path | None, typer.Option(help="Write a Chrome/Perfetto trace JSON here.")
    ] = None,
    gantt: Annotated[Path | None, typer.Option(help="Draw a Gantt chart (PNG) here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    force: Annotated[bool, typer.Option(help="Replace existing --trace/--gantt files.")] = False,
    profiles: Annotated[
        Path | None,
        typer.Option(
            "--profiles",
            help="A profile DB directory: price compute, activation memory and links from "
            "its measurements (default: the measurements the plan file records, if any).",
        ),
    ] = None,
) -> None:
    """Execute one step of a plan event by event: step time, bubble, per-GPU busy/idle
    time and memory, against the planner's prediction; optionally a trace and a Gantt chart."""
    # Here, not at the top: the simulator loads with this command, not with every command.
    from piebald.api import plot_gantt, simulate_report, write_trace

    _check_outputs(trace=trace, gantt=gantt, force=force)
    loaded = load_checked_plan(plan_file)
    with profile_warnings(profiles):
        report = simulate_report(loaded, profiles=profiles, timeline=True)
    plan, result, estimate = report.plan, report.result, report.estimate
    if trace is not None:
        write_trace(plan, result, trace, overwrite=force)
    if gantt is not None:
        plot_gantt(
            plan, result, gantt, title=f"{plan.model.name} on {plan.cluster.name}", force=force
        )
    if as_json:
        print(json.dumps(result_to_dict(result, estimate=estimate), indent=1))
    else:
        console.print(_ranks_table(plan, result, estimate))
        if result.deadlock is None:
            ratio = result.step_time_s / estimate.step_time_s
            console.print(
                f"simulated step {result.step_time_s:.3f} s, {result.tokens_per_s:,.0f} "
                f"tokens/s, bubble {result.bubble_fraction:.1%}; planner predicted "
                f"{estimate.step_time_s:.3f} s (simulated / predicted = {ratio:.3f}); "
                f"{priced_by(report, profiles)}",
                highlight=False,
            )
        for path, what in ((trace, "trace"), (gantt, "Gantt chart")):
            if path is not None:
                console.print(f"{what} written to {path}")
    if result.deadlock is not None:
        errors.print(f"[red]{result.deadlock.describe()}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_DEADLOCK)


def print_verification(verification: Verification) -> None:
    """The candidates ``plan --simulate`` compared, the chosen one starred."""
    table = Table(title="top candidates, verified in the simulator")
    for name in ("#", "plan", "predicted step", "simulated step", "sim / pred"):
        table.add_column(name, justify="left" if name == "plan" else "right")
    for index, candidate in enumerate(verification.candidates):
        sim, estimate = candidate.simulated, candidate.scored.estimate
        table.add_row(
            f"{index}{' *' if index == verification.chosen_index else ''}",
            describe_plan(candidate.scored.plan),
            f"{estimate.step_time_s:.3f} s",
            "deadlock" if sim.deadlock else f"{sim.step_time_s:.3f} s",
            "-" if sim.deadlock else f"{sim.step_time_s / estimate.step_time_s:.3f}",
        )
    console.print(table)
