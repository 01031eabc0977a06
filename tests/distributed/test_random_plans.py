"""The random plans of ``memory_cases`` are valid and cover what they claim to."""

from __future__ import annotations

import random

from memory_cases import NUM_PLANS, random_plan

from piebald.specs.plan import Schedule, ZeroMode
from piebald.specs.recompute import Recompute


def test_random_plans_cover_every_stage_count_zero_mode_and_schedule() -> None:
    """The first NUM_PLANS seeds (what benchmarks/memory_prediction.py runs) cover every
    stage count, ZeRO mode, schedule, recompute setting and uneven shards."""
    plans = [random_plan(random.Random(seed)) for seed in range(NUM_PLANS)]
    assert {p.num_stages for p in plans} == {1, 2, 3, 4}
    assert {s.zero for p in plans for s in p.stages} == set(ZeroMode)
    assert {p.schedule for p in plans} == set(Schedule)
    assert {s.recompute for p in plans for s in p.stages} == set(Recompute)
    assert any(len(set(s.shard_fraction)) > 1 for p in plans for s in p.stages)
