"""``piebald demo`` (what ``make demo`` runs): the whole product on the built-in cluster.

Describe the example cluster (six GPUs of three types, two NIC classes), plan llama-3.2-1b
on it, explain the plan, compare it with every baseline, simulate it (trace and Gantt
chart), then train it for a few steps on emulated GPUs, one CPU process each, beside the
best baseline that treats every GPU alike, and print measured tokens/s next to the
predictions. The job is small (16 sequences of 512 tokens) so that the emulated training
runs on a 2-core machine in about two minutes; the processes train the model at reduced
width (the same layers, hidden size 64) while every operation waits out the time the cost
model gives the full model on the emulated GPU, stretched by ``TIME_SCALE``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from piebald.api import load_cluster, load_model
from piebald.cli.common import (
    comparison_title,
    console,
    job_from,
    progress_bar,
    require_installed,
    run_comparison,
    user_errors,
)
from piebald.cli.plots import plot_comparison
from piebald.cli.render import (
    cluster_table,
    comparison_table,
    explanation_tables,
    plan_summary,
    plan_table,
)
from piebald.examples import example_path
from piebald.outputs import check_output_directory, check_output_file
from piebald.specs.devices import Dtype
from piebald.specs.plan import Plan
from piebald.specs.plan_io import save_plan

if TYPE_CHECKING:  # the runtime imports torch: only the training step of the demo loads it
    from piebald.api import Comparison, RunSummary

__all__ = [
    "HOMOGENEOUS_BASELINES",
    "TIME_SCALE",
    "artefact_paths",
    "best_homogeneous",
    "demo",
    "metrics_file",
]

MODEL = "llama-3.2-1b"  # planned at full size, trained at reduced width
GLOBAL_BATCH, SEQ_LEN = 16, 512
TRAIN_STEPS = 3
# Wall seconds per emulated second: the CPU's real work for one reduced-width step takes
# about 2.6 s here against a 0.15 s emulated step, so 50 leaves room on a busy machine.
TIME_SCALE = 50.0
# Baselines that give every GPU the same work, as today's tools do.
HOMOGENEOUS_BASELINES = ("megatron", "zero-even")


def best_homogeneous(comparison: Comparison) -> tuple[str, Plan] | None:
    rows = [
        row
        for row in comparison.rows
        if row.strategy in HOMOGENEOUS_BASELINES and row.feasible and row.plan is not None
    ]
    if not rows:
        return None
    best = max(rows, key=lambda row: row.tokens_per_s)
    assert best.plan is not None
    return best.strategy, best.plan


def demo(
    out_dir: Annotated[Path, typer.Option(help="Where the demo writes its artefacts.")] = Path(
        "out/demo"
    ),
    train_steps: Annotated[
        int, typer.Option(min=0, help="Emulated training steps per plan (0: skip training).")
    ] = TRAIN_STEPS,
    force: Annotated[
        bool, typer.Option(help="Replace the artefacts of an earlier demo in --out-dir.")
    ] = False,
) -> None:
    """Describe, plan, explain, compare, simulate and train (emulated) on the built-in
    cluster; artefacts under --out-dir."""
    run_demo(out_dir=out_dir, train_steps=train_steps, force=force)


def metrics_file(out_dir: Path, strategy: str) -> Path:
    return out_dir / f"metrics-{strategy}.jsonl"


def artefact_paths(out_dir: Path, *, train_steps: int) -> list[Path]:
    """Every file the demo may write in ``out_dir`` (the baseline trained is one of
    ``HOMOGENEOUS_BASELINES``, known only after the comparison: all are listed)."""
    paths = [out_dir / name for name in ("plan.json", "compare.png", "trace.json", "gantt.png")]
    if train_steps:
        paths += [metrics_file(out_dir, name) for name in ("piebald", *HOMOGENEOUS_BASELINES)]
    return paths


def _check_artefacts(out_dir: Path, *, train_steps: int, force: bool) -> None:
    """Before any work: the user's files in --out-dir are never replaced without --force
    (and then only regular files), and the directory can be written."""
    check_output_directory(out_dir, flag="--out-dir")
    for path in artefact_paths(out_dir, train_steps=train_steps):
        check_output_file(path, flag="--out-dir", force=force)


@user_errors
def run_demo(*, out_dir: Path, train_steps: int, force: bool = False) -> None:
    # Here, not at the top: the planner and the simulator load when the demo runs, not
    # with every command (``piebald --help``).
    from piebald.api import estimate, explain, plot_gantt, search_plans, simulate, write_trace

    if train_steps:  # before five sections of output, not after them
        require_installed("torch")
    _check_artefacts(out_dir, train_steps=train_steps, force=force)
    cluster = load_cluster(example_path())
    model = load_model(MODEL)
    job = job_from(global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, precision=Dtype.BF16)
    title = comparison_title(cluster, model, job)
    out_dir.mkdir(parents=True, exist_ok=True)

    console.rule("[bold]1. describe: the built-in example cluster")
    console.print(cluster_table(cluster))

    console.rule(f"[bold]2. plan: {model.name}, global batch {GLOBAL_BATCH} x {SEQ_LEN} tokens")
    with progress_bar("planning") as progress:
        found = search_plans(cluster, model, job, progress=progress)
    plan = found.plan
    console.print(plan_table(plan, found.estimate))
    for line in plan_summary(
        plan, found.estimate, elapsed_s=found.elapsed_s, num_structures=found.num_structures
    ):
        console.print(line, highlight=False)
    plan_path = out_dir / "plan.json"
    save_plan(plan, plan_path, overwrite=force, flag="--out-dir")

    console.rule("[bold]3. explain")
    for renderable in explanation_tables(plan, explain(plan)):
        console.print(renderable)

    console.rule("[bold]4. compare with the baselines")
    comparison = run_comparison(cluster, model, job)
    console.print(comparison_table(comparison, title=title))
    plot_path = out_dir / "compare.png"
    plot_comparison(comparison, plot_path, title=title, force=force, flag="--out-dir")

    console.rule("[bold]5. simulate the plan, operation by operation")
    simulated = simulate(plan, timeline=True)
    trace_path, gantt_path = out_dir / "trace.json", out_dir / "gantt.png"
    write_trace(plan, simulated, trace_path, overwrite=force, flag="--out-dir")
    plot_gantt(
        plan,
        simulated,
        gantt_path,
        title=f"{plan.model.name} on {plan.cluster.name}",
        force=force,
        flag="--out-dir",
    )
    predicted_s = estimate(plan).step_time_s
    console.print(
        f"simulated step {simulated.step_time_s:.3f} s ({simulated.tokens_per_s:,.0f} tokens/s, "
        f"bubble {simulated.bubble_fraction:.1%}); planner predicted {predicted_s:.3f} s",
        highlight=False,
    )
    artefacts = [plan_path, plot_path, trace_path, gantt_path]

    if train_steps:
        console.rule(f"[bold]6. train {train_steps} steps on the emulated cluster")
        console.print(
            f"one CPU process per GPU (gloo); {model.name} at reduced width (same layers, a "
            f"hidden size its tensor groups can split) in fp32; every operation lasts the full "
            f"model's time on its emulated GPU "
            f"x {TIME_SCALE:g}; the built-in corpus, byte-tokenised",
            highlight=False,
        )
        plans = [("piebald", plan)]
        baseline = best_homogeneous(comparison)
        if baseline is not None:
            plans.append(baseline)
        rows = []
        for name, chosen in plans:
            metrics_path = metrics_file(out_dir, name)
            # Appended step by step, so not written atomically: checked again (a regular
            # file, and --force) right before an earlier run's file is removed.
            check_output_file(metrics_path, flag="--out-dir", force=force)
            metrics_path.unlink(missing_ok=True)
            console.print(f"[bold]{name}[/bold]: {_shape(chosen)}", highlight=False)
            run = _emulate(chosen, steps=train_steps, metrics_path=metrics_path)
            rows.append((name, chosen, run, simulate(chosen).tokens_per_s))
            artefacts.append(metrics_path)
        console.print(_training_table(rows))
        console.print(_memory_table(plan, rows[0][2]))
    console.print("artefacts: " + ", ".join(str(path) for path in artefacts), highlight=False)


def _shape(plan: Plan) -> str:
    stages = " | ".join(
        "+".join(plan.cluster.device_of(rank).name for rank in stage.ranks) for stage in plan.stages
    )
    idle = f", {len(plan.idle_ranks)} idle" if plan.idle_ranks else ""
    return f"{plan.num_stages} stage(s): {stages}{idle}"


def _emulate(plan: Plan, *, steps: int, metrics_path: Path) -> RunSummary:
    from piebald.api import DEFAULT_MAX_EMULATED_PARAMS, TrainConfig, emulate

    config = TrainConfig(steps=steps, seed=0, time_scale=TIME_SCALE, metrics_path=metrics_path)
    return emulate(plan, config=config, max_params=DEFAULT_MAX_EMULATED_PARAMS)


def _training_table(rows: list[tuple[str, Plan, RunSummary, float]]) -> Table:
    table = Table(
        title="emulated training: measured against predicted",
        caption="measured: tokens of the global batch over the emulated step time (median of "
        "the steps after the first); overruns: operations whose real CPU work outlasted "
        "their emulated time",
    )
    columns = (
        "plan",
        "predicted tokens/s",
        "simulated",
        "measured",
        "measured / predicted",
        "loss first -> last",
        "overruns",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "plan" else "right")
    for name, plan, run, simulated in rows:
        predicted = plan.predicted.tokens_per_s if plan.predicted is not None else float("nan")
        table.add_row(
            name,
            f"{predicted:,.0f}",
            f"{simulated:,.0f}",
            f"{run.tokens_per_s:,.0f}",
            f"{run.tokens_per_s / predicted:.2f}",
            f"{run.losses[0]:.3f} -> {run.losses[-1]:.3f}",
            f"{run.overruns} / {run.paced_operations}",
        )
    return table


def _memory_table(plan: Plan, run: RunSummary) -> Table:
    """Per rank of the piebald plan: the meter's peak of live tensor bytes against the
    plan's prediction for the same (reduced-width) model without the framework reserve."""
    table = Table(
        title="memory per rank: measured against predicted (tensors only, reduced width)",
        caption="measured: peak bytes of live tensors over the steps; predicted: the cost "
        "model for this model and dtype, framework reserve left out",
    )
    for column in ("rank", "GPU", "stage", "ZeRO", "measured MiB", "predicted MiB", "ratio"):
        table.add_column(column, justify="left" if column in ("GPU", "ZeRO") else "right")
    for rank_text, sizes in sorted(run.memory.items(), key=lambda item: int(item[0])):
        rank = int(rank_text)
        stage = plan.stage_of_rank[rank]
        measured, predicted = sizes["measured_bytes"], sizes["predicted_bytes"]
        table.add_row(
            rank_text,
            plan.cluster.device_of(rank).name,
            str(stage),
            plan.stages[stage].zero.value,
            f"{measured / 2**20:,.1f}",
            f"{predicted / 2**20:,.1f}",
            f"{measured / predicted:.2f}" if predicted else "-",
        )
    return table
