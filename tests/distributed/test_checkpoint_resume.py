"""Checkpoints across process restarts: three ranks train 6 steps saving at 3 and 5; new
processes refuse a truncated copy (same one-line error on every rank), load step 3 and
continue with identical losses, norms and parameters; two ranks with other stage cuts
load the same checkpoint and continue with the same numbers up to reassociation."""

from __future__ import annotations

from pathlib import Path

import dist_workers
import pytest
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


def test_resume_after_restart_and_reshard(tmp_path: Path) -> None:
    checkpoints, results = tmp_path / "ckpt", tmp_path / "results"
    results.mkdir()
    run_ranks(dist_workers.resume_uninterrupted, 3, str(checkpoints), str(results))
    run_ranks(dist_workers.resume_restarted, 3, str(checkpoints), str(results))
    run_ranks(dist_workers.resume_resharded, 2, str(checkpoints), str(results))
