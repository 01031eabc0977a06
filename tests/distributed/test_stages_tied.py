"""Three stages of sizes 1, 1 and 2 (ranks [3], [0], [2, 1]) with the LM head tied to the
embedding: groups as planned, the tied gradient summed across stages, losses, gradient
norms and parameters equal to single-process training, tied replicas identical."""

from __future__ import annotations

import dist_workers
import pytest
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


def test_stages_of_different_sizes_with_a_tied_head() -> None:
    run_ranks(dist_workers.stages_with_tied_head, 4)
