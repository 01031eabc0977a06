"""What a training run is asked to do, besides the plan: steps, seed, optimizer settings and
learning-rate schedule, data, initial weights, evaluation, checkpoints, metrics (JSONL,
TensorBoard), and emulation's time scale."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps = {self.steps}; expected >= 1")
        if self.seed < 0:
            raise ValueError(f"seed = {self.seed}; expected >= 0")
        if self.eval_every < 0:
            raise ValueError(f"eval_every = {self.eval_every}; expected >= 0")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every = {self.checkpoint_every}; expected >= 0")
        if self.time_scale is not None and not self.time_scale > 0:
            raise ValueError(f"time_scale = {self.time_scale}; expected > 0")
