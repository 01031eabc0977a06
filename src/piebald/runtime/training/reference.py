"""Single-process training: the reference every plan must reproduce (docs/design.md section 3).

The whole model in one process, the same initialisation (per layer, from the seed), the
same batches (from (seed, step)), the same loss (token cross-entropies summed and divided
by the tokens of the global batch), torch's AdamW (or SGD) with the same parameter groups
(weight decay on matrices only) and the same learning rate each step (``lr_schedule``), and
``clip_grad_norm_``. ``micro_batch_size`` splits the batch for memory only: gradients
accumulate, so the result does not depend on it beyond float rounding.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from piebald.errors import SpecError
from piebald.runtime.data.batches import batch_for_step
from piebald.runtime.distributed.optimizer import build_reference_optimizer
from piebald.runtime.models.hf_weights import load_hf_weights
from piebald.runtime.models.loss import token_loss_sum
from piebald.runtime.models.stage_part import StagePart, build_stage_part
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.data_source import load_tokens
from piebald.runtime.training.evaluation import EvalWindows, eval_due, eval_windows
from piebald.runtime.training.export import part_weights, save_hf_model
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
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec

__all__ = ["train_reference"]


def train_reference(
    model: ModelSpec,
    job: JobSpec,
    config: TrainConfig,
    *,
    micro_batch_size: int | None = None,
    print_line: Callable[[str], None] | None = None,
) -> RunSummary:
    """Train ``model`` for ``config.steps`` steps in this process; returns the summary."""
    print_line = print_line or (lambda line: print(line, flush=True))
    if config.checkpoint_dir is not None or config.resume or config.time_scale is not None:
        raise ValueError(
            "single-process reference training takes no checkpoints, --resume or emulation; "
            "give a --plan for those"
        )
    device = torch.device(config.device if config.device == "cpu" else "cuda")
    rows = micro_batch_size or job.global_batch_size
    if not 1 <= rows <= job.global_batch_size:
        # A flag the user gave (train --micro-batch-size): one line, exit 2.
        raise SpecError(
            source="--micro-batch-size",
            field="",
            value=rows,
            expected=f"1..{job.global_batch_size} (at most the global batch)",
        )
    meter = MemoryMeter(device, enabled=config.measure_memory)
    with meter:
        model_part = build_stage_part(
            model, layer_start=0, layer_end=model.num_layers, seed=config.seed, device=device
        )
        if config.init_from is not None:
            load_hf_weights(model_part, config.init_from)
        named = list(model_part.named_parameters())
        optimizer = build_reference_optimizer(named, config.optimizer)
        params = [p for _, p in named]
        tokens = load_tokens(config.data_path, vocab_size=model.arch.vocab_size)
        windows = None
        if config.eval_data_path is not None:
            windows = eval_windows(
                load_tokens(config.eval_data_path, vocab_size=model.arch.vocab_size),
                seq_len=job.seq_len,
                source=config.eval_data_path,
            )
        tokens_in_batch = job.global_batch_size * job.seq_len
        writer = MetricsWriter(config.metrics_path, tensorboard_dir=config.tensorboard_dir)
        history: list[StepMetrics] = []
        for step in range(config.steps):
            started = time.perf_counter()
            meter.start_step()
            inputs, labels = batch_for_step(
                tokens,
                seed=config.seed,
                step=step,
                global_batch_size=job.global_batch_size,
                seq_len=job.seq_len,
            )
            loss_sum = 0.0
            for start in range(0, job.global_batch_size, rows):
                logits = model_part(inputs[start : start + rows].to(device))
                loss = token_loss_sum(logits, labels[start : start + rows].to(device))
                loss = loss / tokens_in_batch
                torch.autograd.backward(loss)
                loss_sum += float(loss.item())
            max_norm = config.optimizer.max_grad_norm
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else math.inf)
            lr = lr_at(step, lr=config.optimizer.lr, schedule=config.lr_schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_s = time.perf_counter() - started
            metrics = StepMetrics(
                step=step + 1,
                loss=loss_sum,
                grad_norm=float(norm),
                lr=lr,
                step_time_s=step_s,
                tokens_per_s=tokens_in_batch / step_s,
                mfu=0.0,  # no GPU peak to compare with: the reference runs on any device
                peak_memory_bytes=meter.peak_bytes(),
                skipped=False,
            )
            if windows is not None and eval_due(
                step=step + 1, every=config.eval_every, steps=config.steps
            ):
                metrics = replace(metrics, eval_loss=_evaluate(model_part, windows, rows=rows))
            history.append(metrics)
            print_line(format_step(metrics))
            if metrics.eval_loss is not None:
                print_line(format_eval(metrics))
            writer.write(metrics)
        writer.close()
    if config.save_model_path is not None:
        save_hf_model(
            part_weights(model_part),
            model=model,
            directory=config.save_model_path,
            source=config.init_from,
        )
    return summarise(
        history,
        steps=config.steps,
        predicted_tokens_per_s=None,
        emulated=False,
        model_name=model.name,
    )


def _evaluate(model_part: StagePart, windows: EvalWindows, *, rows: int) -> float:
    """The evaluation loss (``evaluation``), ``rows`` windows per forward."""
    device = next(model_part.parameters()).device
    total = 0.0
    with torch.no_grad():
        for inputs, labels in windows.chunks(rows=rows):
            logits = model_part(inputs.to(device))
            total += float(token_loss_sum(logits, labels.to(device)).item())
    return total / windows.num_labels
