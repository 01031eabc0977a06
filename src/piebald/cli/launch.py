"""``piebald launch``: the torchrun command of every node of a plan's cluster, or a script."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from piebald.cli.common import console, load_checked_plan, user_errors
from piebald.errors import SpecError
from piebald.launch import DEFAULT_PORT, MAX_PORT, node_launches, shell_script, slurm_script
from piebald.outputs import check_output_file, write_atomic

__all__ = ["launch"]


@user_errors
def launch(
    plan: Annotated[Path, typer.Option(help="The plan JSON file to train under.")],
    slurm: Annotated[bool, typer.Option(help="Write an sbatch script instead.")] = False,
    out: Annotated[Path | None, typer.Option(help="Write the script here.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
    hosts: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated host of each node, in the cluster file's order "
            "(default: the cluster file's hosts)."
        ),
    ] = None,
    gpus: Annotated[
        bool,
        typer.Option(
            "--gpus/--no-gpus",
            help="With --slurm: request each node's GPUs (--no-gpus: a CPU-only cluster).",
        ),
    ] = True,
    master_port: Annotated[int, typer.Option(help="Rendezvous port.")] = DEFAULT_PORT,
    train_args: Annotated[
        str,
        typer.Option(
            help="Arguments passed on to `piebald train`, shell-quoted, e.g. '--steps 100'."
        ),
    ] = "",
) -> None:
    """Print (or write) the torchrun command of every node of the plan's cluster."""
    if out is not None:
        check_output_file(out, flag="--out", force=force)
    if not 1 <= master_port <= MAX_PORT:
        raise SpecError(
            source="--master-port",
            field="",
            value=master_port,
            expected=f"a TCP port, 1..{MAX_PORT}",
        )
    # An empty --hosts ('') is a mistake too, not "no hosts given".
    host_list = [h.strip() for h in hosts.split(",")] if hosts is not None else None
    loaded = load_checked_plan(plan)
    try:
        train_words = shlex.split(train_args)
    except ValueError as error:  # an unclosed quote
        raise SpecError(
            source="--train-args", field="", value=train_args, expected=f"shell words ({error})"
        ) from None
    try:
        launches = node_launches(
            loaded.cluster,
            plan_path=str(plan),
            hosts=host_list,
            master_port=master_port,
            train_args=train_words,
        )
        if slurm:
            text = slurm_script(launches, plan_name=plan.name, request_gpus=gpus)
        elif out is not None:
            text = shell_script(launches, plan_name=plan.name, workdir=str(Path.cwd()))
        else:
            text = None
    except ValueError as error:  # the hosts: how many, or one named twice
        raise SpecError(source="--hosts", field="", value=hosts, expected=str(error)) from None
    if text is None:
        for item in launches:
            console.print(
                f"# node {item.node_rank} ({item.node_name}, {item.num_gpus} GPUs, "
                f"{item.ranks}) on {item.host}",
                highlight=False,
            )
            print(item.shell_line())
        return
    if out is None:
        print(text, end="")
        return
    write_atomic(out, text, flag="--out", force=force, executable=True)
    console.print(f"launch script written to {out}")
