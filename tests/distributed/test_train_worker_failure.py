"""A worker that dies or fails ends an emulated run with one line, not a traceback: a
worker killed by a signal (the OOM killer's SIGKILL) names its rank, the signal and the
newest checkpoint; the run's scratch directory is removed; the exit status is 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_lifetime import _train, _wait_for, scratch  # noqa: F401  (a fixture)
from test_train_resume import PLAN, paced

from piebald.runtime.distributed.checkpoint import find_latest_checkpoint
from piebald.specs.plan_io import save_plan
from proc_table import children

pytestmark = pytest.mark.distributed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_killed_by_sigkill_is_one_line_naming_the_newest_checkpoint(
    tmp_path: Path,
    scratch: Path,  # noqa: F811
) -> None:
    """The OOM killer's kill -9 of one worker printed a 70-line traceback."""
    plan = tmp_path / "plan.json"
    save_plan(PLAN, plan)
    checkpoints = tmp_path / "ckpt"
    parent = subprocess.Popen(
        _train(plan, checkpoints, "--steps", "50", "--checkpoint-every", "1", *paced(1.0)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(scratch), "COLUMNS": "80"},
        text=True,
    )
    try:
        _wait_for(lambda: find_latest_checkpoint(checkpoints), parent, "checkpoint")
        # The parent's child is the forkserver; the workers are its children.
        workers = [pid for server in children(parent.pid) for pid in children(server)]
        assert len(workers) == PLAN.cluster.num_gpus, workers
        os.kill(max(workers), signal.SIGKILL)
        _, stderr = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
    assert parent.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "was killed by SIGKILL, likely out of memory" in lines[0], stderr
    newest = find_latest_checkpoint(checkpoints)
    assert newest is not None and f"the newest checkpoint is {newest}" in lines[0], stderr
    deadline = time.monotonic() + 10
    while list(scratch.glob("piebald-emulate-*")):
        assert time.monotonic() < deadline, list(scratch.iterdir())
        time.sleep(0.1)
