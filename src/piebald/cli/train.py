"""``piebald train``: train under a plan (under ``torchrun``, one process per GPU), emulate the
plan's cluster on local CPU processes (``--emulate``), or, without a plan, train in one
process as the reference every plan must reproduce.

Every flag can also come from a TOML job file, ``--config job.toml`` (``cli.job_file``); the
flags given on the command line win.

torch is imported inside the command, never at import time: ``piebald --help`` and the
planning commands stay fast on machines without it.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from piebald.cli.common import console, errors, job_from, load_checked_plan, user_errors
from piebald.cli.job_file import ConfigOption
from piebald.errors import ArgumentError, SpecError
from piebald.specs.devices import Dtype
from piebald.specs.job import check_seq_len

if TYPE_CHECKING:
    from piebald.api import LrSchedule, RunSummary, TrainConfig

__all__ = ["train"]


def _fail(field: str, value: object, expected: str) -> SpecError:
    return SpecError(source="piebald train", field=field, value=value, expected=expected)


# The flag of each TrainConfig field (``piebald.api.training.check_config`` and TrainConfig
# name the field; the command line names its flag).
FLAG_OF_FIELD = {
    "steps": "--steps",
    "seed": "--seed",
    "data_path": "--data",
    "metrics_path": "--metrics",
    "tensorboard_dir": "--tensorboard",
    "checkpoint_dir": "--checkpoint-dir",
    "checkpoint_every": "--checkpoint-every",
    "resume": "--resume",
    "resume_from": "--resume-from",
    "save_model_path": "--save-model",
    "init_from": "--init-from",
    "eval_data_path": "--eval-data",
    "eval_every": "--eval-every",
    "time_scale": "--time-scale",
    "timeout_s": "--collective-timeout",
    "elastic": "--elastic",
    "node": "--node-name",
    "membership_path": "--membership",
    "fallback_dir": "--fallbacks",
    "optimizer.lr": "--lr",
    "optimizer.weight_decay": "--weight-decay",
    "optimizer.max_grad_norm": "--max-grad-norm",
    "lr_schedule.min_lr": "--min-lr",
    "name_or_path": "--model",  # piebald.api.load_model's argument
}


@contextlib.contextmanager
def _as_flags() -> Iterator[None]:
    """A TrainConfig field's ArgumentError, reported under its flag."""
    try:
        yield
    except ArgumentError as error:
        raise error.with_source(FLAG_OF_FIELD.get(error.argument, error.argument)) from None


def _check_finite(**flags: float) -> None:
    """Float flags are finite: click's FloatRange lets inf through (``--lr inf`` would train
    to non-finite weights). Keyword: the flag's parameter name."""
    for name, value in flags.items():
        if not math.isfinite(value):
            raise _fail("--" + name.replace("_", "-"), value, "a finite number")


def _print_summary(summary: RunSummary, *, as_json: bool, saved_to: Path | None) -> None:
    if as_json:
        payload = {
            "steps": summary.steps,
            "losses": list(summary.losses),
            "tokens_per_s": summary.tokens_per_s,
            "predicted_tokens_per_s": summary.predicted_tokens_per_s,
            "emulated": summary.emulated,
            "model": summary.model_name,
            "overruns": summary.overruns,
            "compute_dtype": summary.compute_dtype,
            "skipped_steps": summary.skipped_steps,
            "clamped_values": summary.clamped_values,
            "paced_operations": summary.paced_operations,
            "memory": summary.memory,
            "membership_events": list(summary.membership_events),
            "eval_steps": list(summary.eval_steps),
            "eval_losses": list(summary.eval_losses),
        }
        print(json.dumps(payload))
        return
    line = f"trained {summary.model_name}: {summary.tokens_per_s:,.0f} tokens/s (median)"
    if summary.predicted_tokens_per_s is not None:
        ratio = summary.tokens_per_s / summary.predicted_tokens_per_s
        line += f", planner predicted {summary.predicted_tokens_per_s:,.0f} ({ratio:.2f}x)"
    console.print(line, highlight=False)
    if summary.skipped_steps or summary.clamped_values:
        console.print(
            f"precision ({summary.compute_dtype}): {summary.skipped_steps} steps skipped on "
            f"fp16 overflow, {summary.clamped_values:,} activation values clamped to fp16's "
            "range",
            highlight=False,
        )
    if summary.emulated and summary.paced_operations:
        share = summary.overruns / summary.paced_operations
        console.print(
            f"emulation: {summary.overruns} of {summary.paced_operations} operations "
            f"({share:.0%}) took longer here than on the emulated GPU"
            + ("; raise --time-scale for an emulated timing" if share > 0.05 else ""),
            highlight=False,
        )
    if saved_to is not None:
        console.print(
            f"model written to {saved_to}: a Hugging Face directory (config.json, safetensors)",
            highlight=False,
        )


_OPTIMIZER = "Optimizer and learning rate"
_ELASTIC = "Elastic training and failures"


@user_errors  # its own imports need torch
def train(
    job_file: ConfigOption = None,
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="Plan JSON (from `piebald plan --out`).")
    ] = None,
    emulate: Annotated[
        bool, typer.Option(help="Run the plan's cluster as local CPU processes (gloo).")
    ] = False,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda (default: cuda under torchrun if present).")
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Train up to this step.")] = 10,
    seed: Annotated[int, typer.Option(min=0, help="Initialisation and data seed.")] = 0,
    data: Annotated[
        Path | None, typer.Option(help="Token file (.bin + .json); default: built-in corpus.")
    ] = None,
    metrics: Annotated[
        Path | None, typer.Option(help="Append one JSON object per step here.")
    ] = None,
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            help="Also write the step metrics as TensorBoard scalars into this directory "
            "(needs the tensorboard extra)."
        ),
    ] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Save checkpoints here.")] = None,
    save_model: Annotated[
        Path | None,
        typer.Option(
            help="Write the trained model here: a new Hugging Face directory (config.json, "
            "safetensors) that transformers and vLLM load."
        ),
    ] = None,
    init_from: Annotated[
        Path | None,
        typer.Option(
            help="Start from the weights of this Hugging Face directory (*.safetensors); "
            "each rank reads only its own layers."
        ),
    ] = None,
    eval_data: Annotated[
        Path | None,
        typer.Option(
            help="Token file for the evaluation loss: mean token loss over its consecutive "
            "windows of seq-len + 1 tokens."
        ),
    ] = None,
    eval_every: Annotated[
        int, typer.Option(min=0, help="Evaluate every K steps (0: after the last step only).")
    ] = 0,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Save every K steps (0: at the end only; default: the plan's "
            "checkpoint_every_steps, from `plan --checkpoint-every`, else 0).",
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the latest checkpoint in --checkpoint-dir.")
    ] = False,
    resume_from: Annotated[
        Path | None,
        typer.Option(
            help="Continue from this checkpoint (a step-NNNNNNNN directory, or its name in "
            "--checkpoint-dir) instead of the latest; newer ones are renamed "
            "superseded-step-*. --checkpoint-dir defaults to the directory holding it."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Step lines to stderr, a JSON summary to stdout.")
    ] = False,
    elastic: Annotated[
        bool,
        typer.Option(
            help="A lost node does not end the run: re-plan for the live nodes and resume "
            "from the newest checkpoint (--emulate, or under torchrun's elastic rendezvous).",
            rich_help_panel=_ELASTIC,
        ),
    ] = False,
    node: Annotated[
        str | None,
        typer.Option(
            "--node-name",
            envvar="PIEBALD_NODE",
            help="Under torchrun with --elastic: the cluster file's node this process runs "
            "on (node name or host; default: this machine's host name).",
            rich_help_panel=_ELASTIC,
        ),
    ] = None,
    fallbacks: Annotated[
        Path | None,
        typer.Option(
            help="With --elastic: the directory of `piebald plan --fallbacks`; a node loss "
            "it holds a plan for needs no search.",
            rich_help_panel=_ELASTIC,
        ),
    ] = None,
    membership: Annotated[
        Path | None,
        typer.Option(
            help="With --emulate --elastic: a YAML file naming the live nodes (nodes: "
            "[a100-0, ...]); an edit removes or adds nodes at the next step boundary, with "
            "nothing recomputed.",
            rich_help_panel=_ELASTIC,
        ),
    ] = None,
    collective_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            max=86_400.0,
            help="Seconds a collective or transfer may wait for a peer before the run fails "
            "(a dead peer is an error, never a hang).",
            rich_help_panel=_ELASTIC,
        ),
    ] = 300.0,
    time_scale: Annotated[
        float,
        typer.Option(
            min=1e-6,
            max=1e6,  # finite, and a sleep can reach the deadline (pacing.MAX_TIME_SCALE)
            help="Emulation: wall seconds per emulated second.",
        ),
    ] = 1.0,
    lr: Annotated[
        float,
        typer.Option(
            min=0.0, help="Peak learning rate (after warmup).", rich_help_panel=_OPTIMIZER
        ),
    ] = 1e-3,
    warmup_steps: Annotated[
        int,
        typer.Option(
            min=0,
            help="Rise linearly to --lr over this many steps (step k: lr*(k+1)/(N+1)).",
            rich_help_panel=_OPTIMIZER,
        ),
    ] = 0,
    lr_decay: Annotated[
        str,
        typer.Option(
            help="After warmup: constant, cosine or linear down to --min-lr.",
            rich_help_panel=_OPTIMIZER,
        ),
    ] = "constant",
    decay_steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The step at which the decay reaches --min-lr (default: --steps).",
            rich_help_panel=_OPTIMIZER,
        ),
    ] = None,
    min_lr: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Floor of the cosine and linear decays (a learning rate, not a fraction).",
            rich_help_panel=_OPTIMIZER,
        ),
    ] = 0.0,
    weight_decay: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="AdamW's decoupled decay, on matrices only (not on norms or biases).",
            rich_help_panel=_OPTIMIZER,
        ),
    ] = 0.0,
    max_grad_norm: Annotated[
        float,
        typer.Option(min=0.0, help="Clip at this norm (0: off).", rich_help_panel=_OPTIMIZER),
    ] = 1.0,
    max_emulated_params: Annotated[
        int, typer.Option(min=1, help="Emulate larger models at reduced width.")
    ] = 50_000_000,
    compute_dtype: Annotated[
        str | None,
        typer.Option(
            help="native: each GPU's own dtype (bf16, else fp16 with loss scaling, else "
            "fp32), as the plan priced; fp32: everywhere, to compare exactly with the "
            "reference. Default: native on GPUs, fp32 on CPU and under --emulate."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Reference run (no --plan): preset or config.json.")
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option(min=1, help="Reference run: sequences per step.")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(min=1, help="Reference run: tokens per row.")
    ] = None,
    micro_batch_size: Annotated[
        int | None, typer.Option(min=1, help="Reference run: rows per forward (memory only).")
    ] = None,
) -> None:
    """Train under a plan (torchrun or --emulate), or in one process as the reference."""
    from piebald.api import OptimizerConfig, TrainConfig

    del job_file  # its keys are already the defaults of the options above (cli.job_file)
    _check_finite(lr=lr, min_lr=min_lr, weight_decay=weight_decay, max_grad_norm=max_grad_norm)
    with _as_flags():
        config = TrainConfig(
            steps=steps,
            seed=seed,
            optimizer=OptimizerConfig(
                lr=lr,
                weight_decay=weight_decay,
                max_grad_norm=max_grad_norm or None,
            ),
            data_path=data,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every or 0,
            resume=resume or resume_from is not None,
            resume_from=resume_from,
            metrics_path=metrics,
            tensorboard_dir=tensorboard,
            save_model_path=save_model,
            init_from=init_from,
            eval_data_path=eval_data,
            eval_every=eval_every,
            time_scale=time_scale if emulate else None,
            timeout_s=collective_timeout,
            elastic=elastic,
            node=node,
            membership_path=membership,
            fallback_dir=fallbacks,
        )
    run_train(
        plan_file=plan_file,
        emulate=emulate,
        device=device,
        model=model,
        global_batch=global_batch,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        max_emulated_params=max_emulated_params,
        compute_dtype=compute_dtype,
        as_json=as_json,
        schedule=ScheduleFlags(
            warmup_steps=warmup_steps,
            lr_decay=lr_decay,
            decay_steps=decay_steps,
            min_lr=min_lr,
        ),
        config=config,
        plan_checkpoints=checkpoint_every is None,
    )


@user_errors
def run_train(
    *,
    plan_file: Path | None,
    emulate: bool,
    device: str | None,
    model: str | None,
    global_batch: int | None,
    seq_len: int | None,
    micro_batch_size: int | None,
    max_emulated_params: int,
    compute_dtype: str | None,
    as_json: bool,
    config: TrainConfig,
    schedule: ScheduleFlags | None = None,
    plan_checkpoints: bool = False,
) -> None:
    """``plan_checkpoints``: --checkpoint-every was not given, so the plan's interval
    (``checkpoint_every_steps``) holds where the run has a checkpoint directory."""
    from dataclasses import replace

    from piebald.api import ComputeDtype, check_hf_weights
    from piebald.api.training import check_config

    if device not in (None, "cpu", "cuda"):
        raise _fail("--device", device, "cpu or cuda")
    if schedule is not None:
        with _as_flags():
            config = replace(config, lr_schedule=_lr_schedule(schedule, config=config))
    choices = [c.value for c in ComputeDtype]
    if compute_dtype is not None and compute_dtype not in choices:
        raise _fail("--compute-dtype", compute_dtype, " or ".join(choices))
    if compute_dtype is not None:
        config = replace(config, compute_dtype=ComputeDtype(compute_dtype))
    if config.resume_from is not None and config.checkpoint_dir is None:
        # New checkpoints go next to the one resumed from: the same run, continued.
        config = replace(config, checkpoint_dir=config.resume_from.parent)
    # Every output and the settings they depend on, as the API checks them, under the flags.
    check_config(config, flags=FLAG_OF_FIELD, restarted=config.elastic and not emulate)
    if plan_file is None:
        if emulate:
            raise _fail("--emulate", True, "a --plan to emulate")
        if config.elastic:
            raise _fail("--elastic", True, "a --plan: the single-process reference has no nodes")
        if model is None or global_batch is None or seq_len is None:
            raise _fail(
                "--plan",
                None,
                "a plan, or --model, --global-batch and --seq-len for a single-process run",
            )
        if config.checkpoint_dir is not None or config.resume:
            raise _fail(
                "--checkpoint-dir",
                str(config.checkpoint_dir),
                "a --plan: the single-process reference takes no checkpoints",
            )
        if compute_dtype not in (None, ComputeDtype.FP32.value):
            raise _fail(
                "--compute-dtype",
                compute_dtype,
                "fp32 or nothing without a --plan: the single-process reference is fp32",
            )
        from piebald.api import load_model, train_reference

        with _as_flags():
            spec = load_model(model)
        check_seq_len(spec, seq_len=seq_len)
        if config.init_from is not None:
            check_hf_weights(spec, config.init_from)
        # The reference computes in fp32 on every device: it is what plans are compared with.
        job = job_from(global_batch=global_batch, seq_len=seq_len, precision=Dtype.FP32)
        summary = train_reference(
            spec,
            job,
            replace(config, device=device or "cpu"),
            micro_batch_size=micro_batch_size,
            print_line=_line_printer(as_json),
        )
        _print_summary(summary, as_json=as_json, saved_to=config.save_model_path)
        return
    if model is not None or global_batch is not None or seq_len is not None:
        raise _fail("--model", model, "no --model/--global-batch/--seq-len with --plan")
    plan = load_checked_plan(plan_file)
    if config.init_from is not None:
        check_hf_weights(plan.model, config.init_from)
    if plan_checkpoints and plan.checkpoint_every_steps and config.checkpoint_dir is not None:
        config = replace(config, checkpoint_every=plan.checkpoint_every_steps)
        (errors if as_json else console).print(
            f"checkpoint every {plan.checkpoint_every_steps} steps, as {plan_file} says "
            "(--checkpoint-every to choose)",
            highlight=False,
        )
    if emulate and config.node is not None:
        raise _fail("--node-name", config.node, "no --node-name with --emulate (it is torchrun's)")
    if not emulate and config.membership_path is not None:
        raise _fail(
            "--membership",
            str(config.membership_path),
            "--emulate with it (under torchrun, nodes join and leave by torchrun's rendezvous)",
        )
    if emulate:
        if device == "cuda":
            raise _fail("--device", device, "cpu with --emulate (emulation runs CPU processes)")
        from piebald.api import emulate as emulate_plan
        from piebald.api import emulated_model

        runtime_model = emulated_model(plan, max_params=max_emulated_params)
        if runtime_model is not plan.model and config.init_from is not None:
            raise _fail(
                "--init-from",
                str(config.init_from),
                f"a model that emulation runs at full width: {plan.model.name} has "
                f"{plan.model.num_params:,} parameters, above --max-emulated-params "
                f"{max_emulated_params:,}",
            )
        if runtime_model is not plan.model:
            (errors if as_json else console).print(
                f"emulating {plan.model.name} at reduced width: the processes train "
                f"{runtime_model.name} ({runtime_model.num_params / 1e6:,.1f}M parameters); "
                "emulated times are those of the full model",
                highlight=False,
            )
        summary = emulate_plan(
            plan,
            config=config,
            max_params=max_emulated_params,
            lines_to_stderr=as_json,
            source=str(plan_file),
        )
        _print_summary(summary, as_json=as_json, saved_to=config.save_model_path)
        return
    _train_distributed(
        plan_file,
        config,
        device=device,
        compute_dtype_given=compute_dtype is not None,
        as_json=as_json,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleFlags:
    """The learning-rate schedule's flags as given (checked by :func:`_lr_schedule`)."""

    warmup_steps: int = 0
    lr_decay: str = "constant"
    decay_steps: int | None = None
    min_lr: float = 0.0


def _lr_schedule(flags: ScheduleFlags, *, config: TrainConfig) -> LrSchedule:
    from piebald.api import LrDecay, LrSchedule

    choices = [d.value for d in LrDecay]
    if flags.lr_decay not in choices:
        raise _fail("--lr-decay", flags.lr_decay, " or ".join(choices))
    decay = LrDecay(flags.lr_decay)
    peak = config.optimizer.lr
    if decay is not LrDecay.CONSTANT and flags.min_lr > peak:
        raise _fail("--min-lr", flags.min_lr, f"at most --lr ({peak:g}): the decay's floor")
    decay_steps = flags.decay_steps if flags.decay_steps is not None else config.steps
    if decay is not LrDecay.CONSTANT and decay_steps <= flags.warmup_steps:
        given = "--decay-steps" if flags.decay_steps is not None else "--steps"
        raise _fail(
            given,
            decay_steps,
            f"a step after --warmup-steps ({flags.warmup_steps}), where the {decay.value} "
            "decay reaches --min-lr",
        )
    return LrSchedule(
        warmup_steps=flags.warmup_steps,
        decay=decay,
        decay_steps=decay_steps if decay is not LrDecay.CONSTANT else None,
        min_lr=flags.min_lr,
    )


def _line_printer(as_json: bool) -> Callable[[str], None]:
    """Step lines go to stdout, or to stderr when stdout carries the JSON summary."""

    def print_line(line: str) -> None:
        print(line, flush=True, file=sys.stderr if as_json else sys.stdout)

    return print_line


def _train_distributed(
    plan_file: Path,
    config: TrainConfig,
    *,
    device: str | None,
    compute_dtype_given: bool,
    as_json: bool,
) -> None:
    """One rank of a real run: ``torchrun`` set RANK, WORLD_SIZE and the rendezvous."""
    from piebald.api import train as train_rank
    from piebald.api import under_torchrun

    if not under_torchrun():
        raise _fail(
            "--plan",
            str(plan_file),
            "a run under torchrun (see `piebald launch --plan`), or --emulate to run the "
            "plan's cluster on this machine",
        )
    summary = train_rank(
        load_checked_plan(plan_file),
        config=config,
        device=device,
        compute_dtype=config.compute_dtype if compute_dtype_given else None,
        print_line=_line_printer(as_json),
    )
    if summary is not None:
        _print_summary(summary, as_json=as_json, saved_to=config.save_model_path)
