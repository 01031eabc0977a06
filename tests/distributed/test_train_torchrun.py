"""The production entry point: ``torchrun ... -m piebald train --plan`` (what ``piebald
launch`` prints), here with three CPU processes over gloo (a 1-rank stage feeding a fully
sharded 2-rank stage, tied head), trains like the single-process reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_resume import PLAN as THREE_RANK_PLAN

from cli_runner import last_json
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.reference import train_reference
from piebald.specs.plan_io import save_plan

pytestmark = pytest.mark.distributed

TRAIN = ["--steps", "3", "--seed", "4", "--lr", "0.003"]


def test_torchrun_trains_like_the_reference(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    save_plan(THREE_RANK_PLAN, plan_path)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(THREE_RANK_PLAN.cluster.num_gpus),
        "-m",
        "piebald",
        "train",
        "--plan",
        str(plan_path),
        "--device",
        "cpu",
        *TRAIN,
        "--json",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = last_json(done.stdout)  # only the leader prints it
    config = TrainConfig(steps=3, seed=4, optimizer=OptimizerConfig(lr=3e-3))
    reference = train_reference(
        THREE_RANK_PLAN.model, THREE_RANK_PLAN.job, config, print_line=lambda _: None
    )
    expected = list(reference.losses)
    assert summary["emulated"] is False and summary["steps"] == 3
    assert summary["losses"] == pytest.approx(expected, rel=1e-4, abs=1e-4)
