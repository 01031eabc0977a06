"""``piebald simulate``: execute a plan's step event by event, compare with the planner's
prediction, and draw it (Perfetto trace, Gantt PNG). Also the table of the verification
``piebald plan --simulate`` runs on its top candidates (``piebald.api.search_plans``).

Prices: with ``--profiles DIR``, compute and links from that profile DB (as ``plan
--profiles`` prices them); otherwise the numbers the plan file records in ``cost_inputs``
(a plan made with ``--profiles``), so the simulation and the prediction it is compared
with use the numbers the planner used; otherwise the analytic model.

With ``--mtbf``, also what a failure costs and the checkpoint interval (Young's, Daly's)
at the simulated step time (``cost.failure``). The flags of a failure model are read
here, and ``piebald plan --checkpoint-every`` reads them here too."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from piebald.cli.common import console, errors, load_checked_plan, profile_warnings, user_errors
from piebald.errors import ArgumentError
from piebald.figure_files import check_figure_file
from piebald.outputs import check_output_file
from piebald.report.describe import describe_plan
from piebald.specs.plan import Plan
from piebald.specs.units import (
    UnitError,
    format_bytes,
    format_duration,
    format_rate,
    parse_duration_s,
    parse_rate,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from piebald.api import PlanEstimate, SimulationReport, SimulationResult, Verification
    from piebald.cost.failure import FailureModel, FailurePrice

__all__ = [
    "EXIT_DEADLOCK",
    "CheckpointEveryOption",
    "MtbfOption",
    "StorageWriteOption",
    "checkpoint_every_from",
    "checkpoint_line",
    "failure_lines",
    "failure_model_from",
    "failure_to_dict",
    "interval_line",
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


MtbfOption = Annotated[
    str | None,
    typer.Option(
        "--mtbf",
        help="Mean time between failures of the whole run (24h, 3600s, 2d): price a failure "
        "and choose the checkpoint interval (Young/Daly).",
    ),
]
StorageWriteOption = Annotated[
    str | None,
    typer.Option(
        "--storage-write",
        help="One node's write bandwidth to the checkpoint storage, with --mtbf (default 20Gb/s).",
    ),
]
CheckpointEveryOption = Annotated[
    str | None,
    typer.Option(
        "--checkpoint-every",
        help="Record in the plan how often to checkpoint: N steps, or auto, Daly's interval "
        "for --mtbf (the default with --mtbf).",
    ),
]
_DURATION = "'24h', '3600s' or '15s'"
_RATE = "'20Gb/s' or '2GB/s'"


def _quantity(
    flag: str, text: str, parse: Callable[[object], float], example: str, *, positive: bool
) -> float:
    """``text`` of ``flag`` parsed, or one line naming the flag (exit 2)."""
    try:
        value = parse(text)
    except UnitError:
        kind = "positive" if positive else "non-negative"
        raise ArgumentError(
            argument=flag, value=text, expected=f"a {kind} quantity with a unit, like {example}"
        ) from None
    if positive and value <= 0:
        raise ArgumentError(argument=flag, value=text, expected=f"a quantity > 0, like {example}")
    return value


def failure_model_from(
    *,
    mtbf: str | None,
    storage_write: str | None = None,
    storage_read: str | None = None,
    detect_time: str | None = None,
    restart_time: str | None = None,
    replan_time: str | None = None,
) -> FailureModel | None:
    """The failure model of ``--mtbf`` and the flags that refine it (None without
    ``--mtbf``); a flag that does not parse, or one given without ``--mtbf``, is one line
    naming it (exit 2). ``--storage-read`` defaults to ``--storage-write``: the same path
    to the same storage."""
    refinements = {
        "--storage-write": storage_write,
        "--storage-read": storage_read,
        "--detect-time": detect_time,
        "--restart-time": restart_time,
        "--replan-time": replan_time,
    }
    if mtbf is None:
        for flag, text in refinements.items():
            if text is not None:
                raise ArgumentError(
                    argument=flag, value=text, expected="--mtbf with it (the failure rate)"
                )
        return None
    # Here, not at the top: cost.memory and numpy load with the commands that price.
    from piebald.cost.failure import FailureModel

    values: dict[str, float] = {
        "mtbf_s": _quantity("--mtbf", mtbf, parse_duration_s, _DURATION, positive=True)
    }
    if storage_write is not None:
        values["write_bytes_per_s"] = _quantity(
            "--storage-write", storage_write, parse_rate, _RATE, positive=True
        )
    read = storage_read if storage_read is not None else storage_write
    if read is not None:
        flag = "--storage-read" if storage_read is not None else "--storage-write"
        values["read_bytes_per_s"] = _quantity(flag, read, parse_rate, _RATE, positive=True)
    for flag, text, name in (
        ("--detect-time", detect_time, "detect_s"),
        ("--restart-time", restart_time, "restart_s"),
        ("--replan-time", replan_time, "replan_s"),
    ):
        if text is not None:
            values[name] = _quantity(flag, text, parse_duration_s, _DURATION, positive=False)
    return FailureModel(**values)


def checkpoint_every_from(text: str | None, *, mtbf: str | None) -> int | str | None:
    """``--checkpoint-every``: a whole number of steps >= 1, or auto, which needs
    ``--mtbf``; anything else is one line naming the flag (exit 2)."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        if mtbf is None:
            raise ArgumentError(
                argument="--checkpoint-every",
                value=text,
                expected="--mtbf with it: auto is Daly's interval for that failure rate",
            )
        return "auto"
    # ASCII digits, few enough to convert (str.isdigit takes "²", int() refuses it).
    if re.fullmatch(r"\s*[0-9]{1,18}\s*", text) is None or int(text) < 1:
        raise ArgumentError(
            argument="--checkpoint-every",
            value=text,
            expected="a whole number of steps >= 1, or auto",
        )
    return int(text)


def checkpoint_line(plan: Plan, price: FailurePrice | None) -> str | None:
    """What ``plan --checkpoint-every`` prints: the interval the plan records and why, in
    one line (None where it records none)."""
    if price is not None:
        return interval_line(price, given_by="--checkpoint-every")
    if plan.checkpoint_every_steps is None:
        return None
    return f"checkpoint every {plan.checkpoint_every_steps} steps (--checkpoint-every)"


def failure_to_dict(price: FailurePrice) -> dict[str, Any]:
    """The ``failure`` object of ``--json``: the model priced, the checkpoint, the
    intervals and one failure's cost, in seconds, bytes and steps."""
    model, cost = price.model, price.cost
    return {
        "mtbf_s": model.mtbf_s,
        "write_bytes_per_s": model.write_bytes_per_s,
        "read_bytes_per_s": model.read_bytes_per_s,
        "step_time_s": price.step_time_s,
        "checkpoint_bytes": price.checkpoint_bytes,
        "save_s": price.save_s,
        "young_steps": price.young_steps,
        "daly_steps": price.daly_steps,
        "checkpoint_every_steps": price.checkpoint_every,
        "checkpoint_every_source": "plan" if price.given else "daly",
        "overhead_fraction": price.overhead,
        "daly_overhead_fraction": price.daly_overhead,
        "cost": {
            "detect_s": cost.detect_s,
            "restart_s": cost.restart_s,
            "replan_s": cost.replan_s,
            "restore_s": cost.restore_s,
            "lost_work_s": cost.lost_work_s,
            "total_s": cost.total_s,
        },
    }


def interval_line(price: FailurePrice, *, given_by: str) -> str:
    """One line: the checkpoint interval priced and why (``given_by``: where an interval
    that is not Daly's came from)."""
    every = price.checkpoint_every
    span = format_duration(every * price.step_time_s)
    daly = (
        f"Daly's for MTBF {format_duration(price.model.mtbf_s)} and a "
        f"{format_duration(price.save_s)} save"
    )
    if price.given:
        return (
            f"checkpoint every {every} steps ({span}, {given_by}): overhead "
            f"{price.overhead:.2%}; {daly}: {price.daly_steps} steps, {price.daly_overhead:.2%}"
        )
    return (
        f"checkpoint every {every} steps ({span}): {daly} (Young's {price.young_steps}); "
        f"overhead {price.overhead:.2%}"
    )


def failure_lines(price: FailurePrice, *, given_by: str) -> list[str]:
    """What ``--mtbf`` prints: the checkpoint, one failure's cost, and the interval."""
    model, cost = price.model, price.cost
    return [
        f"checkpoint: {format_bytes(price.checkpoint_bytes)} from the busiest node, saved in "
        f"{format_duration(price.save_s)} at {format_rate(model.write_bytes_per_s)} and "
        f"restored in {format_duration(cost.restore_s)} at {format_rate(model.read_bytes_per_s)}",
        f"a failure costs {format_duration(cost.total_s)}: detect "
        f"{format_duration(cost.detect_s)}, restart {format_duration(cost.restart_s)}, "
        f"re-plan {format_duration(cost.replan_s)}, restore {format_duration(cost.restore_s)}, "
        f"lost work {format_duration(cost.lost_work_s)} (half of "
        f"{price.checkpoint_every} steps)",
        interval_line(price, given_by=given_by),
    ]


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
    mtbf: MtbfOption = None,
    storage_write: StorageWriteOption = None,
    storage_read: Annotated[
        str | None,
        typer.Option(
            "--storage-read",
            help="One node's read bandwidth from the checkpoint storage, with --mtbf "
            "(default: --storage-write's).",
        ),
    ] = None,
    detect_time: Annotated[
        str | None,
        typer.Option(
            "--detect-time",
            help="Until a failure is noticed, with --mtbf (default 15s: torchrun's "
            "heartbeats; a hang waits for the collective timeout).",
        ),
    ] = None,
    restart_time: Annotated[
        str | None,
        typer.Option(
            "--restart-time",
            help="Starting the processes and their process groups again, with --mtbf "
            "(default 30s).",
        ),
    ] = None,
    replan_time: Annotated[
        str | None,
        typer.Option(
            "--replan-time", help="Planning for the GPUs left, with --mtbf (default 15s)."
        ),
    ] = None,
) -> None:
    """Execute one step of a plan event by event: step time, bubble, per-GPU busy/idle
    time and memory, against the planner's prediction; optionally a trace and a Gantt chart,
    and with --mtbf what a failure costs and how often to checkpoint."""
    # Here, not at the top: the simulator loads with this command, not with every command.
    from piebald.api import plot_gantt, simulate_report, write_trace

    failures = failure_model_from(
        mtbf=mtbf,
        storage_write=storage_write,
        storage_read=storage_read,
        detect_time=detect_time,
        restart_time=restart_time,
        replan_time=replan_time,
    )
    _check_outputs(trace=trace, gantt=gantt, force=force)
    loaded = load_checked_plan(plan_file)
    with profile_warnings(profiles):
        report = simulate_report(loaded, profiles=profiles, timeline=True, failures=failures)
    plan, result, estimate = report.plan, report.result, report.estimate
    if trace is not None:
        write_trace(plan, result, trace, overwrite=force)
    if gantt is not None:
        plot_gantt(
            plan, result, gantt, title=f"{plan.model.name} on {plan.cluster.name}", force=force
        )
    if as_json:
        data = result_to_dict(result, estimate=estimate)
        if report.failures is not None:
            data["failure"] = failure_to_dict(report.failures)
        print(json.dumps(data, indent=1))
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
        if report.failures is not None:
            for line in failure_lines(report.failures, given_by="the plan's"):
                console.print(line, highlight=False, soft_wrap=True)
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
