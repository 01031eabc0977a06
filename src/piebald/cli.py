"""The ``piebald`` command line: describe, check and plan heterogeneous training.

Every command turns bad input into one line on stderr and exit code 2 (3 when no plan
fits), never a traceback. Tables are drawn with rich; library code below never prints.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from piebald import __version__
from piebald.errors import SpecError
from piebald.examples import example_path
from piebald.planner.data_parallel import Infeasible, build_data_parallel_plan
from piebald.render import catalog_table, cluster_table, models_table, plan_table
from piebald.specs.cluster_yaml import cluster_to_dict, load_cluster
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.job import JobSpec
from piebald.specs.plan_io import plan_to_dict, save_plan
from piebald.specs.presets import PRESETS, load_model

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Plan, simulate and train LLMs on heterogeneous GPU clusters.",
)
# Piped output (CI logs, the README) gets 120 columns instead of rich's default of 80.
console = Console(width=None if sys.stdout.isatty() else 120)
errors = Console(stderr=True)

P = ParamSpec("P")
R = TypeVar("R")

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report bad input as one line and a non-zero exit code instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except SpecError as error:
            errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except FileExistsError as error:
            errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except Infeasible as error:
            errors.print(
                f"[red]no feasible plan:[/red] {escape(str(error))}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_INFEASIBLE) from None

    return wrapper


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
            f"{link.bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s, "
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


@app.command("plan")
@user_errors
def plan(
    cluster: Annotated[Path, typer.Option(help="Cluster YAML file.")],
    model: Annotated[str, typer.Option(help="Preset name or Hugging Face config.json path.")],
    global_batch: Annotated[int, typer.Option(min=1, help="Sequences per optimizer step.")],
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")],
    micro_batch_size: Annotated[int, typer.Option(min=1)] = 1,
    precision: Annotated[Dtype, typer.Option(help="Requested training precision.")] = Dtype.BF16,
    out: Annotated[Path | None, typer.Option(help="Write the plan JSON here.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan JSON.")] = False,
) -> None:
    """Plan training of MODEL on CLUSTER (one-stage heterogeneous data parallelism for now)."""
    cluster_spec = load_cluster(cluster)
    model_spec = load_model(model)
    job = _job(global_batch=global_batch, seq_len=seq_len, precision=precision)
    if global_batch % micro_batch_size:
        raise SpecError(
            source="--global-batch",
            field="",
            value=global_batch,
            expected=f"a multiple of --micro-batch-size {micro_batch_size}",
        )
    scored = build_data_parallel_plan(
        cluster_spec, model=model_spec, job=job, micro_batch_size=micro_batch_size
    )
    if out is not None:
        save_plan(scored.plan, out, overwrite=force)
    if as_json:
        print(json.dumps(plan_to_dict(scored.plan), indent=1))
        return
    console.print(plan_table(scored.plan, scored.estimate))
    if out is not None:
        console.print(f"plan written to {out}")


def _job(*, global_batch: int, seq_len: int, precision: Dtype) -> JobSpec:
    return JobSpec(global_batch_size=global_batch, seq_len=seq_len, precision=precision)


@app.command("demo")
@user_errors
def demo(
    out_dir: Annotated[Path, typer.Option(help="Where the demo writes its artefacts.")] = Path(
        "out/demo"
    ),
) -> None:
    """Check the built-in example cluster, then plan gpt2 on it and save the plan."""
    cluster = load_cluster(example_path())
    console.rule("[bold]1. describe: the built-in example cluster")
    console.print(cluster_table(cluster))
    model = load_model("gpt2")
    job = _job(global_batch=64, seq_len=1024, precision=Dtype.BF16)
    console.rule(
        f"[bold]2. plan: {model.name}, global batch {job.global_batch_size} x {job.seq_len} tokens"
    )
    scored = build_data_parallel_plan(cluster, model=model, job=job, micro_batch_size=4)
    console.print(plan_table(scored.plan, scored.estimate))
    save_plan(scored.plan, out_dir / "plan.json", overwrite=True)
    console.print(f"plan written to {out_dir / 'plan.json'}")


def main() -> None:
    sys.exit(app())
