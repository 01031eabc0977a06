"""The ``piebald`` command line: describe, check and plan heterogeneous training.

Every command turns bad input into one line on stderr and exit code 2 (3 when no plan
fits), never a traceback. Tables are drawn with rich; library code below never prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from piebald import __version__
from piebald.api import load_cluster, load_model
from piebald.cli import demo as cli_demo
from piebald.cli import launch as cli_launch
from piebald.cli import simulate as cli_simulate
from piebald.cli import train as cli_train
from piebald.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_INFEASIBLE,
    EXIT_RUN_FAILED,
    BatchOption,
    ClusterOption,
    ModelOption,
    PrecisionOption,
    SeqOption,
    WorkersOption,
    comparison_title,
    console,
    errors,
    inputs_from,
    job_from,
    load_checked_plan,
    profile_warnings,
    progress_bar,
    run_comparison,
    user_errors,
)
from piebald.cli.data import data_app
from piebald.cli.plots import plot_comparison
from piebald.cli.profile import ProfilesOption, profile_app
from piebald.cli.render import (
    catalog_table,
    cluster_table,
    comparison_table,
    explanation_tables,
    models_table,
    plan_summary,
    plan_table,
)
from piebald.figure_files import check_figure_file
from piebald.outputs import check_output_directory, check_output_file
from piebald.specs.cluster_yaml import cluster_to_dict
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.plan import Plan
from piebald.specs.plan_io import plan_to_dict, save_plan
from piebald.specs.presets import PRESETS
from piebald.specs.units import format_rate

if TYPE_CHECKING:
    from piebald.api import Comparison

# Under every command's --help: what its exit status means (rich joins a paragraph's lines
# unless they are separated by a blank one).
_EXIT_STATUS = (
    f"Exit status: 0 done; {EXIT_RUN_FAILED} a run failed (a worker's error or death); "
    f"{EXIT_BAD_INPUT} bad input, one line naming the file or flag; {EXIT_INFEASIBLE} no "
    "plan fits memory."
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Plan, simulate and train LLMs on heterogeneous GPU clusters.",
    epilog=f"{_EXIT_STATUS}\n\nExample: piebald plan --cluster src/piebald/examples/"
    "lab-mix.yaml --model llama-3.2-1b --global-batch 32 --seq-len 2048 --out plan.json",
)


def _version(value: bool) -> None:
    if value:
        console.print(f"piebald {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """piebald: plan, simulate and train LLMs on heterogeneous GPU clusters."""


@app.command("check-cluster")
@user_errors
def check_cluster(
    file: Annotated[Path, typer.Argument(help="Cluster YAML file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the normalised cluster.")] = False,
) -> None:
    """Validate a cluster file and show its nodes, GPUs, peak FLOP/s and memory."""
    cluster = load_cluster(file)
    if as_json:
        print(json.dumps(cluster_to_dict(cluster), indent=1))
        return
    console.print(cluster_table(cluster))
    for link in cluster.site_links:
        console.print(
            f"site link {link.sites[0]} <-> {link.sites[1]}: "
            f"{format_rate(link.bandwidth_bytes_per_s)}, "
            f"{link.latency_s * 1e3:g} ms"
        )


@app.command("models")
def models(
    seq_len: Annotated[int, typer.Option(min=1, help="Sequence length for FLOPs.")] = 2048,
) -> None:
    """List the model presets with their parameter counts."""
    console.print(models_table([load_model(name) for name in PRESETS], seq_len=seq_len))


@app.command("gpus")
def gpus() -> None:
    """List the built-in GPU catalog (dense peaks, memory, bandwidth)."""
    console.print(catalog_table(list(builtin_catalog().values())))


@app.command(
    "plan",
    epilog="Example: piebald plan --cluster src/piebald/examples/lab-mix.yaml --model "
    "llama-3.2-1b --global-batch 32 --seq-len 2048 --out plan.json\n\n" + _EXIT_STATUS,
)
@user_errors
def plan(
    cluster: ClusterOption,
    model: ModelOption,
    global_batch: BatchOption,
    seq_len: SeqOption,
    precision: PrecisionOption = Dtype.BF16,
    strategy: Annotated[str, typer.Option(help="piebald, or a baseline to plan as.")] = "piebald",
    zero: Annotated[
        str | None,
        typer.Option(help="Every stage in this ZeRO mode: none, optimizer, gradients, full."),
    ] = None,
    tensor_parallel: Annotated[
        int | None,
        typer.Option(
            "--tensor-parallel",
            help="Every stage at this tensor-parallel degree (1, 2, 4, 8); default: searched.",
        ),
    ] = None,
    recompute: Annotated[
        str | None,
        typer.Option(
            help="The recompute modes a stage may take: none, selective, full, or several "
            "comma-separated; default: all three up to 256 GPUs, none and full beyond.",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the plan JSON here.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan JSON.")] = False,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="Verify the top candidates in the simulator.")
    ] = False,
    profiles: ProfilesOption = None,
    workers: WorkersOption = None,
    checkpoint_every: cli_simulate.CheckpointEveryOption = None,
    mtbf: cli_simulate.MtbfOption = None,
    storage_write: cli_simulate.StorageWriteOption = None,
    fallbacks: Annotated[
        Path | None,
        typer.Option(
            help="Also write here the plan for the loss of any one node, one file per node "
            "group (elastic training reads it instead of searching).",
        ),
    ] = None,
) -> None:
    """Find the fastest plan for MODEL on CLUSTER that fits every GPU's memory."""
    from piebald.api import search_plans  # the planner: loaded by the commands that plan

    if out is not None:  # before any work: a plan nobody can save is no use
        check_output_file(out, flag="--out", force=force)
    every = cli_simulate.checkpoint_every_from(checkpoint_every, mtbf=mtbf)
    failures = cli_simulate.failure_model_from(mtbf=mtbf, storage_write=storage_write)
    if fallbacks is not None:
        check_output_directory(fallbacks, flag="--fallbacks")
    cluster_spec, model_spec = load_cluster(cluster), load_model(model)
    job = job_from(global_batch=global_batch, seq_len=seq_len, precision=precision)
    with profile_warnings(profiles), progress_bar("planning") as progress:
        found = search_plans(
            cluster_spec,
            model_spec,
            job,
            strategy=strategy,
            zero=zero,
            tensor_parallel=tensor_parallel,
            recompute=recompute,
            profiles=profiles,
            verify_by_simulation=simulate,
            progress=progress,
            workers=workers,
            checkpoint_every=every,
            failures=failures,
        )
    if found.verification is not None:
        cli_simulate.print_verification(found.verification)
    if out is not None:
        save_plan(found.plan, out, overwrite=force)
    if as_json:
        print(json.dumps(plan_to_dict(found.plan), indent=1))
    else:
        console.print(plan_table(found.plan, found.estimate))
        for line in plan_summary(
            found.plan,
            found.estimate,
            elapsed_s=found.elapsed_s,
            num_structures=found.num_structures,
        ):
            console.print(line, highlight=False)
        checkpoint = cli_simulate.checkpoint_line(found.plan, found.checkpoint)
        if checkpoint is not None:
            console.print(checkpoint, highlight=False, soft_wrap=True)
        if out is not None:
            console.print(f"plan written to {out}")
    if fallbacks is not None:
        # After the plan, which is of use without them; beside --json, on stderr.
        _write_fallbacks(
            found.plan, fallbacks, workers=workers, lines=errors if as_json else console
        )


def _write_fallbacks(plan: Plan, directory: Path, *, workers: int | None, lines: Console) -> None:
    """``plan --fallbacks``: the plan for each single node loss, a line as each is made."""
    from piebald.api import fallback_plans

    def progress(fraction: float, message: str) -> None:
        lines.print(f"fallback plan {fraction:4.0%}: {escape(message)}", highlight=False)

    made = fallback_plans(plan, directory, workers=workers, progress=progress)
    for node in made.infeasible:
        lines.print(f"no fallback plan without {escape(node)}: no plan fits", highlight=False)
    lines.print(
        f"{len(made.written)} fallback plans written to {escape(str(directory))}",
        highlight=False,
    )


@app.command("explain")
@user_errors
def explain(plan_file: Annotated[Path, typer.Argument(help="A plan JSON file.")]) -> None:
    """Where the plan's step time goes, what limits each GPU, and the runner-up plans."""
    from piebald.api import explain as explain_plan  # the planner, as in plan

    loaded = load_checked_plan(plan_file)
    # A plan made from profiles is explained with the prices it was made with.
    for renderable in explanation_tables(loaded, explain_plan(loaded)):
        console.print(renderable)


@app.command("compare")
@user_errors
def compare(
    cluster: ClusterOption,
    model: ModelOption,
    global_batch: BatchOption,
    seq_len: SeqOption,
    precision: PrecisionOption = Dtype.BF16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Draw a bar chart (PNG) here.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --plot file.")] = False,
    profiles: ProfilesOption = None,
    workers: WorkersOption = None,
) -> None:
    """piebald against every baseline (as modelled) and the upper bound."""
    if plot is not None:
        check_figure_file(plot, flag="--plot", force=force)
    cluster_spec, model_spec, job = inputs_from(cluster, model, global_batch, seq_len, precision)
    comparison = run_comparison(cluster_spec, model_spec, job, profiles=profiles, workers=workers)
    if plot is not None:
        plot_comparison(
            comparison, plot, title=comparison_title(cluster_spec, model_spec, job), force=force
        )
    if as_json:
        print(json.dumps(comparison_to_dict(comparison), indent=1))
        return
    console.print(
        comparison_table(comparison, title=comparison_title(cluster_spec, model_spec, job))
    )
    if plot is not None:
        console.print(f"bar chart written to {plot}")


def comparison_to_dict(comparison: Comparison) -> dict[str, object]:
    return {
        "results": [
            {
                "strategy": row.strategy,
                "feasible": row.feasible,
                "tokens_per_s": row.tokens_per_s,
                "step_time_s": row.step_time_s if row.feasible else None,
                "num_gpus_used": row.num_gpus_used,
                "reason": row.reason,
            }
            for row in comparison.rows
        ],
        "upper_bound_tokens_per_s": comparison.upper_bound_tokens_per_s,
    }


# Commands that live in their own modules (cli_*.py) are registered here, one line each.
app.command("demo")(cli_demo.demo)
app.command("launch")(cli_launch.launch)
app.command("simulate")(cli_simulate.simulate)
app.command(
    "train",
    epilog="Example (CPU processes emulating the plan's cluster): piebald plan --cluster "
    "src/piebald/examples/lab-mix.yaml --model tiny --global-batch 12 --seq-len 64 --out "
    "tiny.json, then piebald train --plan tiny.json --emulate --steps 3\n\n" + _EXIT_STATUS,
)(cli_train.train)
app.add_typer(profile_app, name="profile")
app.add_typer(data_app, name="data")


def main() -> None:
    sys.exit(app())
