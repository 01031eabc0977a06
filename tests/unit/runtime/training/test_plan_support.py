"""The runtime refuses, before anything starts, what it does not run, in one line naming
the plan field: the vocabulary layouts (its tensor groups never split the embedding and
head, ``specs.tensor_layout``), and a sequence-parallel stage whose degree does not
divide the sequence."""

from __future__ import annotations

import dataclasses

import pytest

from piebald.errors import SpecError
from piebald.runtime.training.plan_support import check_runtime_supports
from piebald.specs.plan import Plan
from piebald.specs.tensor_layout import TensorLayout
from tensor_plans import tp_plan, tp_stage


def _one_group(layout: TensorLayout, *, seq_len: int = 32) -> Plan:
    stage = tp_stage(layers=(0, 6), ranks=range(2), degree=2, num_micro_batches=2)
    return tp_plan("tiny", [dataclasses.replace(stage, tensor_layout=layout)], seq_len=seq_len)


@pytest.mark.parametrize("layout", [TensorLayout.SEQUENCE, TensorLayout.BLOCKS])
def test_the_runtimes_layouts_run(layout: TensorLayout) -> None:
    check_runtime_supports(_one_group(layout))


@pytest.mark.parametrize("layout", [TensorLayout.VOCABULARY, TensorLayout.VOCABULARY_SEQUENCE])
def test_vocabulary_layouts_are_refused_up_front(layout: TensorLayout) -> None:
    with pytest.raises(SpecError) as caught:
        check_runtime_supports(_one_group(layout))
    assert caught.value.field == "stages[0].tensor_layout"
    message = str(caught.value)
    assert "\n" not in message and "'sequence' or 'blocks'" in message and "re-plan" in message


def test_a_sequence_the_degree_does_not_divide_is_refused() -> None:
    """Sequence parallelism cuts each sequence into t equal chunks; ``blocks`` does not
    cut it."""
    with pytest.raises(SpecError) as caught:
        check_runtime_supports(_one_group(TensorLayout.SEQUENCE, seq_len=31))
    assert caught.value.field == "stages[0].tensor_parallel_degree"
    assert "seq_len (31)" in str(caught.value) and "\n" not in str(caught.value)
    check_runtime_supports(_one_group(TensorLayout.BLOCKS, seq_len=31))
