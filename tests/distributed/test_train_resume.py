"""Checkpoint and resume under a plan: a run stopped after step 2 and resumed gives bit for
bit the losses of the uninterrupted run; a directory holding checkpoints is never reused
without --resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from dist_harness import StageSpec, make_plan

from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.specs.plan import Schedule, ZeroMode

pytestmark = pytest.mark.distributed

# ZeRO-3 layer by layer in lockstep: equal counts, GPipe (``specs.plan``).
PLAN = make_plan(
    [
        StageSpec(layer_end=3, ranks=(1,), num_micro_batches=(4,), fractions=(1.0,)),
        StageSpec(
            layer_end=6,
            ranks=(0, 2),
            num_micro_batches=(2, 2),
            fractions=(0.35, 0.65),
            zero=ZeroMode.FULL,
        ),
    ],
    num_gpus=3,
    tied=True,
    schedule=Schedule.GPIPE,
)


def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    config = TrainConfig(steps=4, seed=5, optimizer=OptimizerConfig(lr=3e-3))
    whole = emulate(PLAN, config, max_params=10**9, lines_to_stderr=True)

    checkpoints = tmp_path / "ckpt"
    first = emulate(
        PLAN,
        dataclasses.replace(config, steps=2, checkpoint_dir=checkpoints, checkpoint_every=1),
        max_params=10**9,
        lines_to_stderr=True,
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000001", "step-00000002"]
    resumed = emulate(
        PLAN,
        dataclasses.replace(config, checkpoint_dir=checkpoints, resume=True),
        max_params=10**9,
        lines_to_stderr=True,
    )
    assert resumed.first_step == 2
    assert first.losses + resumed.losses == whole.losses  # exact, not approximate
    assert len(set(whole.losses)) == 4  # the losses move, so equality means something

    with pytest.raises(FileExistsError, match="--resume"):
        emulate(
            PLAN,
            dataclasses.replace(config, checkpoint_dir=checkpoints),
            max_params=10**9,
        )
