"""What a training run is asked to do, besides the plan: steps, seed, optimizer settings and
learning-rate schedule, data, initial weights, evaluation, checkpoints, metrics (JSONL,
TensorBoard), and emulation's time scale.

A TrainConfig checks its fields when made (and when ``dataclasses.replace`` remakes it): a
value of the wrong type or out of range, a float that is inf or nan anywhere (its own, its
optimizer's, its schedule's) is an :class:`~piebald.errors.ArgumentError` naming the field
(``steps``, ``optimizer.lr``, ``lr_schedule.min_lr``); a path may be given as a str."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from piebald.errors import ArgumentError
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.lr_schedule import LrSchedule
from piebald.runtime.training.precision import ComputeDtype

__all__ = ["TrainConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    steps: int  # the run ends after this step (a resumed run continues up to it)
    seed: int = 0  # model initialisation and the batches of every step
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # The lr of each step around optimizer.lr (its peak): lr_schedule.lr_at(step, ...).
    lr_schedule: LrSchedule = field(default_factory=LrSchedule)
    data_path: Path | None = None  # a token file; None: the shipped corpus, byte-tokenised
    device: str = "cpu"  # "cpu" or "cuda" (one GPU per process: cuda:LOCAL_RANK)
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0  # 0: only at the end of the run (when a directory is given)
    resume: bool = False  # continue from the latest checkpoint in checkpoint_dir
    # Continue from this checkpoint (a step-* directory) instead of the latest; implies resume.
    resume_from: Path | None = None
    # The caller (the emulator's parent) holds checkpoint_dir's lock and has checked it:
    # ranks resume from resume_from as given, without taking the lock again (resume.py).
    checkpoint_dir_claimed: bool = False
    metrics_path: Path | None = None  # one JSON object per step, appended by the leader
    tensorboard_dir: Path | None = None  # the same scalars as TensorBoard events (leader)
    save_model_path: Path | None = None  # the trained model, a Hugging Face directory
    init_from: Path | None = None  # a Hugging Face directory whose weights start the run
    eval_data_path: Path | None = None  # a token file for the evaluation loss
    eval_every: int = 0  # evaluate after every K-th step (0: after the last step only)
    time_scale: float | None = None  # emulation: wall seconds per emulated second; None: real
    # native: each rank in its GPU's dtype (what the plan priced); fp32: everywhere, for an
    # exact comparison with the reference (``runtime.training.precision``).
    compute_dtype: ComputeDtype = ComputeDtype.FP32
    # Every point-to-point message on one tag, so gloo matches them in posting order per
    # pair as NCCL does (tests the ordering argument of ``runtime.pipeline.mailbox``).
    one_tag: bool = False
    # Count live tensor bytes per step (CUDA: allocator statistics, free; CPU: a dispatch
    # mode over every operator, which slows small models down: ``memory_meter``).
    measure_memory: bool = True
    timeout_s: float = 300.0  # a collective waiting longer than this fails the run
    # Elastic training (docs/guides/elastic.md): a lost node ends in a new plan for the
    # live nodes and a resume from the newest checkpoint, not in the run's end.
    elastic: bool = False
    # Under torchrun with ``elastic``: the cluster file's node this process runs on (its
    # node name or host; None: this machine's host name).
    node: str | None = None
    # A YAML file naming the live nodes (``specs.membership``): an edit takes effect at the
    # next step boundary, with a checkpoint there, so nothing is recomputed.
    membership_path: Path | None = None
    # With ``elastic``: the fallback plans of ``piebald plan --fallbacks`` (no search for a
    # node loss they hold a plan for).
    fallback_dir: Path | None = None

    def __post_init__(self) -> None:
        for name in _PATHS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
                    raise _error(name, value, "a path (str or pathlib.Path) or None")
                object.__setattr__(self, name, Path(value))
        _whole(self.steps, "steps", minimum=1)
        _whole(self.seed, "seed", minimum=0)
        _whole(self.eval_every, "eval_every", minimum=0)
        _whole(self.checkpoint_every, "checkpoint_every", minimum=0)
        for name in ("resume", "checkpoint_dir_claimed", "one_tag", "measure_memory", "elastic"):
            if not isinstance(getattr(self, name), bool):
                raise _error(name, getattr(self, name), "True or False")
        if self.node is not None and (not isinstance(self.node, str) or not self.node):
            raise _error("node", self.node, "a node's name or host, or None")
        if self.device not in ("cpu", "cuda"):
            raise _error("device", self.device, "cpu or cuda")
        if not isinstance(self.compute_dtype, ComputeDtype):
            raise _error("compute_dtype", self.compute_dtype, "a ComputeDtype")
        if self.time_scale is not None:
            _finite(self.time_scale, "time_scale", positive=True)
        _finite(self.timeout_s, "timeout_s", positive=True)
        if not isinstance(self.optimizer, OptimizerConfig):
            raise _error("optimizer", self.optimizer, "an OptimizerConfig")
        optimizer = self.optimizer
        _finite(optimizer.lr, "optimizer.lr", minimum=0.0)
        _finite(optimizer.eps, "optimizer.eps", positive=True)
        _finite(optimizer.weight_decay, "optimizer.weight_decay", minimum=0.0)
        if optimizer.max_grad_norm is not None:
            _finite(optimizer.max_grad_norm, "optimizer.max_grad_norm", positive=True)
        betas = optimizer.betas
        if not isinstance(betas, tuple) or len(betas) != 2:
            raise _error("optimizer.betas", betas, "a pair of numbers in [0, 1)")
        for index, beta in enumerate(betas):
            _finite(beta, f"optimizer.betas[{index}]", minimum=0.0)
            if not beta < 1:
                raise _error(f"optimizer.betas[{index}]", beta, "a number in [0, 1)")
        if not isinstance(self.lr_schedule, LrSchedule):
            raise _error("lr_schedule", self.lr_schedule, "an LrSchedule")
        _finite(self.lr_schedule.min_lr, "lr_schedule.min_lr", minimum=0.0)


_PATHS = tuple(
    f.name
    for f in fields(TrainConfig)
    if f.name.endswith(("_path", "_dir", "_from")) and f.name != "checkpoint_dir_claimed"
)


def _error(name: str, value: object, expected: str) -> ArgumentError:
    return ArgumentError(argument=name, value=value, expected=expected)


def _whole(value: object, name: str, *, minimum: int) -> None:
    expected = f"a whole number >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(name, value, expected)
    if value < minimum:
        raise _error(name, value, expected)


def _finite(
    value: object, name: str, *, minimum: float | None = None, positive: bool = False
) -> None:
    bound = "> 0" if positive else f">= {minimum:g}" if minimum is not None else ""
    expected = f"a finite number {bound}".strip()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(name, value, expected)
    if (
        not math.isfinite(value)
        or (minimum is not None and value < minimum)
        or (positive and not value > 0)
    ):
        raise _error(name, value, expected)
