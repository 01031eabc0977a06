"""The learning rate of every training step: linear warmup, then a constant, cosine or
linear decay down to a floor.

One pure function, :func:`lr_at`, of the step alone (no torch, no state): the single-process
reference and every rank under a plan call it with the same step and get the same float, and
a run resumed from a checkpoint at step k continues the schedule at step k with nothing to
restore. Skipped steps (fp16 overflow) still advance it, as they advance the data.

Steps are 0-based (``step`` is the optimizer step about to be taken, the metrics' ``step``
minus one). With ``W = warmup_steps`` and ``D = decay_steps``:

* warmup, ``step < W``: ``lr * (step + 1) / (W + 1)``, rising linearly from ``lr / (W + 1)``
  (never 0: every step updates) to meet the decay at ``step = W``;
* decay, ``W <= step``: progress ``p = min(1, (step - W) / (D - W))`` and
  constant: ``lr``; linear: ``min_lr + (lr - min_lr) * (1 - p)``;
  cosine (Loshchilov & Hutter 2017, SGDR, without restarts):
  ``min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2``;
* after ``D`` the cosine and linear decays stay at ``min_lr``, an absolute learning rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["LrDecay", "LrSchedule", "lr_at"]


class LrDecay(StrEnum):
    CONSTANT = "constant"
    COSINE = "cosine"
    LINEAR = "linear"


@dataclass(frozen=True, slots=True, kw_only=True)
class LrSchedule:
    """How the learning rate moves around the optimizer's peak ``lr``; the default is the
    constant learning rate."""

    warmup_steps: int = 0
    decay: LrDecay = LrDecay.CONSTANT
    # The step at which a cosine or linear decay reaches min_lr (the CLI's default: the
    # run's --steps); unused by the constant decay.
    decay_steps: int | None = None
    min_lr: float = 0.0  # the floor of the cosine and linear decays, absolute

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"LrSchedule.warmup_steps = {self.warmup_steps}; expected >= 0")
        if not self.min_lr >= 0:
            raise ValueError(f"LrSchedule.min_lr = {self.min_lr}; expected >= 0")
        if self.decay is not LrDecay.CONSTANT and (
            self.decay_steps is None or self.decay_steps <= self.warmup_steps
        ):
            raise ValueError(
                f"LrSchedule.decay_steps = {self.decay_steps} with a {self.decay.value} decay; "
                f"expected a step after the warmup's {self.warmup_steps}"
            )

    def as_dict(self) -> dict[str, object]:
        """JSON-serialisable (checkpoints record the schedule they were trained with)."""
        return {
            "warmup_steps": self.warmup_steps,
            "decay": self.decay.value,
            "decay_steps": self.decay_steps,
            "min_lr": self.min_lr,
        }


def lr_at(step: int, *, lr: float, schedule: LrSchedule) -> float:
    """The learning rate of 0-based optimizer step ``step`` for peak learning rate ``lr``."""
    if step < 0:
        raise ValueError(f"step = {step}; expected >= 0")
    warmup = schedule.warmup_steps
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if schedule.decay is LrDecay.CONSTANT:
        return lr
    assert schedule.decay_steps is not None  # validated at construction
    progress = min(1.0, (step - warmup) / (schedule.decay_steps - warmup))
    if schedule.decay is LrDecay.LINEAR:
        remaining = 1.0 - progress
    else:
        remaining = 0.5 * (1.0 + math.cos(math.pi * progress))
    return schedule.min_lr + (lr - schedule.min_lr) * remaining
