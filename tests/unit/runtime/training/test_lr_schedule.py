"""``lr_at`` against torch's own schedulers (LinearLR warmup, then CosineAnnealingLR or
LinearLR, chained by SequentialLR) and the closed forms at the schedule's corners."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.lr_schedule import LrDecay, LrSchedule, lr_at
from piebald.runtime.training.resume import warn_if_schedule_changed

LR = 3e-3
MIN_LR = 3e-4


def _torch_lrs(*, warmup: int, decay: LrDecay, decay_steps: int, steps: int) -> list[float]:
    """The lr torch's schedulers give each of ``steps`` steps (read before each step)."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=LR)
    span = decay_steps - warmup
    after: torch.optim.lr_scheduler.LRScheduler
    if decay is LrDecay.COSINE:
        after = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=span, eta_min=MIN_LR)
    elif decay is LrDecay.LINEAR:
        after = torch.optim.lr_scheduler.LinearLR(
            optimizer, start_factor=1.0, end_factor=MIN_LR / LR, total_iters=span
        )
    else:
        after = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    scheduler: torch.optim.lr_scheduler.LRScheduler = after
    if warmup:
        ramp = torch.optim.lr_scheduler.LinearLR(
            optimizer, start_factor=1 / (warmup + 1), end_factor=1.0, total_iters=warmup
        )
        scheduler = torch.optim.lr_scheduler.SequentialLR(
            optimizer, schedulers=[ramp, after], milestones=[warmup]
        )
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("decay", list(LrDecay))
@pytest.mark.parametrize("warmup", [0, 1, 4])
def test_equals_torch_schedulers(decay: LrDecay, warmup: int) -> None:
    decay_steps = 12
    schedule = LrSchedule(warmup_steps=warmup, decay=decay, decay_steps=decay_steps, min_lr=MIN_LR)
    # Up to decay_steps inclusive: past it torch's cosine climbs again, ours stays at the floor.
    expected = _torch_lrs(warmup=warmup, decay=decay, decay_steps=decay_steps, steps=13)
    mine = [lr_at(step, lr=LR, schedule=schedule) for step in range(13)]
    assert mine == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_corners() -> None:
    cosine = LrSchedule(warmup_steps=3, decay=LrDecay.COSINE, decay_steps=7, min_lr=MIN_LR)
    assert lr_at(0, lr=LR, schedule=cosine) == pytest.approx(LR / 4)  # never 0
    assert lr_at(3, lr=LR, schedule=cosine) == LR  # the peak, where the warmup meets decay
    assert lr_at(5, lr=LR, schedule=cosine) == pytest.approx((LR + MIN_LR) / 2)  # cos(pi/2)
    for step in (7, 8, 100):  # the floor, absolute, from decay_steps on
        assert lr_at(step, lr=LR, schedule=cosine) == pytest.approx(MIN_LR)
    assert all(lr_at(step, lr=LR, schedule=LrSchedule()) == LR for step in range(20))
    constant = LrSchedule(warmup_steps=2, min_lr=MIN_LR)  # no floor without a decay
    assert [lr_at(s, lr=LR, schedule=constant) for s in range(4)] == pytest.approx(
        [LR / 3, 2 * LR / 3, LR, LR]
    )
    linear = LrSchedule(decay=LrDecay.LINEAR, decay_steps=4)
    assert [lr_at(s, lr=LR, schedule=linear) for s in range(6)] == pytest.approx(
        [LR, 0.75 * LR, 0.5 * LR, 0.25 * LR, 0.0, 0.0]
    )


def test_invalid_schedules_name_the_field() -> None:
    with pytest.raises(ValueError, match="decay_steps = None"):
        LrSchedule(decay=LrDecay.COSINE)
    with pytest.raises(ValueError, match="decay_steps = 4"):
        LrSchedule(warmup_steps=4, decay=LrDecay.LINEAR, decay_steps=4)
    with pytest.raises(ValueError, match="warmup_steps = -1"):
        LrSchedule(warmup_steps=-1)
    with pytest.raises(ValueError, match="step = -1"):
        lr_at(-1, lr=LR, schedule=LrSchedule())


def test_resuming_under_another_schedule_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """A resumed run follows its own flags (the schedule is a function of the step and of
    them); when they differ from the checkpoint's, a warning names both."""
    schedule = LrSchedule(decay=LrDecay.COSINE, decay_steps=100)
    config = TrainConfig(steps=200, optimizer=OptimizerConfig(lr=LR), lr_schedule=schedule)
    saved = {"seed": 0, "lr": LR, "lr_schedule": schedule.as_dict()}
    checkpoint = Path("ckpt/step-00000100")
    with caplog.at_level(logging.WARNING):
        warn_if_schedule_changed(saved, config=config, checkpoint=checkpoint)
        assert not caplog.records
        longer = LrSchedule(decay=LrDecay.COSINE, decay_steps=200)  # --steps 200, no --decay-steps
        changed = TrainConfig(steps=200, optimizer=OptimizerConfig(lr=LR), lr_schedule=longer)
        warn_if_schedule_changed(saved, config=changed, checkpoint=checkpoint)
    (record,) = caplog.records
    assert str(checkpoint) in record.getMessage() and "'decay_steps': 200" in record.getMessage()
    assert "--decay-steps" in record.getMessage()
