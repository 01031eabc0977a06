"""Emulation: run a plan for a cluster you do not have, one CPU process per GPU of the
plan's cluster (gloo over loopback), each operation paced to the emulated GPU's time.

Processes are forked from a forkserver that imported torch once (importing torch in each of
8 processes costs seconds per process on a 2-core machine). The plan travels as its JSON
dictionary; the leader writes the run's summary to a file the parent reads back. Everything
a user can get wrong (data, checkpoint directory) is checked here, before any process
starts, so a mistake is one line and not eight tracebacks.

Process lifetime: this process holds the checkpoint directory's lock for the whole run
(``checkpoint_lock``) and decides where to resume before any worker starts. It starts and
watches the workers itself (not ``torch.multiprocessing.spawn``, whose teardown logs a
"Terminating process" line per rank before the error that matters): the first worker to
fail ends the run, the others are killed at once, and its one-line error is the only thing
said. Workers die with this process, even when it is SIGKILLed (``parent_watch``); on
SIGTERM and SIGINT it kills them, removes its scratch directory and releases the lock
before exiting (status 128 + the signal's number for SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from piebald.errors import RunFailedError, SpecError, error_fields
from piebald.runtime.distributed.checkpoint import find_latest_checkpoint
from piebald.runtime.parent_watch import die_with_parent, exit_on_sigterm
from piebald.runtime.scratch import run_scratch
from piebald.runtime.training.checkpoint_lock import CheckpointDirLock
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.data_source import load_tokens
from piebald.runtime.training.evaluation import eval_windows
from piebald.runtime.training.metrics import RunSummary
from piebald.runtime.training.plan_support import check_runtime_supports
from piebald.runtime.training.rank_worker import run_rank
from piebald.runtime.training.reduced import emulated_model
from piebald.runtime.training.resume import resolve_resume
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
    parent_pid: int,
) -> None:
    """One worker: its exit status says how it ended (0, 2 with ``error-RANK.json`` for a
    SpecError, 1 with ``failure-RANK.txt``, the exception's one-line message, for anything
    else), and nothing but the step lines reaches the terminal: the parent reports the
    first failure."""
    die_with_parent(parent_pid, scratch=Path(out_dir))
    try:
        _train_rank(
            rank,
            world_size=world_size,
            init_method=init_method,
            plan_data=plan_data,
            config=config,
            max_params=max_params,
            out_dir=out_dir,
            lines_to_stderr=lines_to_stderr,
        )
    except SpecError as error:  # e.g. a corrupt checkpoint: every rank raises the same
        (Path(out_dir) / f"error-{rank}.json").write_text(json.dumps(error_fields(error)))
        os._exit(2)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports
        os._exit(130)
    except BaseException as error:
        (Path(out_dir) / f"failure-{rank}.txt").write_text(_one_line(error))
        os._exit(1)


def _one_line(error: BaseException) -> str:
    """A worker's exception as the one line the user sees: its own message (an OSError's
    already says what failed), the type's name first where the message alone is unclear."""
    message = " ".join(str(error).split())
    if isinstance(error, (OSError, RunFailedError)) and message:
        return message
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _train_rank(
    rank: int,
    *,
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
        model = emulated_model(plan, max_params=max_params)

        def print_line(line: str) -> None:
            print(line, flush=True, file=sys.stderr if lines_to_stderr else sys.stdout)

        result = run_rank(plan, config, runtime_model=model, print_line=print_line)
        dist.barrier()  # idle ranks stay until the others are done with the world group
        if result.summary is not None:
            (Path(out_dir) / _SUMMARY).write_text(json.dumps(result.summary.as_dict()))
    finally:
        dist.destroy_process_group()


def _run_workers(
    args: tuple[Any, ...], *, world_size: int, scratch: Path, checkpoint_dir: Path | None
) -> None:
    """Start one process per rank and wait: all done, or the first failure reported (the
    others are killed first, before they add their own "connection closed" errors)."""
    context = multiprocessing.get_context("forkserver")
    processes = [
        context.Process(target=_rank_main, args=(rank, *args), name=f"piebald-rank-{rank}")
        for rank in range(world_size)
    ]
    started = []
    failed: int | None = None
    try:
        for process in processes:
            process.start()
            started.append(process)
        running = dict(enumerate(processes))
        while running and failed is None:
            sentinels = {process.sentinel: rank for rank, process in running.items()}
            for sentinel in multiprocessing.connection.wait(list(sentinels)):
                rank = sentinels[sentinel]  # type: ignore[index]  # the sentinels given
                process = running.pop(rank)
                process.join()
                if process.exitcode != 0 and failed is None:
                    failed = rank
    finally:
        for process in started:
            if process.is_alive():
                process.kill()
        for process in started:
            process.join()
    if failed is not None:
        _raise_failure(
            scratch,
            rank=failed,
            exitcode=processes[failed].exitcode,
            checkpoint_dir=checkpoint_dir,
        )


def _raise_failure(
    scratch: Path, *, rank: int, exitcode: int | None, checkpoint_dir: Path | None
) -> None:
    """The first failed rank's error, or the one-line error another rank wrote (every rank
    reports a bad checkpoint alike; one that died of its peer's error has none): a
    SpecError for bad input, else a one-line RunFailedError naming the rank and, where the run
    writes checkpoints, the newest one to resume from."""
    own = scratch / f"error-{rank}.json"
    reported = [own] if own.is_file() else sorted(scratch.glob("error-*.json"))
    if reported:
        raise SpecError(**json.loads(reported[0].read_text()))
    failure = scratch / f"failure-{rank}.txt"
    if failure.is_file():
        what = f"emulated rank {rank} failed: {failure.read_text()}"
    elif exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-exitcode}"
        likely = ", likely out of memory" if name == "SIGKILL" else ""
        what = f"emulated rank {rank} was killed by {name}{likely}"
    else:
        what = f"emulated rank {rank} exited with status {exitcode}"
    raise RunFailedError(what + _newest_checkpoint(checkpoint_dir))


def _newest_checkpoint(directory: Path | None) -> str:
    """Where a failed run can resume from, as the end of its error line."""
    if directory is None:
        return ""
    try:
        latest = find_latest_checkpoint(directory)
    except OSError:
        return ""
    if latest is None:
        return f"; {directory} holds no complete checkpoint yet"
    return f"; the newest checkpoint is {latest}"


def emulate(
    plan: Plan,
    config: TrainConfig,
    *,
    max_params: int,
    lines_to_stderr: bool = False,
    source: str = "plan",
) -> RunSummary:
    """Train under ``plan`` on ``plan.cluster.num_gpus`` local CPU processes, each in
    the dtype ``config.compute_dtype`` says (CPU tensors compute bf16 and fp16 too).

    ``config.time_scale`` paces every operation to the emulated GPU's time (wall seconds per
    emulated second); None runs unpaced, as fast as this machine goes (equivalence tests).
    Models above ``max_params`` parameters run at reduced width (``reduced.emulated_model``).
    ``source`` names the plan in a refusal (its file, where it was read from one). A worker
    that fails is a SpecError (bad input) or a one-line RunFailedError.
    """
    try:
        check_runtime_supports(plan)
    except SpecError as error:
        raise error.with_source(source) from None
    world_size = plan.cluster.num_gpus
    if world_size > MAX_EMULATED_GPUS:
        raise SpecError(
            source=source,
            field="cluster",
            value=f"{plan.cluster.name} ({world_size} GPUs)",
            expected=f"at most {MAX_EMULATED_GPUS} GPUs to emulate (one process per GPU)",
        )
    config = replace(config, device="cpu")
    model = emulated_model(plan, max_params=max_params)
    load_tokens(config.data_path, vocab_size=model.arch.vocab_size)  # fail here, once
    if config.eval_data_path is not None:
        eval_tokens = load_tokens(config.eval_data_path, vocab_size=model.arch.vocab_size)
        eval_windows(eval_tokens, seq_len=plan.job.seq_len, source=config.eval_data_path)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    multiprocessing.set_forkserver_preload(["torch", "piebald.runtime.training.rank_worker"])
    with contextlib.ExitStack() as stack:
        if config.checkpoint_dir is not None and not config.checkpoint_dir_claimed:
            stack.enter_context(CheckpointDirLock(config.checkpoint_dir))
            resume_from = resolve_resume(config, plan=plan)
            config = replace(
                config,
                resume=resume_from is not None,
                resume_from=resume_from,
                checkpoint_dir_claimed=True,
            )
        elif config.checkpoint_dir is None:
            resolve_resume(config, plan=plan)  # --resume without a directory: one line
        stack.enter_context(exit_on_sigterm())
        scratch = stack.enter_context(run_scratch("piebald-emulate-"))
        args = (
            world_size,
            f"file://{scratch / 'store'}",
            plan_to_dict(plan),
            config,
            max_params,
            str(scratch),
            lines_to_stderr,
            os.getpid(),
        )
        _run_workers(
            args, world_size=world_size, scratch=scratch, checkpoint_dir=config.checkpoint_dir
        )
        data = json.loads((scratch / _SUMMARY).read_text())
    return RunSummary.from_dict(data)
