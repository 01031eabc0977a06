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
import ctypes
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from piebald.specs.membership import Membership
from piebald.specs.plan import Plan
from piebald.specs.plan_io import plan_from_dict, plan_to_dict

__all__ = [
    "HANG_MARGIN_S",
    "MAX_EMULATED_GPUS",
    "PROGRESS",
    "STOP_REQUEST",
    "Segment",
    "SegmentRunner",
    "WorkerPlace",
    "WorkersOutcome",
    "emulate",
    "worker_places",
    "worker_process_name",
]

MAX_EMULATED_GPUS = 64  # processes on one machine; beyond this emulation is not useful
_SUMMARY = "summary.json"
_STOPPED = "stopped.json"  # the leader's: the step the run stopped after when asked to
# The leader's: {"step", "time", "loss"} when ready (loss None) and after each step.
PROGRESS = "progress.jsonl"
STOP_REQUEST = "stop"  # a file the parent creates: stop after the current step
_PR_SET_NAME = 15  # prctl(2)
_WHOLE_RUN = timedelta(days=30)
# A run that finishes no step within the collective timeout and this has hung.
HANG_MARGIN_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerPlace:
    """Where an emulated worker stands, as torchrun would tell it (its environment):
    ``group_rank`` is its node's index in the cluster file's order (of the whole cluster,
    under elastic training too), ``local_rank`` its GPU's index on the node."""

    group_rank: int
    local_rank: int


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
    places: tuple[WorkerPlace, ...],
) -> None:
    """One worker: its exit status says how it ended (0, 2 with ``error-RANK.json`` for a
    SpecError, 1 with ``failure-RANK.txt``, the exception's one-line message, for anything
    else), and nothing but the step lines reaches the terminal: the parent reports the
    first failure."""
    die_with_parent(parent_pid, scratch=Path(out_dir).parent)  # the whole run's scratch
    _announce(rank, world_size=world_size, place=places[rank])
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


def worker_process_name(*, group_rank: int, rank: int) -> str:
    """The name an emulated worker gives its process (``/proc/PID/comm``, what ``ps`` and
    ``pkill`` match; at most 15 bytes): ``piebald-n<node>r<rank>``, so a node's workers
    are found as a tool would find a real node's (``pkill -KILL '^piebald-n1r'``)."""
    return f"piebald-n{group_rank}r{rank}"[:15]


def _announce(rank: int, *, world_size: int, place: WorkerPlace) -> None:
    """torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``)
    and the process name of :func:`worker_process_name`."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(place.local_rank),
        WORLD_SIZE=str(world_size),
        GROUP_RANK=str(place.group_rank),
    )
    name = worker_process_name(group_rank=place.group_rank, rank=rank)
    with contextlib.suppress(OSError, AttributeError):  # Linux only; a name is a nicety
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()), 0, 0, 0)


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
    # Idle ranks wait in its barrier from their start to the run's end, which a collective's
    # timeout does not bound; a worker that dies ends them all anyway (``_run_workers``).
    ending = dist.new_group(timeout=_WHOLE_RUN)
    try:
        plan = plan_from_dict(plan_data, source="plan")
        model = emulated_model(plan, max_params=max_params)

        def print_line(line: str) -> None:
            print(line, flush=True, file=sys.stderr if lines_to_stderr else sys.stdout)

        scratch = Path(out_dir)

        def on_progress(step: int, loss: float | None) -> None:
            record = {"step": step, "time": time.time(), "loss": loss}
            with (scratch / PROGRESS).open("a") as progress:
                progress.write(json.dumps(record) + "\n")

        result = run_rank(
            plan,
            config,
            runtime_model=model,
            print_line=print_line,
            on_progress=on_progress,
            stop_requested=(lambda: (scratch / STOP_REQUEST).exists()) if config.elastic else None,
        )
        dist.barrier(group=ending)  # idle ranks stay until the others are done with the world
        if result.summary is not None:
            (scratch / _SUMMARY).write_text(json.dumps(result.summary.as_dict()))
            if result.stopped_after is not None:
                (scratch / _STOPPED).write_text(json.dumps(result.stopped_after))
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersOutcome:
    """How one start of the workers ended: each rank's exit status (negative: the signal
    that ended it), the first rank that failed (None: all exited 0), and the ranks this
    process killed itself once one had failed (their status says nothing of their own)."""

    exitcodes: tuple[int | None, ...]
    first_failed: int | None
    killed: frozenset[int]
    failed_at: float | None = None  # time.time() when the first failure was seen
    hung: bool = False  # the watch said the workers hung: this process killed them all

    def died_of_signal(self) -> tuple[int, ...]:
        """The ranks something else than this process ended by a signal (SIGKILL: the OOM
        killer, a preemption, a lost node)."""
        return tuple(
            rank
            for rank, code in enumerate(self.exitcodes)
            if code is not None and code < 0 and rank not in self.killed
        )


def _run_workers(
    args: tuple[Any, ...],
    *,
    world_size: int,
    grace_s: float = 0.0,
    watch: Callable[[], bool] | None = None,
) -> WorkersOutcome:
    """Start one process per rank and wait: all done, or the first failure (then, after
    ``grace_s`` for the failure's peers to end of their own, the others are killed, before
    they add their own "connection closed" errors). ``watch`` is called about every 0.2 s
    while the workers run; when it says they hung (True), all are killed."""
    context = multiprocessing.get_context("forkserver")
    processes = [
        context.Process(target=_rank_main, args=(rank, *args), name=f"piebald-rank-{rank}")
        for rank in range(world_size)
    ]
    started = []
    failed: int | None = None
    failed_at: float | None = None
    hung = False
    killed: set[int] = set()
    try:
        for process in processes:
            process.start()
            started.append(process)
        running = dict(enumerate(processes))
        deadline: float | None = None
        while running and (deadline is None or time.monotonic() < deadline):
            sentinels = {process.sentinel: rank for rank, process in running.items()}
            timeout = 0.2 if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait(list(sentinels), timeout=timeout)
            for sentinel in ready:
                rank = sentinels[sentinel]  # type: ignore[index]  # the sentinels given
                process = running.pop(rank)
                process.join()
                if process.exitcode != 0 and failed is None:
                    failed, failed_at = rank, time.time()
                    deadline = time.monotonic() + grace_s
            if watch is not None and deadline is None and watch():
                hung = True
                break
    finally:
        for rank, process in enumerate(started):
            if process.is_alive():
                killed.add(rank)
                process.kill()
        for process in started:
            process.join()
    return WorkersOutcome(
        exitcodes=tuple(process.exitcode for process in processes),
        first_failed=failed,
        killed=frozenset(killed),
        failed_at=failed_at,
        hung=hung,
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
        runner = SegmentRunner(
            scratch=scratch, max_params=max_params, lines_to_stderr=lines_to_stderr
        )
        if config.elastic:
            from piebald.runtime.training.elastic import run_elastic

            return run_elastic(plan, config, run_segment=runner, source=source)
        segment = runner(plan, config, places=worker_places(Membership.everyone(plan.cluster)))
        if segment.summary is None:
            runner.raise_failure(
                segment, checkpoint_dir=config.checkpoint_dir, timeout_s=config.timeout_s
            )
        assert segment.summary is not None  # raise_failure raised otherwise
        return segment.summary


def worker_places(membership: Membership) -> tuple[WorkerPlace, ...]:
    """Each rank's place, for the sub-cluster of ``membership``'s live nodes."""
    sub = membership.sub_cluster()
    nodes = membership.live_nodes
    return tuple(
        WorkerPlace(group_rank=nodes[gpu.node_index].index, local_rank=gpu.local_index)
        for gpu in sub.gpus
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One start of the workers under one plan, ended: how (``outcome``), the leader's
    summary when every worker exited 0, the step it stopped after when asked to, and the
    leader's progress records (``PROGRESS``: when ready, then after each step)."""

    outcome: WorkersOutcome
    summary: RunSummary | None
    stopped_after: int | None
    progress: tuple[dict[str, Any], ...]
    scratch: Path


@dataclass(slots=True, kw_only=True)
class SegmentRunner:
    """Starts the workers of one plan, each time in a fresh scratch directory of its own
    (its file store, its error files) under ``scratch``."""

    scratch: Path
    max_params: int
    lines_to_stderr: bool
    started: int = 0
    current: Path | None = None  # the scratch directory of the latest start

    def __call__(
        self,
        plan: Plan,
        config: TrainConfig,
        *,
        places: tuple[WorkerPlace, ...],
        grace_s: float = 0.0,
        watch: Callable[[], None] | None = None,
    ) -> Segment:
        """Run the workers of ``plan`` to their end; ``watch`` is called about every 0.2 s
        meanwhile. Once the workers are ready, a run that finishes no step within the
        collective timeout and ``HANG_MARGIN_S`` has hung (peers that wait on a hung one
        fail at the timeout; this catches the ones nobody waits on): all are killed."""
        self.started += 1
        scratch = self.current = self.scratch / f"start-{self.started}"
        scratch.mkdir()
        world_size = plan.cluster.num_gpus
        args = (
            world_size,
            f"file://{scratch / 'store'}",
            plan_to_dict(plan),
            config,
            self.max_params,
            str(scratch),
            self.lines_to_stderr,
            os.getpid(),
            places,
        )
        progress_file = scratch / PROGRESS
        limit_s = config.timeout_s + HANG_MARGIN_S

        def watched() -> bool:
            if watch is not None:
                watch()
            try:
                last_s = progress_file.stat().st_mtime
            except OSError:
                return False  # not ready yet: starting is bounded by the collective timeout
            return time.time() - last_s > limit_s

        outcome = _run_workers(args, world_size=world_size, grace_s=grace_s, watch=watched)
        summary = stopped = None
        if outcome.first_failed is None and not outcome.hung:
            summary = RunSummary.from_dict(json.loads((scratch / _SUMMARY).read_text()))
            if (scratch / _STOPPED).is_file():
                stopped = int(json.loads((scratch / _STOPPED).read_text()))
        lines = progress_file.read_text().splitlines() if progress_file.is_file() else []
        progress = tuple(json.loads(line) for line in lines if line.endswith("}"))
        return Segment(
            outcome=outcome,
            summary=summary,
            stopped_after=stopped,
            progress=progress,
            scratch=scratch,
        )

    def request_stop(self) -> None:
        """Ask the running workers to stop after their current step (``STOP_REQUEST``)."""
        assert self.current is not None, "no workers were started"
        (self.current / STOP_REQUEST).touch()

    def raise_failure(
        self, segment: Segment, *, checkpoint_dir: Path | None, timeout_s: float
    ) -> None:
        """The failure of ``segment`` as one line (``_raise_failure``)."""
        outcome = segment.outcome
        if outcome.hung:
            raise RunFailedError(
                f"no step finished within {timeout_s + HANG_MARGIN_S:g} s (the collective "
                f"timeout, {timeout_s:g} s, and {HANG_MARGIN_S:g}): the workers hung and were "
                "killed" + _newest_checkpoint(checkpoint_dir)
            )
        assert outcome.first_failed is not None, "the segment did not fail"
        _raise_failure(
            segment.scratch,
            rank=outcome.first_failed,
            exitcode=outcome.exitcodes[outcome.first_failed],
            checkpoint_dir=checkpoint_dir,
        )
