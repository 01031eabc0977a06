"""``piebald launch``: the torchrun command of every node of a plan's cluster, or a script."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import Annotated

import typer

from piebald.cli.common import console, load_checked_plan, user_errors
from piebald.errors import SpecError
from piebald.launch import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_PORT,
    MAX_PORT,
    ElasticLaunch,
    node_launches,
    shell_script,
    slurm_script,
)
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
    elastic: Annotated[
        str | None,
        typer.Option(
            metavar="MIN",
            help="Elastic: torchrun's elastic agents on every node and `piebald train "
            "--elastic`; a lost node does not end the run while MIN nodes are live (they "
            "re-plan and resume from the newest checkpoint), and a node started again "
            "rejoins.",
        ),
    ] = None,
    max_restarts: Annotated[
        int | None,
        typer.Option(
            help="With --elastic: the failures (a lost node is one) the job survives "
            f"(default {DEFAULT_MAX_RESTARTS})."
        ),
    ] = None,
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
    elastic_launch = None
    if max_restarts is not None and (elastic is None or max_restarts < 0):
        raise SpecError(
            source="--max-restarts",
            field="",
            value=max_restarts,
            expected="a whole number >= 0, with --elastic",
        )
    if elastic is not None:
        elastic_launch = ElasticLaunch(
            min_nodes=_min_nodes(elastic, count=len(loaded.cluster.nodes)),
            # The same on every node of this job: the plan file's content.
            run_id=f"piebald-{hashlib.sha256(plan.read_bytes()).hexdigest()[:12]}",
            max_restarts=DEFAULT_MAX_RESTARTS if max_restarts is None else max_restarts,
        )
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
            elastic=elastic_launch,
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


def _min_nodes(value: str, *, count: int) -> int:
    """--elastic MIN: a whole number of nodes, 1..count."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= count:
        raise SpecError(
            source="--elastic",
            field="",
            value=value,
            expected=f"the fewest live nodes the run goes on with: a whole number, 1..{count} "
            "(the plan's cluster's nodes)",
        )
    return number
