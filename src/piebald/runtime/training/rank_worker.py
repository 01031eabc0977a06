"""One rank's training run under a plan, once torch.distributed is initialised (by
``torchrun`` on GPUs, or by the emulator's spawned CPU processes).

Setup, in an order every rank follows so no collective can wait on a rank doing something
else: the plan's process groups (every rank, idle ones too), the rank's stage part under
global parameter names, its flat buckets and sharded optimizer, the checkpoint to resume
from, then the steps. Each step every used rank draws the global batch from (seed, step)
(docs/design.md section 3), runs its schedule (``PipelineExecutor``), and joins two small
all-reduces for the metrics: the loss (a sum of the last stage's shares) and the peak
memory (a max). The leader (the lowest used rank) prints and records them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from piebald.cost.data_parallel import data_parallel_shares
from piebald.cost.memory import plan_rank_memory
from piebald.cost.plan_estimate import model_flops_utilization
from piebald.cost.recorded_curve import recorded_curve
from piebald.errors import SpecError, error_fields
from piebald.runtime.data.batches import batch_for_step
from piebald.runtime.distributed.buckets import build_buckets
from piebald.runtime.distributed.checkpoint import load_checkpoint, save_checkpoint
from piebald.runtime.distributed.collectives import all_reduce, barrier, received_share
from piebald.runtime.distributed.groups import CommGroup, ProcessGroups, build_process_groups
from piebald.runtime.distributed.loss_scaler import DynamicLossScaler
from piebald.runtime.distributed.optimizer import ShardedOptimizer
from piebald.runtime.dtypes import torch_dtype
from piebald.runtime.models.hf_weights import load_hf_weights
from piebald.runtime.models.stage_part import StagePart, build_stage_part
from piebald.runtime.models.tensor_parallel import TensorSplit, split_stage_part
from piebald.runtime.pipeline.executor import PipelineExecutor
from piebald.runtime.pipeline.pacing import Pacer
from piebald.runtime.training.checkpoint_lock import CheckpointDirLock
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.data_source import load_tokens
from piebald.runtime.training.evaluation import EvalWindows, eval_due, eval_windows
from piebald.runtime.training.export import export_part_weights
from piebald.runtime.training.lr_schedule import lr_at
from piebald.runtime.training.memory_meter import MemoryMeter
from piebald.runtime.training.metrics import (
    MetricsWriter,
    RunSummary,
    StepMetrics,
    format_eval,
    format_step,
    summarise,
)
from piebald.runtime.training.precision import ComputeDtype, needs_loss_scaler, rank_dtypes
from piebald.runtime.training.resume import checkpoint_extra, resolve_resume
from piebald.schedule.build import build_schedule
from piebald.schedule.ops import most_in_flight
from piebald.schedule.prices import Prices
from piebald.specs.devices import Dtype
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan, Stage

__all__ = [
    "RankRun",
    "claim_checkpoint_dir",
    "global_named_parameters",
    "run_rank",
]

StepPrinter = Callable[[str], None]
# The emulator's supervisor (``training.emulate``, ``training.elastic``): told on the leader
# once the rank is ready to train (restored: the step it starts from, no loss) and after
# every step (the step, its loss).
ProgressHook = Callable[[int, float | None], None]
# Asked on every used rank at each step boundary: stop there (a checkpoint is saved)?
StopRequest = Callable[[], bool]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankRun:
    """What a rank hands back: the summary on the leader, None elsewhere."""

    rank: int
    summary: RunSummary | None
    # The step the run stopped after when asked to (``stop_requested``), before its end.
    stopped_after: int | None = None


def global_named_parameters(part: StagePart) -> tuple[list[tuple[str, nn.Parameter]], str | None]:
    """The part's parameters under global names, and the tied weight's name if it holds a
    replica of a weight tied across stages (the head's copy is listed under the
    embedding's name, as the buckets expect)."""
    tied = part.tied_parameters()
    rename = {t.local_name: t.canonical_name for t in tied}
    named = [(rename.get(name, name), p) for name, p in part.named_parameters()]
    return named, (tied[0].canonical_name if tied else None)


@contextlib.contextmanager
def claim_checkpoint_dir(
    config: TrainConfig, *, plan: Plan, group: CommGroup, rank: int
) -> Iterator[Path | None]:
    """Hold ``config.checkpoint_dir`` for this run and yield the checkpoint to resume from
    (None: a fresh run); collective over ``group``, the used ranks. Under ``torchrun`` the
    leader takes the lock and decides (``resume.resolve_resume``) and every rank gets its
    verdict, so a refusal is the same one line everywhere and no rank is left waiting;
    the lock is held until the run ends. The emulator's parent has done all this already
    (``config.checkpoint_dir_claimed``)."""
    if config.checkpoint_dir is None or config.checkpoint_dir_claimed:
        yield config.resume_from if config.checkpoint_dir_claimed else None
        return
    lock: CheckpointDirLock | None = None
    verdict: tuple[str, object] = ("ok", None)
    if rank == group.ranks[0]:
        try:
            lock = CheckpointDirLock(config.checkpoint_dir).acquire()
            resolved = resolve_resume(config, plan=plan)
            verdict = ("ok", None if resolved is None else str(resolved))
        except SpecError as error:
            verdict = ("spec", error_fields(error))
        except FileExistsError as error:
            verdict = ("exists", str(error))
        except Exception as error:  # told to every rank, so none waits for the leader
            verdict = ("error", f"{type(error).__name__}: {error}")
    if group.size > 1:
        shared: list[object] = [verdict]
        dist.broadcast_object_list(shared, src=group.ranks[0], group=group.process_group)
        verdict = shared[0]  # type: ignore[assignment]  # what the leader put there
    kind, value = verdict
    try:
        if kind == "spec":
            raise SpecError(**value)  # type: ignore[arg-type]  # error_fields' keywords
        if kind == "exists":
            raise FileExistsError(value)
        if kind == "error":
            raise RuntimeError(f"checkpoint directory {config.checkpoint_dir}: {value}")
        yield None if value is None else Path(str(value))
    finally:
        if lock is not None:
            lock.release()


def run_rank(
    plan: Plan,
    config: TrainConfig,
    *,
    runtime_model: ModelSpec | None = None,
    print_line: StepPrinter | None = None,
    on_progress: ProgressHook | None = None,
    stop_requested: StopRequest | None = None,
) -> RankRun:
    """Train under ``plan`` on this rank. ``runtime_model`` is the model the processes
    build (``plan.model`` unless emulating at reduced width); the plan's own model prices
    the emulated times and the MFU.

    ``on_progress(step, loss)`` is called on the leader once the rank is restored and
    ready (the step it starts from, loss None) and after every step. ``stop_requested()``
    is asked on every used rank after every step: when any rank says yes, all stop after
    that step, with a checkpoint of it when the run has a directory
    (``RankRun.stopped_after``)."""
    rank = dist.get_rank()
    print_line = print_line or (lambda line: print(line, flush=True))
    model = runtime_model or plan.model
    runtime_plan = replace(plan, model=model) if model is not plan.model else plan
    groups = build_process_groups(runtime_plan, timeout_s=config.timeout_s)
    stage_index = groups.stage_index
    if stage_index is None:  # idle under this plan: nothing to hold, nothing to run
        return RankRun(rank=rank, summary=None)
    device = _device(config)
    # Counting starts before anything is built, so every tensor of the run is seen.
    meter = MemoryMeter(device, enabled=config.measure_memory)
    # Before any work: the directory is this run's, and where it resumes from is decided.
    claim = claim_checkpoint_dir(config, plan=plan, group=groups.used, rank=rank)
    with claim as resume_from, meter:
        stage = plan.stages[stage_index]
        dtypes = rank_dtypes(plan, compute=config.compute_dtype)
        part = build_stage_part(
            model,
            layer_start=stage.layer_start,
            layer_end=stage.layer_end,
            seed=config.seed,
            device=device,
        )  # in fp32: the buckets keep fp32 masters and cast the parameters to the compute dtype
        if config.init_from is not None:  # before the buckets copy the parameters
            load_hf_weights(part, config.init_from)
        part.recompute = stage.recompute
        # Whole first (the reference's weights), then this member's slices.
        split = _split(part, stage=stage, rank=rank, groups=groups)
        named, tied_name = global_named_parameters(part)
        buckets = build_buckets(
            groups,
            named_params=named,
            tied_name=tied_name,
            split_names=frozenset(split.params),
            dtypes=dtypes,
        )
        scaler = DynamicLossScaler() if needs_loss_scaler(dtypes) else None
        optimizer = ShardedOptimizer(
            buckets, config=config.optimizer, used_group=groups.used, loss_scaler=scaler
        )
        # A plan made from profiles is paced with the prices it was made with.
        prices = Prices(plan, curve=recorded_curve(plan))
        pacer = (
            Pacer(plan=plan, rank=rank, prices=prices, time_scale=config.time_scale)
            if config.time_scale is not None
            else None
        )
        # A tensor group's members run their leader's operations (pipeline.executor).
        ops = build_schedule(plan, prices=prices).rank_ops[stage.leader_of(rank)]
        executor = PipelineExecutor(
            plan=runtime_plan,
            rank=rank,
            ops=ops,
            part=part,
            optimizer=optimizer,
            device=device,
            wire_dtypes={r: torch_dtype(d) for r, d in dtypes.items()},
            pacer=pacer,
            one_tag=config.one_tag,
            tensor_group=groups.tensor,
        )
        tokens = load_tokens(config.data_path, vocab_size=model.arch.vocab_size)
        windows = _eval_windows(config, model=model, seq_len=plan.job.seq_len)

        first_step = 0
        run_id: str | None = None  # a fresh run's writer draws one; its checkpoints keep it
        if resume_from is not None:
            info = load_checkpoint(
                resume_from,
                optimizer=optimizer,
                group=groups.used,
                rank=rank,
                slices=split.slices,
            )
            first_step, run_id = info.step, info.run_id
        leader = rank == groups.used.ranks[0]
        writer = MetricsWriter(
            config.metrics_path if leader else None,
            tensorboard_dir=config.tensorboard_dir if leader else None,
            first_step=first_step,
            run_id=run_id,
        )
        history: list[StepMetrics] = []
        measured_peak = 0
        time_scale = config.time_scale or 1.0
        barrier(groups.used)
        if leader and on_progress is not None:
            on_progress(first_step, None)
        stopped_after: int | None = None
        started = time.perf_counter()
        for step in range(first_step, config.steps):
            with meter.host_side():
                inputs, labels = batch_for_step(
                    tokens,
                    seed=config.seed,
                    step=step,
                    global_batch_size=plan.job.global_batch_size,
                    seq_len=plan.job.seq_len,
                )
            meter.start_step()
            # The same float as the reference's: a pure function of the step (resume too).
            lr = lr_at(step, lr=config.optimizer.lr, schedule=config.lr_schedule)
            outcome = executor.run_step(inputs=inputs, labels=labels, lr=lr)
            step_peak = meter.peak_bytes()
            measured_peak = max(measured_peak, step_peak)
            # On the rank's device: NCCL reduces GPU tensors only.
            stop = stop_requested is not None and stop_requested()
            reduced = torch.tensor(
                [outcome.loss_sum, outcome.clamped_values, float(stop)],
                dtype=torch.float64,
                device=device,
            )
            memory = torch.tensor([step_peak], dtype=torch.float64, device=device)
            all_reduce(reduced, group=groups.used)
            all_reduce(memory, group=groups.used, op=dist.ReduceOp.MAX)
            now = time.perf_counter()
            step_s = (now - started) / time_scale
            started = now
            tokens_per_s = plan.job.tokens_per_step / step_s
            metrics = StepMetrics(
                step=step + 1,
                loss=float(reduced[0].item()),
                grad_norm=outcome.optimizer.grad_norm,
                lr=lr,
                step_time_s=step_s,
                tokens_per_s=tokens_per_s,
                mfu=model_flops_utilization(plan, tokens_per_s=tokens_per_s),
                peak_memory_bytes=float(memory.item()),
                skipped=outcome.optimizer.skipped,
                clamped_values=int(reduced[1].item()),
            )
            if windows is not None and eval_due(
                step=step + 1, every=config.eval_every, steps=config.steps
            ):
                eval_loss = _evaluate(
                    executor,
                    windows,
                    rows=plan.job.global_batch_size,
                    group=groups.used,
                    device=device,
                )
                metrics = replace(metrics, eval_loss=eval_loss)
                started = time.perf_counter()  # evaluating is not part of the next step
            history.append(metrics)
            if leader:
                print_line(format_step(metrics))
                if metrics.eval_loss is not None:
                    print_line(format_eval(metrics))
                writer.write(metrics)
            every = config.checkpoint_every
            at_end = step + 1 == config.steps
            stopping = reduced[2].item() > 0 and not at_end  # every used rank agrees
            if config.checkpoint_dir is not None and (
                at_end or stopping or (every and (step + 1) % every == 0)
            ):
                save_checkpoint(
                    config.checkpoint_dir,
                    step=step + 1,
                    optimizer=optimizer,
                    group=groups.used,
                    rank=rank,
                    extra=checkpoint_extra(config, plan=plan),
                    slices=split.slices,
                    run_id=writer.run_id,  # the leader's: it writes the manifest
                )
                started = time.perf_counter()  # the save is not part of the next step's time
            if leader and on_progress is not None:
                on_progress(step + 1, metrics.loss)
            if stopping:
                stopped_after = step + 1
                break
        writer.close()
        if config.save_model_path is not None and stopped_after is None:
            export_part_weights(
                config.save_model_path,
                part=part,
                optimizer=optimizer,
                groups=groups,
                rank=rank,
                source=config.init_from,
                split=split,
            )
        report = pacer.report() if pacer is not None else None
        counts = torch.tensor(
            [report.overruns, report.operations] if report is not None else [0, 0],
            dtype=torch.int64,
            device=device,
        )
        all_reduce(counts, group=groups.used)
        memory_report = _memory_report(
            plan,
            rank=rank,
            measured_bytes=measured_peak if meter.enabled else None,
            runtime_model=model,
            config=config,
            group=groups.used,
            device=device,
            num_in_flight=most_in_flight(ops),
        )
        if not leader:
            return RankRun(rank=rank, summary=None, stopped_after=stopped_after)
        predicted = plan.predicted.tokens_per_s if plan.predicted is not None else None
        summary = summarise(
            history,
            steps=config.steps,
            predicted_tokens_per_s=predicted,
            emulated=config.time_scale is not None,
            model_name=model.name,
            overruns=int(counts[0].item()),
            paced_operations=int(counts[1].item()),
            compute_dtype=config.compute_dtype.value,
            memory=memory_report,
        )
        if not history:
            summary = replace(summary, first_step=first_step)
        return RankRun(rank=rank, summary=summary, stopped_after=stopped_after)


def _split(part: StagePart, *, stage: Stage, rank: int, groups: ProcessGroups) -> TensorSplit:
    """Keep this rank's tensor-parallel slices of ``part`` (nothing at degree 1)."""
    degree = stage.tensor_parallel_degree
    tensor = groups.tensor
    ranks = tensor.ranks if tensor is not None else (rank,)
    return split_stage_part(
        part,
        degree=degree,
        position=stage.ranks.index(rank) % degree,
        positions=tuple(stage.ranks.index(r) % degree for r in ranks),
        group=tensor.process_group if tensor is not None else None,
        layout=stage.tensor_layout,
    )


def _eval_windows(config: TrainConfig, *, model: ModelSpec, seq_len: int) -> EvalWindows | None:
    if config.eval_data_path is None:
        return None
    tokens = load_tokens(config.eval_data_path, vocab_size=model.arch.vocab_size)
    return eval_windows(tokens, seq_len=seq_len, source=config.eval_data_path)


def _evaluate(
    executor: PipelineExecutor,
    windows: EvalWindows,
    *,
    rows: int,
    group: CommGroup,
    device: torch.device,
) -> float:
    """The evaluation loss (collective over the used ranks): every rank pushes the same
    chunks of the global batch's size through its forward passes; the last stage's sums
    are added up over the group."""
    total = torch.zeros(1, dtype=torch.float64, device=device)
    for inputs, labels in windows.chunks(rows=rows):
        total += executor.evaluate(inputs=inputs, labels=labels)
    all_reduce(total, group=group)
    return float(total.item()) / windows.num_labels


def predicted_tensor_bytes(
    plan: Plan,
    *,
    rank: int,
    runtime_model: ModelSpec,
    compute_dtype: ComputeDtype,
    num_in_flight: int,
) -> float:
    """The memory model's peak for ``rank`` without the framework reserve (tensors
    only, what the meter measures), for the model and dtypes this run really trains, the
    micro-batches its schedule really holds at once (``ops.most_in_flight``: at most the
    budget the plan's estimate prices, often fewer under 1F1B) and this backend's
    collectives: ``MemoryBreakdown.peak_bytes``, of which the plan's memory figure
    (``total_bytes`` at the budget) is an upper bound, except for the per-layer
    reduce-scatter of an uneven ZeRO-2/3 group on NCCL, which plans price at even shares."""
    priced = replace(plan, model=runtime_model)
    if compute_dtype is ComputeDtype.FP32:
        priced = replace(priced, job=replace(plan.job, precision=Dtype.FP32))
    stage_index = plan.stage_of_rank[rank]
    stage = plan.stages[stage_index]
    # The per-layer reduce-scatter runs over the rank's data-parallel group (the whole
    # stage at tensor-parallel degree 1), in which it owns t x its plan fraction.
    shares = data_parallel_shares(stage, rank)
    index = stage.data_parallel_group(rank).index(rank)
    memory = plan_rank_memory(
        priced,
        stage_index=stage_index,
        position=stage.ranks.index(rank),
        num_in_flight=num_in_flight,
        curve=recorded_curve(plan),
        receive_share=received_share(shares, index=index, backend=dist.get_backend()),
    )
    return memory.peak_bytes - memory.reserve_bytes


def _memory_report(
    plan: Plan,
    *,
    rank: int,
    measured_bytes: int | None,
    runtime_model: ModelSpec,
    config: TrainConfig,
    group: CommGroup,
    device: torch.device,
    num_in_flight: int,
) -> dict[str, dict[str, int]]:
    """Every used rank's measured peak and predicted tensor bytes (collective over the
    used ranks; empty, on every rank alike, when memory is not measured)."""
    if measured_bytes is None:
        return {}
    size = plan.cluster.num_gpus
    both = torch.zeros(2 * size, dtype=torch.float64, device=device)
    both[rank] = float(measured_bytes)
    both[size + rank] = predicted_tensor_bytes(
        plan,
        rank=rank,
        runtime_model=runtime_model,
        compute_dtype=config.compute_dtype,
        num_in_flight=num_in_flight,
    )
    all_reduce(both, group=group)
    return {
        str(r): {
            "measured_bytes": int(both[r].item()),
            "predicted_bytes": int(both[size + r].item()),
        }
        for r in group.ranks
    }


def _device(config: TrainConfig) -> torch.device:
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: CUDA is not available in this process")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
