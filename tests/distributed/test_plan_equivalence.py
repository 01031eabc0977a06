"""The runtime's acceptance test (docs/design.md section 3): training the ``tiny`` model under any
plan gives the losses of single-process training, step for step, to 1e-4, and the same
parameters after the last step.

Plans cover 1, 2 and 3 stages on 2 to 6 gloo ranks of mixed emulated GPU types (one more
left idle), stages of different sizes fanning micro-batches out and in, unequal
micro-batch counts, per-GPU micro-batch sizes in one-stage plans, uneven shard fractions
under every ZeRO mode (ZeRO-2/3 layer by layer, in lockstep), a tied embedding/head within
a stage and across stages, recompute, and both schedules.
Each run is 5 optimizer steps of AdamW with clipping, once with a tag per message and once
with every message on one tag (NCCL's matching: in posting order per pair), evaluating
after steps 2, 4 and 5 on a file of three windows more than the global batch (two chunks,
the second padded): the evaluation losses equal the reference's too. Two plans also
train with weight decay (matrices only, cut across uneven shards) under a warmup and cosine
schedule: the same learning rate each step as the reference, and the same result.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from dist_harness import StageSpec, make_plan
from equivalence import CONFIG, STEPS, assert_trains_like_one_process

from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.lr_schedule import LrDecay, LrSchedule
from piebald.specs.plan import Plan, Schedule, ZeroMode
from piebald.specs.recompute import Recompute

pytestmark = pytest.mark.distributed

SCHEDULED = dataclasses.replace(
    CONFIG,
    optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.5, max_grad_norm=1.0),
    lr_schedule=LrSchedule(warmup_steps=1, decay=LrDecay.COSINE, decay_steps=3, min_lr=3e-4),
)


def _one_stage_mixed_sizes() -> Plan:
    """Two GPUs with their own micro-batch sizes (2 and 1) and counts, ZeRO-1 at 0.7 / 0.3."""
    return make_plan(
        [
            StageSpec(
                layer_end=6,
                ranks=(0, 1),
                num_micro_batches=(2, 3),
                fractions=(0.7, 0.3),
                micro_batch_sizes=(2, 1),
            )
        ],
        num_gpus=2,
        tied=True,
        gpu_types=("A100-80GB", "V100-32GB"),
    )


def _one_stage_zero3() -> Plan:
    """Cephalo: three GPUs with micro-batch sizes 2, 1 and 1 in equal counts, the whole
    training state sharded 0.5 / 0.3 / 0.2 (ZeRO-3, layer by layer), tied embedding."""
    return make_plan(
        [
            StageSpec(
                layer_end=6,
                ranks=(0, 1, 2),
                num_micro_batches=(2, 2, 2),
                fractions=(0.5, 0.3, 0.2),
                micro_batch_sizes=(2, 1, 1),
                zero=ZeroMode.FULL,
                recompute=Recompute.FULL,
            )
        ],
        num_gpus=3,
        tied=True,
        gpu_types=("A100-80GB", "V100-32GB", "T4"),
    )


def _two_stages_fan_out() -> Plan:
    """One GPU feeding three in the next stage (3:2:1 micro-batches), ZeRO-1 there."""
    return make_plan(
        [
            StageSpec(layer_end=2, ranks=(0,), num_micro_batches=(6,), fractions=(1.0,)),
            StageSpec(
                layer_end=6,
                ranks=(1, 2, 3),
                num_micro_batches=(3, 2, 1),
                fractions=(0.5, 0.3, 0.2),
                zero=ZeroMode.OPTIMIZER,
            ),
        ],
        num_gpus=4,
        tied=True,
        gpu_types=("A100-80GB", "RTX-4090", "RTX-4090", "T4"),
    )


def _three_stages_six_ranks(schedule: Schedule) -> Plan:
    """Stages of 2, 1 and 3 GPUs on 7 GPUs, one idle, untied head. Under 1F1B: ZeRO-1 with
    4:2 micro-batches, replicated with full recompute, ZeRO-1; under GPipe the outer stages
    run in lockstep with equal counts: ZeRO-2 and ZeRO-3, and the middle one recomputes
    selectively."""
    gpipe = schedule is Schedule.GPIPE
    return make_plan(
        [
            StageSpec(
                layer_end=2,
                ranks=(5, 0),
                num_micro_batches=(3, 3) if gpipe else (4, 2),
                fractions=(0.8, 0.2),
                zero=ZeroMode.GRADIENTS if gpipe else ZeroMode.OPTIMIZER,
            ),
            StageSpec(
                layer_end=4,
                ranks=(3,),
                num_micro_batches=(6,),
                fractions=(1.0,),
                zero=ZeroMode.NONE,
                recompute=Recompute.SELECTIVE if gpipe else Recompute.FULL,
            ),
            StageSpec(
                layer_end=6,
                ranks=(1, 2, 6),
                num_micro_batches=(2, 2, 2),
                fractions=(0.1, 0.6, 0.3),
                zero=ZeroMode.FULL if gpipe else ZeroMode.OPTIMIZER,
            ),
        ],
        num_gpus=7,
        tied=False,
        schedule=schedule,
        gpu_types=("A100-80GB", "A100-80GB", "V100-32GB", "V100-32GB", "L4", "L4", "T4"),
    )


PLANS = {
    "1 stage, 2 ranks, micro-batch sizes 2 and 1": _one_stage_mixed_sizes,
    "1 stage, 3 ranks, sizes 2/1/1, ZeRO-3, recompute, tied": _one_stage_zero3,
    "2 stages, 1 -> 3 ranks, tied head": _two_stages_fan_out,
    "3 stages, 2/1/3 ranks + 1 idle, 1F1B": lambda: _three_stages_six_ranks(Schedule.ONE_F_ONE_B),
    "3 stages, 2/1/3 ranks + 1 idle, GPipe, ZeRO-2 and ZeRO-3, selective": lambda: (
        _three_stages_six_ranks(Schedule.GPIPE)
    ),
}


def _lrs(path: Path) -> list[float]:
    return [json.loads(line)["lr"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("one_tag", [False, True], ids=["tagged", "one tag (NCCL matching)"])
@pytest.mark.parametrize("name", list(PLANS))
def test_plan_trains_exactly_like_one_process(name: str, one_tag: bool, tmp_path: Path) -> None:
    assert_trains_like_one_process(PLANS[name](), CONFIG, one_tag=one_tag, tmp_path=tmp_path)


@pytest.mark.parametrize(
    "name",
    [
        "1 stage, 3 ranks, sizes 2/1/1, ZeRO-3, recompute, tied",
        "3 stages, 2/1/3 ranks + 1 idle, GPipe, ZeRO-2 and ZeRO-3, selective",
    ],
)
def test_weight_decay_and_lr_schedule_train_like_one_process(name: str, tmp_path: Path) -> None:
    assert_trains_like_one_process(PLANS[name](), SCHEDULED, one_tag=False, tmp_path=tmp_path)
    lrs = _lrs(tmp_path / "plan.jsonl")
    assert lrs == _lrs(tmp_path / "reference.jsonl")  # the same floats, step for step
    assert len(set(lrs)) == STEPS - 1  # warmup, peak, half way, the floor (held)
