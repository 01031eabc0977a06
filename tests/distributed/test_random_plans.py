"""The random plans of ``random_plans`` are valid and cover what they claim to."""

from __future__ import annotations

from random_plans import check_variety


def test_random_plans_cover_every_stage_count_zero_mode_and_schedule() -> None:
    check_variety()
