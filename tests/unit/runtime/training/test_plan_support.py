"""The runtime refuses, before anything starts, the tensor layouts it does not run: its
tensor groups split blocks only (``specs.tensor_layout``), so a plan priced in another
system's layout is named by its field, in one line."""

from __future__ import annotations

import dataclasses

import pytest

from piebald.errors import SpecError
from piebald.runtime.training.plan_support import check_runtime_supports
from piebald.specs.plan import Plan
from piebald.specs.tensor_layout import TensorLayout
from tensor_plans import tp_plan, tp_stage


def _one_group(layout: TensorLayout) -> Plan:
    stage = tp_stage(layers=(0, 6), ranks=range(2), degree=2, num_micro_batches=2)
    return tp_plan("tiny", [dataclasses.replace(stage, tensor_layout=layout)], seq_len=32)


def test_the_runtimes_layout_runs() -> None:
    check_runtime_supports(_one_group(TensorLayout.BLOCKS))


@pytest.mark.parametrize(
    "layout",
    [TensorLayout.VOCABULARY, TensorLayout.SEQUENCE, TensorLayout.VOCABULARY_SEQUENCE],
)
def test_other_layouts_are_refused_up_front(layout: TensorLayout) -> None:
    with pytest.raises(SpecError) as caught:
        check_runtime_supports(_one_group(layout))
    assert caught.value.field == "stages[0].tensor_layout"
    assert "\n" not in str(caught.value) and "blocks" in str(caught.value)


def test_a_sequence_the_degree_does_not_divide_is_refused() -> None:
    """The blocks run sequence parallel: each sequence is cut into t equal chunks."""
    plan = dataclasses.replace(
        _one_group(TensorLayout.BLOCKS),
        job=dataclasses.replace(_one_group(TensorLayout.BLOCKS).job, seq_len=31),
    )
    with pytest.raises(SpecError) as caught:
        check_runtime_supports(plan)
    assert caught.value.field == "stages[0].tensor_parallel_degree"
    assert "seq_len (31)" in str(caught.value) and "\n" not in str(caught.value)
