"""Checkpoint and resume under a plan: a run stopped after step 2 and resumed gives bit for
bit the losses of the uninterrupted run, its learning-rate schedule (warmup, linear decay)
and weight decay continuing where they stopped; a directory holding checkpoints is never
reused without --resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from dist_harness import StageSpec, make_plan

from piebald.cost.plan_estimate import estimate_plan
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.checkpoint_lock import LOCK_FILE
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.lr_schedule import LrDecay, LrSchedule
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


def paced(seconds_per_step: float) -> list[str]:
    """``--time-scale`` that paces PLAN's emulated step at about ``seconds_per_step`` of
    wall time (from its estimate, so that it follows the cost model's prices)."""
    return ["--time-scale", f"{seconds_per_step / estimate_plan(PLAN).step_time_s:.6g}"]


def _lrs(path: Path) -> list[float]:
    return [json.loads(line)["lr"] for line in path.read_text().splitlines()]


def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    config = TrainConfig(
        steps=4,
        seed=5,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1),
        lr_schedule=LrSchedule(warmup_steps=1, decay=LrDecay.LINEAR, decay_steps=4),
    )
    whole = emulate(
        PLAN,
        dataclasses.replace(config, metrics_path=tmp_path / "whole.jsonl"),
        max_params=10**9,
        lines_to_stderr=True,
    )

    checkpoints = tmp_path / "ckpt"
    config = dataclasses.replace(config, metrics_path=tmp_path / "parts.jsonl")
    first = emulate(
        PLAN,
        dataclasses.replace(config, steps=2, checkpoint_dir=checkpoints, checkpoint_every=1),
        max_params=10**9,
        lines_to_stderr=True,
    )
    saved = sorted(p.name for p in checkpoints.iterdir() if p.name != LOCK_FILE)
    assert saved == ["step-00000001", "step-00000002"]
    resumed = emulate(
        PLAN,
        dataclasses.replace(config, checkpoint_dir=checkpoints, resume=True),
        max_params=10**9,
        lines_to_stderr=True,
    )
    assert resumed.first_step == 2
    assert first.losses + resumed.losses == whole.losses  # exact, not approximate
    assert len(set(whole.losses)) == 4  # the losses move, so equality means something
    whole_lrs, parts_lrs = (_lrs(tmp_path / name) for name in ("whole.jsonl", "parts.jsonl"))
    assert parts_lrs == whole_lrs and len(set(whole_lrs)) == 4  # went on at step 3

    with pytest.raises(FileExistsError, match="--resume"):
        emulate(
            PLAN,
            dataclasses.replace(config, checkpoint_dir=checkpoints),
            max_params=10**9,
        )
