"""Uneven reduce-scatter and all-gather on gloo equal the reference (sum of every rank's
tensor, sliced; owners' slices, concatenated), for every method, with a rank owning 0."""

from __future__ import annotations

import dist_workers
import pytest
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


def test_uneven_collectives_on_four_ranks() -> None:
    run_ranks(dist_workers.collectives, 4)
