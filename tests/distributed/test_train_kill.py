"""A training run killed mid-run (SIGKILL to every process) resumes from its last complete
checkpoint with exactly the losses of the uninterrupted run; a missing or corrupt
checkpoint is one line and exit 2, and the checkpoints on disk are left as they were."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_resume import PLAN, paced

from cli_runner import last_json, run_cli
from piebald.runtime.distributed.checkpoint import find_latest_checkpoint
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.checkpoint_lock import LOCK_FILE
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.specs.plan_io import save_plan

pytestmark = pytest.mark.distributed

STEPS = 8
TRAIN = ["--steps", str(STEPS), "--seed", "7", "--lr", "0.003"]
SLOW = paced(0.5)  # a step of about 0.5 s: the run outlives what the test does meanwhile


def _snapshot(directory: Path) -> dict[str, bytes]:
    """Every file's bytes but the lock's (each run writes its pid there)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file() and p.name != LOCK_FILE
    }


def test_kill_then_resume_reproduces_the_uninterrupted_losses(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    save_plan(PLAN, plan_path)
    config = TrainConfig(steps=STEPS, seed=7, optimizer=OptimizerConfig(lr=3e-3))
    whole = emulate(PLAN, config, max_params=10**9, lines_to_stderr=True)

    checkpoints = tmp_path / "ckpt"
    common = ["--plan", str(plan_path), "--emulate", *TRAIN, "--checkpoint-dir", str(checkpoints)]
    process = subprocess.Popen(
        [sys.executable, "-m", "piebald", "train", *common, "--checkpoint-every", "2", *SLOW],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the kill reaches every rank
    )
    deadline = time.monotonic() + 240
    while not checkpoints.exists() or find_latest_checkpoint(checkpoints) is None:
        assert process.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    latest = find_latest_checkpoint(checkpoints)
    assert latest is not None
    killed_at = int(latest.name.split("-")[1])
    assert killed_at < STEPS, "the kill came after the run had finished"

    code, output = run_cli("train", *common, "--resume", "--json")
    assert code == 0, output
    resumed = last_json(output)
    assert resumed["losses"] == list(whole.losses[killed_at:])  # exact


def test_missing_or_corrupt_checkpoint_is_one_line(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    save_plan(PLAN, plan_path)
    checkpoints = tmp_path / "ckpt"
    common = ["--plan", str(plan_path), "--emulate", "--checkpoint-dir", str(checkpoints)]
    code, output = run_cli("train", *common, "--steps", "1", "--resume")
    assert code == 2 and "--resume" in output and "Traceback" not in output

    code, output = run_cli("train", *common, "--steps", "1")
    assert code == 0, output
    latest = find_latest_checkpoint(checkpoints)
    assert latest is not None
    victim = sorted(latest.glob("rank-*"))[0]
    victim.write_bytes(victim.read_bytes()[:-16] + b"\0" * 16)  # same size, wrong bytes
    before = _snapshot(checkpoints)
    code, output = run_cli("train", *common, "--steps", "2", "--resume")
    assert code == 2 and victim.name in output and "Traceback" not in output, output
    assert _snapshot(checkpoints) == before  # nothing rewritten, nothing removed
