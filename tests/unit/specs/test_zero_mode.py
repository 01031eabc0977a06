"""ZeroMode's properties against the ZeRO paper's definitions and the collectives each mode
runs, both written out here by hand.

Rajbhandari et al. 2020 (ZeRO, section 5): stage 1 (P_os) partitions the optimizer states,
stage 2 (P_os+g) also the gradients, stage 3 (P_os+g+p) also the parameters. Gradients are
accumulated over a step's micro-batches where they are kept whole (Zorse's
pipeline-efficient ZeRO): a replicated stage all-reduces them once per step, ZeRO-1
reduce-scatters them once and all-gathers the updated parameters; ZeRO-2 keeps only its
gradient shard, so it reduce-scatters every backward pass, and all-gathers the updated
parameters at the step's end; ZeRO-3 keeps only its parameter shard, so it gathers the
parameters for every pass and has nothing left to gather at the step's end.
"""

from __future__ import annotations

import pytest

from piebald.specs.plan import ZeroMode

# mode: which of (optimizer state, gradients, parameters) each rank keeps only a shard of.
PAPER = {
    ZeroMode.NONE: (False, False, False),
    ZeroMode.OPTIMIZER: (True, False, False),  # P_os
    ZeroMode.GRADIENTS: (True, True, False),  # P_os+g
    ZeroMode.FULL: (True, True, True),  # P_os+g+p
}

# mode: (collectives inside every pass, collectives at the step's end).
COLLECTIVES: dict[ZeroMode, tuple[set[str], set[str]]] = {
    ZeroMode.NONE: (set(), {"all_reduce"}),
    ZeroMode.OPTIMIZER: (set(), {"reduce_scatter", "all_gather"}),
    ZeroMode.GRADIENTS: ({"reduce_scatter"}, {"all_gather"}),
    ZeroMode.FULL: ({"all_gather", "reduce_scatter"}, set()),
}


def test_every_mode_has_a_row() -> None:
    assert set(PAPER) == set(ZeroMode) == set(COLLECTIVES)


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_sharded_states_follow_the_paper(zero: ZeroMode) -> None:
    optimizer, gradients, weights = PAPER[zero]
    assert zero.shards_optimizer is optimizer
    assert zero.shards_gradients is gradients
    assert zero.shards_weights is weights
    assert zero.replicated is (zero is ZeroMode.NONE)


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_collectives_follow_the_table(zero: ZeroMode) -> None:
    per_pass, step_end = COLLECTIVES[zero]
    assert zero.gathers_per_pass is ("all_gather" in per_pass)
    assert zero.reduces_per_pass is ("reduce_scatter" in per_pass)
    assert zero.per_pass is bool(per_pass)
    assert zero.step_end_all_reduce is ("all_reduce" in step_end)
    assert zero.step_end_reduce_scatter is ("reduce_scatter" in step_end)
    assert zero.step_end_all_gather is ("all_gather" in step_end)


@pytest.mark.parametrize("zero", list(ZeroMode))
def test_every_mode_trains(zero: ZeroMode) -> None:
    """Consistency a new mode must keep: the gradients are reduced exactly once, by one
    of the three ways, and every rank computes each pass with whole weights after the
    update (kept whole by a replicated update, gathered at the step's end, or gathered
    for the pass)."""
    reductions = [zero.step_end_all_reduce, zero.step_end_reduce_scatter, zero.reduces_per_pass]
    assert sum(reductions) == 1
    assert sum([zero.replicated, zero.step_end_all_gather, zero.gathers_per_pass]) == 1
    # A rank that keeps only a shard of something never reduces into the whole of it.
    assert not (zero.shards_gradients and zero.step_end_all_reduce)
