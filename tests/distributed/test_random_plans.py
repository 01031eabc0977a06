"""The random plans of ``memory_cases`` are valid and cover what they claim to."""

from __future__ import annotations

from memory_cases import check_variety


def test_random_plans_cover_every_stage_count_zero_mode_and_schedule() -> None:
    check_variety()
