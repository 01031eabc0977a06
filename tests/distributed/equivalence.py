"""The reference comparison of the plan-equivalence tests (docs/design.md section 3):
train a plan on emulated gloo ranks and the same job in one process, and check that they
agree, step for step, to 1e-4 (test_plan_equivalence.py describes what is covered).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from piebald.runtime.data.token_file import write_token_file
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.reference import train_reference
from piebald.specs.plan import Plan

__all__ = ["CONFIG", "STEPS", "assert_trains_like_one_process"]

STEPS = 5
CONFIG = TrainConfig(steps=STEPS, seed=3, optimizer=OptimizerConfig(lr=3e-3, max_grad_norm=1.0))


def assert_trains_like_one_process(
    plan: Plan,
    config: TrainConfig,
    *,
    one_tag: bool,
    tmp_path: Path,
    mixed_gpu_types: bool = True,
    param_atol: float = 1e-5,
) -> None:
    """Train ``plan`` (emulated) and the single-process reference under ``config``: the
    same losses step by step, evaluation losses and final parameters (to ``param_atol``
    plus 1e-4 relative). ``mixed_gpu_types``: the plan must use two GPU types or more (the
    plans of test_plan_equivalence do)."""
    if mixed_gpu_types:
        assert len({plan.cluster.device_of(r).name for r in plan.used_ranks}) >= 2
    window = plan.job.seq_len + 1
    num_windows = plan.job.global_batch_size + 3  # two chunks, the second one padded
    eval_ids = np.random.default_rng(11).integers(0, 256, size=num_windows * window + 5)
    config = dataclasses.replace(
        config,
        eval_data_path=write_token_file(tmp_path / "eval.bin", eval_ids).path,
        eval_every=2,
    )
    reference = train_reference(
        plan.model,
        plan.job,
        dataclasses.replace(
            config,
            save_model_path=tmp_path / "reference",
            metrics_path=tmp_path / "reference.jsonl",
        ),
        print_line=lambda _: None,
    )
    run = emulate(
        plan,
        dataclasses.replace(
            config,
            save_model_path=tmp_path / "plan",
            metrics_path=tmp_path / "plan.jsonl",
            one_tag=one_tag,
        ),
        max_params=10**9,
        lines_to_stderr=True,
    )
    assert run.eval_steps == reference.eval_steps == (2, 4, 5)
    for step, mine, theirs in zip(
        run.eval_steps, run.eval_losses, reference.eval_losses, strict=True
    ):
        assert mine == pytest.approx(theirs, rel=1e-5), f"evaluation after step {step}"
    assert run.steps == STEPS and len(run.losses) == STEPS
    assert all(math.isfinite(loss) for loss in run.losses)
    # The model learns: the check below compares two moving sequences, not two constants.
    assert reference.losses[-1] < reference.losses[0] - 0.05
    for step, (mine, theirs) in enumerate(zip(run.losses, reference.losses, strict=True)):
        assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-4), f"step {step + 1}"
    mine = load_file(str(tmp_path / "plan" / "model.safetensors"))
    theirs = load_file(str(tmp_path / "reference" / "model.safetensors"))
    assert sorted(mine) == sorted(theirs)
    for param_name, value in theirs.items():
        torch.testing.assert_close(
            mine[param_name], value, rtol=1e-4, atol=param_atol, msg=param_name
        )
