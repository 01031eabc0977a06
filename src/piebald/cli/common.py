"""What every ``piebald`` command shares: the consoles, the bad-input guard, a progress
bar that appears after a second, the common options, and reading cluster, model and job.

Command modules (``cli/*.py``) import from here; ``cli.commands`` registers them on the app.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ParamSpec, TextIO, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from piebald.api import ProfileWarning, build_job, load_cluster, load_model, load_plan
from piebald.errors import ArgumentError, ModelWarning, RunFailedError, SpecError
from piebald.extras import install_hint
from piebald.specs.cluster import ClusterSpec
from piebald.specs.devices import Dtype
from piebald.specs.job import JobSpec, check_job_fits_model
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

if TYPE_CHECKING:
    from piebald.api import Comparison

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INFEASIBLE",
    "EXIT_RUN_FAILED",
    "FLAG_OF_ARGUMENT",
    "BatchOption",
    "ClusterOption",
    "ModelOption",
    "PrecisionOption",
    "SeqOption",
    "comparison_title",
    "console",
    "errors",
    "inputs_from",
    "job_from",
    "load_checked_plan",
    "model_warnings",
    "profile_warnings",
    "progress_bar",
    "require_installed",
    "run_comparison",
    "user_errors",
]

# Piped output (CI logs, the README) gets 120 columns instead of rich's default of 80.
console = Console(width=None if sys.stdout.isatty() else 120)
errors = Console(stderr=True)

P = ParamSpec("P")
R = TypeVar("R")

EXIT_RUN_FAILED = 1  # a run failed while running (a worker killed, or its error)
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3

# The flag of each library argument an ArgumentError can name: the library speaks of its
# arguments (piebald.plan(strategy=...)), a command-line user of flags.
FLAG_OF_ARGUMENT = {
    "cluster": "--cluster",
    "device": "--device",
    "device_name": "--device-name",
    "global_batch": "--global-batch",
    "model": "--model",
    "name_or_path": "--model",
    "profiles": "--profiles",
    "recompute": "--recompute",
    "seq_len": "--seq-len",
    "strategy": "--strategy",
    "tensor_parallel": "--tensor-parallel",
    "zero": "--zero",
}


def require_installed(module: str) -> None:
    """Stop a command that will need ``module`` (an optional dependency, ``piebald.extras``)
    before it does any work, where it is not installed (``user_errors`` reports it)."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Report bad input as one line and a non-zero exit code instead of a traceback; so
    too a command run without the optional dependency it needs (exit 2), and a run that
    failed while running (``RunFailedError``: exit 1). Each ``ModelWarning`` the command
    issues is a ``warning:`` line on stderr (``model_warnings``)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with model_warnings():
                return command(*args, **kwargs)
        except ModuleNotFoundError as error:
            module = (error.name or "").partition(".")[0]
            install = install_hint(module)
            if install is None:
                raise
            errors.print(
                f"[red]error:[/red] this command needs {module}, which is not installed: "
                f"{escape(install)}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except SpecError as error:
            if isinstance(error, ArgumentError):
                error = error.with_source(FLAG_OF_ARGUMENT.get(error.argument, error.argument))
            errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except RunFailedError as error:  # a worker died or failed: not bad input
            errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_RUN_FAILED) from None
        except FileExistsError as error:
            errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except Exception as error:
            # Here, not at the top: the planner loads with the commands that plan.
            from piebald.api import Infeasible

            if not isinstance(error, Infeasible):
                raise
            errors.print(
                f"[red]no feasible plan:[/red] {escape(str(error))}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_INFEASIBLE) from None

    return wrapper


def load_checked_plan(path: Path) -> Plan:
    """A plan file as every command reads it (``piebald.api.load_plan``): parsed, validated
    against its embedded cluster and model, and re-priced to check that every rank still
    fits its GPU's memory. A rank that does not fit is bad input (exit 2), like any other
    inconsistency in the file."""
    return load_plan(path)


def job_from(*, global_batch: int, seq_len: int, precision: Dtype) -> JobSpec:
    """The job of ``--global-batch`` and ``--seq-len``; a value over its limit is one line
    naming the flag (before anything is allocated for it)."""
    return build_job(global_batch=global_batch, seq_len=seq_len, precision=precision)


@contextlib.contextmanager
def warning_lines(kind: type[Warning], text: Callable[[Warning], str]) -> Iterator[None]:
    """Each warning of ``kind`` the library issues while inside as one ``warning:``
    line on stderr (``text`` of it), when it is issued, every time: never silently
    ignored, and not Python's warning format. Other warnings are shown as before."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", kind)
        shown = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if not isinstance(message, kind):
                shown(message, category, filename, lineno, file, line)
                return
            errors.print(
                f"[yellow]warning:[/yellow] {escape(' '.join(text(message).split()))}",
                highlight=False,
                soft_wrap=True,
            )

        warnings.showwarning = show
        yield


def profile_warnings(profiles: Path | None) -> contextlib.AbstractContextManager[None]:
    """Each ``ProfileWarning`` (measurements of ``--profiles`` the cluster cannot use,
    priced analytically instead) as one line naming ``--profiles`` (:func:`warning_lines`)."""

    def text(message: Warning) -> str:
        return f"--profiles {profiles}: {getattr(message, 'detail', message)}"

    return warning_lines(ProfileWarning, text)


def model_warnings() -> contextlib.AbstractContextManager[None]:
    """Each ``ModelWarning`` (a model file's dropout, which piebald does not train with) as
    one line (:func:`warning_lines`)."""
    return warning_lines(ModelWarning, str)


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator[Callable[[float, str], None]]:
    """A progress bar that appears only once the work has taken a second (on a terminal)."""
    started = time.perf_counter()
    bar: Progress | None = None
    task = None

    def update(fraction: float, message: str) -> None:
        nonlocal bar, task
        if bar is None and console.is_terminal and time.perf_counter() - started > 1.0:
            bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            bar.start()
            task = bar.add_task(description, total=1.0)
        if bar is not None and task is not None:
            bar.update(task, completed=fraction, description=f"{description}: {message}")

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


def inputs_from(
    cluster: Path, model: str, global_batch: int, seq_len: int, precision: Dtype
) -> tuple[ClusterSpec, ModelSpec, JobSpec]:
    cluster_spec, model_spec = load_cluster(cluster), load_model(model)
    job = job_from(global_batch=global_batch, seq_len=seq_len, precision=precision)
    # Before any work: a model that cannot run these sequences is a --seq-len mistake.
    check_job_fits_model(job, model_spec)
    return cluster_spec, model_spec, job


def run_comparison(
    cluster: ClusterSpec,
    model: ModelSpec,
    job: JobSpec,
    *,
    profiles: Path | None = None,
    workers: int | None = None,
) -> Comparison:
    """Every strategy on the same inputs (``piebald.api.compare``), with a progress bar."""
    from piebald.api import compare  # the planner: loaded by the commands that plan

    with profile_warnings(profiles), progress_bar("comparing") as progress:
        return compare(cluster, model, job, profiles=profiles, progress=progress, workers=workers)


def comparison_title(cluster: ClusterSpec, model: ModelSpec, job: JobSpec) -> str:
    return (
        f"{model.name} on {cluster.name} ({cluster.num_gpus} GPUs), global batch "
        f"{job.global_batch_size} x {job.seq_len} tokens"
    )


ClusterOption = Annotated[Path, typer.Option(help="Cluster YAML file.")]
ModelOption = Annotated[str, typer.Option(help="Preset name or Hugging Face config.json path.")]
BatchOption = Annotated[int, typer.Option(min=1, help="Sequences per optimizer step.")]
SeqOption = Annotated[int, typer.Option(min=1, help="Tokens per sequence.")]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Processes the search of a large cluster may use (the plans are the same); "
        "default: every core.",
    ),
]
PrecisionOption = Annotated[Dtype, typer.Option(help="Requested training precision.")]
