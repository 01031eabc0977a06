"""Which groups a plan needs, their ownership fractions, and the global creation order."""

from __future__ import annotations

import pytest
from dist_harness import StageSpec, make_plan, three_stage_plan

from piebald.runtime.distributed.group_layout import BucketPlacement, build_group_layout
from piebald.specs.plan import ZeroMode


def test_three_stages_of_different_sizes_with_a_tied_head() -> None:
    plan = three_stage_plan()
    layout = build_group_layout(plan)
    assert layout.used_ranks == (0, 1, 2, 3)
    # Ranks sorted, fractions follow their rank.
    assert layout.stages[2] == BucketPlacement(
        ranks=(1, 2), fractions=(0.3, 0.7), zero=ZeroMode.FULL
    )
    assert layout.tied is not None
    assert layout.tied.ranks == (1, 2, 3)
    assert layout.tied.fractions == pytest.approx((0.15, 0.35, 0.5))
    assert sum(layout.tied.fractions) == pytest.approx(1.0)
    assert layout.rank_tuples() == ((0, 1, 2, 3), (1, 2), (1, 2, 3))
    assert [layout.stage_index_of(r) for r in range(4)] == [1, 2, 2, 0]


def test_no_tied_group_without_tying_or_with_one_stage() -> None:
    untied = make_plan(
        [
            StageSpec(layer_end=3, ranks=(0,), num_micro_batches=(2,), fractions=(1.0,)),
            StageSpec(layer_end=6, ranks=(1, 2), num_micro_batches=(1, 1), fractions=(0.5, 0.5)),
        ],
        num_gpus=3,
        tied=False,
    )
    assert build_group_layout(untied).tied is None
    single = make_plan(
        [StageSpec(layer_end=6, ranks=(0, 1), num_micro_batches=(2, 1), fractions=(0.6, 0.4))],
        num_gpus=2,
    )
    layout = build_group_layout(single)
    assert layout.tied is None
    assert layout.rank_tuples() == ((0, 1),)


def test_idle_ranks_are_left_out_and_groups_of_one_are_not_created() -> None:
    plan = make_plan(
        [
            StageSpec(layer_end=3, ranks=(4,), num_micro_batches=(2,), fractions=(1.0,)),
            StageSpec(layer_end=6, ranks=(1,), num_micro_batches=(2,), fractions=(1.0,)),
        ],
        num_gpus=5,
    )
    layout = build_group_layout(plan)
    assert layout.used_ranks == (1, 4)
    assert layout.stage_index_of(0) is None
    # Used ranks and the tied pair are the same tuple: created once.
    assert layout.rank_tuples() == ((1, 4),)


def test_placement_rejects_unsorted_ranks() -> None:
    with pytest.raises(ValueError, match="sorted"):
        BucketPlacement(ranks=(2, 1), fractions=(0.5, 0.5), zero=ZeroMode.NONE)


def test_tensor_parallel_stage_groups_and_ownership() -> None:
    """Tensor groups (1, 0) and (3, 2) at fractions 0.35 and 0.15 per member, then a
    stage of one rank, tied head: what each group owns follows the plan's semantics."""
    plan = make_plan(
        [
            StageSpec(
                layer_end=3,
                ranks=(1, 0, 3, 2),
                num_micro_batches=(3, 3, 1, 1),
                fractions=(0.35, 0.35, 0.15, 0.15),
                tensor_parallel_degree=2,
            ),
            StageSpec(layer_end=6, ranks=(4,), num_micro_batches=(4,), fractions=(1.0,)),
        ],
        num_gpus=5,
        tied=True,
    )
    layout = build_group_layout(plan)
    assert layout.tensor == (((0, 1), (2, 3)), ())
    assert layout.tensor_group_of(0) == (0, 1) and layout.tensor_group_of(4) is None
    # Weights every member holds whole: the leaders (1 and 3) own their groups' 0.7 / 0.3,
    # the other members are replicas that own and add nothing.
    stage = layout.stages[0]
    assert stage.ranks == (0, 1, 2, 3) and stage.replicas == {0, 2}
    assert stage.fractions == pytest.approx((0.0, 0.7, 0.0, 0.3))
    # Split weights: position 0 is (1, 3), position 1 is (0, 2), each 0.7 / 0.3.
    first, second = layout.data_parallel[0]
    assert (first.ranks, second.ranks) == ((1, 3), (0, 2))
    for placement in (first, second):
        assert placement.fractions == pytest.approx((0.7, 0.3)) and not placement.replicas
    assert layout.data_parallel_of(0) is second and layout.data_parallel_of(4) is None
    assert layout.data_parallel[1] == ()
    # The tied table: half of each holder's share, nothing on the replicas.
    assert layout.tied is not None and layout.tied.ranks == (0, 1, 2, 3, 4)
    assert layout.tied.fractions == pytest.approx((0.0, 0.35, 0.0, 0.15, 0.5))
    assert layout.tied.replicas == {0, 2}
    assert layout.rank_tuples() == (
        (0, 1),
        (0, 1, 2, 3),
        (0, 1, 2, 3, 4),
        (0, 2),
        (1, 3),
        (2, 3),
    )


def test_replicas_own_nothing() -> None:
    with pytest.raises(ValueError, match="replicas"):
        BucketPlacement(
            ranks=(0, 1), fractions=(0.5, 0.5), zero=ZeroMode.OPTIMIZER, replicas=frozenset({1})
        )
