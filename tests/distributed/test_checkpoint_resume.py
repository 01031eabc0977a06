"""Checkpoints across process restarts: three ranks train 6 steps saving at step 3; new
processes resume and are killed (SIGKILL of one rank) while saving step 5, which leaves
step 3 the latest complete checkpoint; new processes refuse a truncated copy (the same
one-line error on every rank), resume from the latest and continue with losses, norms and
parameters identical to the uninterrupted run; two ranks with other stage cuts load the
same checkpoint and continue with the same numbers up to reassociation."""

from __future__ import annotations

from pathlib import Path

import dist_workers
import pytest
from dist_harness import run_ranks
from torch.multiprocessing.spawn import ProcessException

pytestmark = pytest.mark.distributed


def test_resume_after_kill_restart_and_reshard(tmp_path: Path) -> None:
    checkpoints, results = tmp_path / "ckpt", tmp_path / "results"
    results.mkdir()
    run_ranks(dist_workers.resume_uninterrupted, 3, str(checkpoints), str(results))
    # Usually "process 2 terminated with signal SIGKILL"; under load the parent may notice a
    # survivor's "connection closed" first. The restarted run checks what the kill left.
    with pytest.raises(ProcessException):
        run_ranks(dist_workers.resume_killed, 3, str(checkpoints), str(results))
    run_ranks(dist_workers.resume_restarted, 3, str(checkpoints), str(results))
    run_ranks(dist_workers.resume_resharded, 2, str(checkpoints), str(results))
