"""A stage of four ranks with shard fractions 0.5/0.3/0.2/0 and 3/2/1/0 micro-batches, in
every ZeRO mode, trains exactly like torch's AdamW on the whole buffer in one process:
bit for bit without clipping, to 1e-6 with clip_grad_norm_; an overflow on one rank makes
every rank skip."""

from __future__ import annotations

import dist_workers
import pytest
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


def test_sharded_adamw_equals_single_process_adamw() -> None:
    run_ranks(dist_workers.sharded_optimizer, 4)
