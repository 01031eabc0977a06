"""Emulation: run a plan for a cluster you do not have, one CPU process per GPU of the
plan's cluster (gloo over loopback), each operation paced to the emulated GPU's time.

Processes are forked from a forkserver that imported torch once (importing torch in each of
8 processes costs seconds per process on a 2-core machine). The plan travels as its JSON
dictionary; the leader writes the run's summary to a file the parent reads back. Everything
a user can get wrong (data, checkpoint directory) is checked here, before any process
starts, so a mistake is one line and not eight tracebacks.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessExitedException, start_processes

from piebald.errors import SpecError, error_fields
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.data_source import load_tokens
from piebald.runtime.training.evaluation import eval_windows
from piebald.runtime.training.metrics import RunSummary
from piebald.runtime.training.rank_worker import checkpoint_to_resume, run_rank
from piebald.runtime.training.reduced import reduced_width_model
from piebald.specs.plan import Plan
from piebald.specs.plan_io import plan_from_dict, plan_to_dict

__all__ = ["MAX_EMULATED_GPUS", "emulate"]

MAX_EMULATED_GPUS = 64  # processes on one machine; beyond this emulation is not useful
_SUMMARY = "summary.json"


def _rank_main(
    rank: int,
    world_size: int,
    init_method: str,
    plan_data: dict[str, Any],
    config: TrainConfig,
    max_params: int,
    out_dir: str,
    lines_to_stderr: bool,
) -> None:
    torch.set_num_threads(1)  # N processes share this machine's cores
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=config.timeout_s),
    )
    try:
        plan = plan_from_dict(plan_data, source="plan")
        model = reduced_width_model(plan.model, max_params=max_params)

        def print_line(line: str) -> None:
            print(line, flush=True, file=sys.stderr if lines_to_stderr else sys.stdout)

        try:
            result = run_rank(plan, config, runtime_model=model, print_line=print_line)
        except SpecError as error:  # e.g. a corrupt checkpoint: every rank raises the same
            (Path(out_dir) / f"error-{rank}.json").write_text(json.dumps(error_fields(error)))
            raise SystemExit(2) from None
        dist.barrier()  # idle ranks stay until the others are done with the world group
        if result.summary is not None:
            (Path(out_dir) / _SUMMARY).write_text(json.dumps(result.summary.as_dict()))
    finally:
        dist.destroy_process_group()


def _start(args: tuple[Any, ...], world_size: int) -> None:
    start_processes(  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        _rank_main, args=args, nprocs=world_size, start_method="forkserver", join=True
    )


def emulate(
    plan: Plan,
    config: TrainConfig,
    *,
    max_params: int,
    lines_to_stderr: bool = False,
) -> RunSummary:
    """Train under ``plan`` on ``plan.cluster.num_gpus`` local CPU processes, each in
    the dtype ``config.compute_dtype`` says (CPU tensors compute bf16 and fp16 too).

    ``config.time_scale`` paces every operation to the emulated GPU's time (wall seconds per
    emulated second); None runs unpaced, as fast as this machine goes (equivalence tests).
    Models above ``max_params`` parameters run at reduced width (``reduced_width_model``).
    """
    world_size = plan.cluster.num_gpus
    if world_size > MAX_EMULATED_GPUS:
        raise SpecError(
            source="plan",
            field="cluster",
            value=f"{plan.cluster.name} ({world_size} GPUs)",
            expected=f"at most {MAX_EMULATED_GPUS} GPUs to emulate (one process per GPU)",
        )
    config = replace(config, device="cpu")
    model = reduced_width_model(plan.model, max_params=max_params)
    load_tokens(config.data_path, vocab_size=model.arch.vocab_size)  # fail here, once
    if config.eval_data_path is not None:
        eval_tokens = load_tokens(config.eval_data_path, vocab_size=model.arch.vocab_size)
        eval_windows(eval_tokens, seq_len=plan.job.seq_len, source=config.eval_data_path)
    checkpoint_to_resume(config)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    multiprocessing.set_forkserver_preload(["torch", "piebald.runtime.training.rank_worker"])
    with tempfile.TemporaryDirectory(prefix="piebald-emulate-") as scratch:
        init_method = f"file://{Path(scratch) / 'store'}"
        try:
            args = (
                world_size,
                init_method,
                plan_to_dict(plan),
                config,
                max_params,
                scratch,
                lines_to_stderr,
            )
            _start(args, world_size)
        except ProcessExitedException:
            reported = sorted(Path(scratch).glob("error-*.json"))
            if not reported:
                raise
            raise SpecError(**json.loads(reported[0].read_text())) from None
        data = json.loads((Path(scratch) / _SUMMARY).read_text())
    return RunSummary.from_dict(data)
