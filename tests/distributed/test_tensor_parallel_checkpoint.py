"""Checkpoints of tensor-parallel plans keep "any plan reloads any checkpoint": a TP 2
plan's run saved at step 4 resumes to step 6 with bit for bit the losses and final weights
of its uninterrupted run; its step-2 checkpoint resumes under a plan of two stages without
tensor parallelism, whose step-4 checkpoint resumes under TP 2 again, both continuing
with the uninterrupted numbers up to reassociation (the tolerances of the resharding test,
test_checkpoint_resume: losses to 1e-5 relative, weights to 1e-4 relative and 1e-5
absolute).

One uninterrupted 6-step run of the TP 2 plan, saving every 2 steps, serves both tests
(a save does not change the run; every emulated run costs seconds of process start-up).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from dist_harness import StageSpec, make_plan
from equivalence import CONFIG
from safetensors.torch import load_file
from test_tensor_parallel import _one_stage_two_ways

from piebald.runtime.distributed.checkpoint import checkpoint_name
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.specs.plan import Plan

pytestmark = pytest.mark.distributed

STEPS, EVERY = 6, 2


def _two_stages() -> Plan:
    """The TP 2 plan's job on two ranks as a pipeline without tensor parallelism: layers
    [0, 3) on rank 1, [3, 6) on rank 0 (ranks and cut both differ)."""
    return make_plan(
        [
            StageSpec(layer_end=3, ranks=(1,), num_micro_batches=(4,), fractions=(1.0,)),
            StageSpec(layer_end=6, ranks=(0,), num_micro_batches=(4,), fractions=(1.0,)),
        ],
        num_gpus=2,
        tied=True,
    )


@dataclasses.dataclass(frozen=True)
class Run:
    losses: list[float]  # of the steps it trained
    checkpoints: Path  # its checkpoint directory
    weights: dict[str, torch.Tensor]  # at its end (--save-model)


def _train(plan: Plan, out: Path, *, steps: int, resume_from: Path | None = None) -> Run:
    config: TrainConfig = dataclasses.replace(
        CONFIG,
        steps=steps,
        save_model_path=out / "model",
        checkpoint_dir=out / "ckpt",
        checkpoint_every=EVERY,
        resume_from=resume_from,
    )
    losses = emulate(plan, config, max_params=10**9, lines_to_stderr=True).losses
    return Run(
        losses=losses,
        checkpoints=out / "ckpt",
        weights=load_file(str(out / "model" / "model.safetensors")),
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = _train(_one_stage_two_ways(), tmp_path_factory.mktemp("tp2"), steps=STEPS)
    assert len(run.losses) == STEPS and len(set(run.losses)) == STEPS  # they move
    return run


def _assert_weights_close(mine: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert sorted(mine) == sorted(theirs)
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_tensor_parallel_checkpoint_resumes_bit_for_bit(uninterrupted: Run, tmp_path: Path) -> None:
    resumed = _train(
        _one_stage_two_ways(),
        tmp_path,
        steps=STEPS,
        resume_from=uninterrupted.checkpoints / checkpoint_name(4),
    )
    assert resumed.losses == uninterrupted.losses[4:]  # exact
    assert sorted(resumed.weights) == sorted(uninterrupted.weights)
    for name, value in uninterrupted.weights.items():
        assert torch.equal(resumed.weights[name], value), name


def test_checkpoints_resume_across_tensor_parallel_degrees(
    uninterrupted: Run, tmp_path: Path
) -> None:
    """TP 2 at step 2 -> two stages at TP 1 to step 4 -> TP 2 to step 6."""
    whole = _train(
        _two_stages(),
        tmp_path / "whole",
        steps=4,
        resume_from=uninterrupted.checkpoints / checkpoint_name(2),
    )
    assert whole.losses == pytest.approx(uninterrupted.losses[2:4], rel=1e-5)
    split = _train(
        _one_stage_two_ways(),
        tmp_path / "split",
        steps=STEPS,
        resume_from=whole.checkpoints / checkpoint_name(4),
    )
    assert split.losses == pytest.approx(uninterrupted.losses[4:], rel=1e-5)
    _assert_weights_close(split.weights, uninterrupted.weights)
