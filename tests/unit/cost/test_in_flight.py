"""Little's in-flight budget of a 1F1B rank (``cost.in_flight``) against closed forms:
PipeDream-Flush's p - s warm-up forwards for one rank per stage, ceil(R n / N) by hand, and
the fewest micro-batches in flight that make a given number of round trips.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from piebald.cost.in_flight import (
    IN_FLIGHT_SLACK,
    in_flight_for_rounds,
    in_flight_micro_batches,
    is_chain,
    little_budget,
    mean_in_flight,
    num_round_trips,
    slack_of,
    stage_round_trips,
)
from piebald.specs.plan import Schedule

# --- micro-batches in flight --------------------------------------------------------------


def test_gpipe_keeps_every_micro_batch() -> None:
    for count in (1, 5, 16):
        assert (
            in_flight_micro_batches(
                schedule=Schedule.GPIPE,
                ranks_to_end=4,
                rank_micro_batches=count,
                stage_micro_batches=32,
                slack=0,
                last_stage=False,
            )
            == count
        )


@pytest.mark.parametrize(
    ("downstream", "rank_count", "stage_count", "expected"),
    [
        (4, 8, 8, 4),  # min(8, ceil(4 x 8 / 8))
        (4, 2, 2, 2),  # fewer micro-batches than the ranks to the end
        (4, 2, 8, 1),  # ceil(4 x 2 / 8) = 1
        (3, 3, 8, 2),  # ceil(3 x 3 / 8) = 2
        (1, 5, 8, 1),  # one rank to the end, by the mean: ceil(1 x 5 / 8) = 1
        (3, 1, 100, 1),  # a rank with a tiny share still holds one
        (8, 6, 10, 5),  # ceil(8 x 6 / 10) = 5
        (6, 8, 16, 3),  # two ranks in each of three stages, the first: ceil(6 x 8 / 16)
        (4, 0, 8, 0),  # a rank with no micro-batches holds none
    ],
)
def test_one_f_one_b_in_flight(
    downstream: int, rank_count: int, stage_count: int, expected: int
) -> None:
    assert (
        in_flight_micro_batches(
            schedule=Schedule.ONE_F_ONE_B,
            ranks_to_end=downstream,
            rank_micro_batches=rank_count,
            stage_micro_batches=stage_count,
            slack=0,
            last_stage=False,
        )
        == expected
    )


@pytest.mark.parametrize(("count", "total"), [(37, 2048), (3, 5), (1, 1), (9, 64)])
def test_a_last_stage_rank_holds_one(count: int, total: int) -> None:
    """Its backward follows its forward: one micro-batch in flight, however its share of
    the stage's micro-batches rounds (56 ranks sharing 2,048: those with 37 would hold
    ceil(56 x 37 / 2048) = 2 by the mean)."""
    ranks = math.ceil(total / count)  # every rank of the stage, each about this share
    held = in_flight_micro_batches(
        schedule=Schedule.ONE_F_ONE_B,
        ranks_to_end=ranks,
        rank_micro_batches=count,
        stage_micro_batches=total,
        slack=0,
        last_stage=True,
    )
    assert held == 1


def test_gpipe_rank_without_micro_batches_holds_none() -> None:
    assert (
        in_flight_micro_batches(
            schedule=Schedule.GPIPE,
            ranks_to_end=2,
            rank_micro_batches=0,
            stage_micro_batches=4,
            slack=0,
            last_stage=False,
        )
        == 0
    )


@pytest.mark.parametrize("num_stages", range(1, 9))
def test_first_stage_of_one_rank_holds_p_micro_batches(num_stages: int) -> None:
    # PipeDream-Flush: stage 0 of p runs p warm-up forwards before its first backward.
    for count in range(num_stages, 3 * num_stages + 1):
        assert (
            in_flight_micro_batches(
                schedule=Schedule.ONE_F_ONE_B,
                ranks_to_end=num_stages,  # one rank per stage
                rank_micro_batches=count,
                stage_micro_batches=count,
                slack=0,
                last_stage=num_stages == 1,
            )
            == num_stages
        )


@given(num_stages=st.integers(1, 16), data=st.data())
def test_one_f_one_b_in_flight_bounds(num_stages: int, data: st.DataObject) -> None:
    stage_index = data.draw(st.integers(0, num_stages - 1))
    stage_count = data.draw(st.integers(1, 64))
    rank_count = data.draw(st.integers(1, stage_count))
    held = in_flight_micro_batches(
        schedule=Schedule.ONE_F_ONE_B,
        ranks_to_end=num_stages - stage_index,  # one rank per stage
        rank_micro_batches=rank_count,
        stage_micro_batches=stage_count,
        slack=0,
        last_stage=stage_index == num_stages - 1,
    )
    depth = num_stages - stage_index
    assert 1 <= held <= rank_count
    assert held == max(1, min(rank_count, math.ceil(depth * rank_count / stage_count)))
    assert held <= depth  # never more than the 1F1B warm-up of the stage
    if rank_count == stage_count:  # alone in its stage
        assert held == min(rank_count, depth)


# --- a lowered in-flight budget -----------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "count", "rounds", "expected"),
    [
        (8, 16, 2, 8),  # Little's budget already runs 16 in 2 round trips
        (8, 16, 3, 6),  # ceil(16 / 3)
        (8, 16, 16, 1),  # one at a time: a round trip per micro-batch
        (8, 16, 40, 1),  # never fewer than one
        (4, 16, 2, 4),  # never more than the budget
        (4, 0, 3, 0),  # a rank without micro-batches holds none
    ],
)
def test_in_flight_for_rounds_by_hand(budget: int, count: int, rounds: int, expected: int) -> None:
    assert (
        in_flight_for_rounds(budget=budget, rank_micro_batches=count, num_rounds=rounds) == expected
    )


@given(budget=st.integers(1, 64), count=st.integers(1, 200), rounds=st.integers(1, 200))
def test_in_flight_for_rounds_is_the_fewest_that_make_the_round_trips(
    budget: int, count: int, rounds: int
) -> None:
    held = in_flight_for_rounds(budget=budget, rank_micro_batches=count, num_rounds=rounds)
    assert 1 <= held <= min(budget, count)
    if held < budget:  # not capped: the round trips are met, and one fewer would miss them
        assert math.ceil(count / held) <= rounds
        assert held == 1 or math.ceil(count / (held - 1)) > rounds


# --- the chain, the slack, arrays ----------------------------------------------------------


def test_a_chain_is_one_working_rank_per_stage() -> None:
    assert is_chain([1, 1, 1]) and is_chain([1]) and is_chain([])
    assert not is_chain([1, 2, 1])


@pytest.mark.parametrize(
    ("schedule", "widths", "expected"),
    [
        (Schedule.ONE_F_ONE_B, [2, 2], IN_FLIGHT_SLACK),
        (Schedule.ONE_F_ONE_B, [1, 2], IN_FLIGHT_SLACK),  # waits at a later stage
        (Schedule.ONE_F_ONE_B, [1, 1, 1], 0),  # a chain: textbook 1F1B
        (Schedule.ONE_F_ONE_B, [4], 0),  # the last stage
        (Schedule.GPIPE, [2, 2], 0),  # holds everything anyway
    ],
)
def test_slack_only_where_micro_batches_wait(
    schedule: Schedule, widths: list[int], expected: int
) -> None:
    assert slack_of(schedule=schedule, widths=widths) == expected


@given(
    ranks=st.integers(1, 64),
    counts=st.lists(st.integers(1, 64), min_size=1, max_size=8),
    slack=st.integers(0, 2),
    rounds=st.integers(1, 70),
)
def test_arrays_agree_with_scalars(ranks: int, counts: list[int], slack: int, rounds: int) -> None:
    """The planner prices every layer range at once with the same functions on arrays."""
    total = sum(counts)
    n = np.array(counts, dtype=np.float64)
    mean = mean_in_flight(ranks_to_end=ranks, rank_micro_batches=n, stage_micro_batches=total)
    budgets = little_budget(mean, slack=slack, most=n)
    trips = num_round_trips(n, budgets)
    lowered = in_flight_for_rounds(budget=budgets, rank_micro_batches=n, num_rounds=rounds)
    for index, count in enumerate(counts):
        budget = in_flight_micro_batches(
            schedule=Schedule.ONE_F_ONE_B,
            ranks_to_end=ranks,
            rank_micro_batches=count,
            stage_micro_batches=total,
            slack=slack,
            last_stage=False,
        )
        assert budgets[index] == budget
        assert trips[index] == num_round_trips(count, budget) == math.ceil(count / budget)
        assert lowered[index] == in_flight_for_rounds(
            budget=budget, rank_micro_batches=count, num_rounds=rounds
        )


def test_a_stages_round_trips_are_its_slowest_ranks_per_rank_and_per_range() -> None:
    # One rule for the exact build (per rank, ranks without work take none, at least 1)
    # and the DP (per GPU type, elementwise over layer ranges): the same numbers.
    counts, budgets = (7, 0, 3), (2, 0, 3)
    assert stage_round_trips(counts, budgets) == 4  # ceil(7 / 2); the idle rank none
    assert stage_round_trips((0, 0), (1, 1)) == 1
    arrays = stage_round_trips(
        [np.array([7.0, 1.0, 5.0]), np.array([3.0, 1.0, 9.0])],
        [np.array([2.0, 1.0, 5.0]), np.array([3.0, 1.0, 2.0])],
    )
    expected = [
        stage_round_trips((a, b), (w, v))
        for a, b, w, v in ((7, 3, 2, 3), (1, 1, 1, 1), (5, 9, 5, 2))
    ]
    assert arrays.tolist() == expected == [4, 1, 5]
