"""A stage's tensor groups: what a plan of tensor-parallel degree > 1 must hold, and that
its files round-trip (older files, without the fields, read as degree 1 and as the
runtime's ``blocks`` layout)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from piebald.errors import SpecError
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, Stage, ZeroMode
from piebald.specs.plan_io import plan_from_dict, plan_to_dict
from piebald.specs.presets import load_model
from piebald.specs.tensor_layout import TensorLayout

# Two nodes of four GPUs: ranks 0-3 and 4-7.
CLUSTER = parse_cluster(
    {
        "name": "two-by-four",
        "nodes": [
            {"name": "a", "gpu": "A100-80GB", "gpus_per_node": 4, "intra_link": "300GB/s"},
            {"name": "b", "gpu": "V100-32GB", "gpus_per_node": 4, "intra_link": "150GB/s"},
        ],
    },
    source="test",
)
MODEL = load_model("tiny")  # 4 heads, 2 key/value heads, MLP width 176
JOB = JobSpec(global_batch_size=8, seq_len=32)


def _plan(routes: tuple[tuple[int, ...], ...] | None = None, **first: Any) -> Plan:
    """Stage 0: ranks 0-3 as two tensor groups of 2; stage 1: ranks 4, 5 without."""
    stage0 = Stage(
        layer_start=0,
        layer_end=3,
        ranks=(0, 1, 2, 3),
        micro_batch_size=(2, 2, 2, 2),
        num_micro_batches=(3, 3, 1, 1),
        shard_fraction=(0.375, 0.375, 0.125, 0.125),
        zero=ZeroMode.OPTIMIZER,
        tensor_parallel_degree=2,
    )
    stage1 = Stage(
        layer_start=3,
        layer_end=6,
        ranks=(4, 5),
        micro_batch_size=(2, 2),
        num_micro_batches=(2, 2),
        shard_fraction=(0.5, 0.5),
    )
    return Plan(
        cluster=CLUSTER,
        model=MODEL,
        job=JOB,
        stages=(dataclasses.replace(stage0, **first), stage1),
        routes=routes or ((0, 4), (2, 5), (0, 4), (0, 5)),
    )


def _field_of_error(**first: Any) -> str:
    with pytest.raises(SpecError) as caught:
        _plan(**first)
    return caught.value.field


def test_tensor_groups_leaders_and_data_parallel_groups() -> None:
    stage = _plan().stages[0]
    assert stage.tensor_groups == ((0, 1), (2, 3))
    assert stage.leaders == (0, 2)
    assert [stage.leader_of(rank) for rank in stage.ranks] == [0, 0, 2, 2]
    assert stage.data_parallel_group(1) == (1, 3)
    assert stage.data_parallel_group(2) == (0, 2)
    plain = _plan().stages[1]
    assert plain.leaders == plain.ranks
    assert plain.data_parallel_group(5) == (4, 5)


def test_a_tensor_parallel_plan_round_trips_and_older_files_read_as_degree_one() -> None:
    plan = _plan()
    data = plan_to_dict(plan)
    assert data["stages"][0]["tensor_parallel_degree"] == 2
    assert "tensor_parallel_degree" not in data["stages"][1]
    assert plan_from_dict(data, source="test") == plan
    assert plan_from_dict(data, source="test").stages[1].tensor_parallel_degree == 1


def test_a_tensor_layout_round_trips_and_is_written_only_where_not_blocks() -> None:
    plan = _plan(tensor_layout=TensorLayout.SEQUENCE)
    data = plan_to_dict(plan)
    assert data["stages"][0]["tensor_layout"] == "sequence"
    assert plan_from_dict(data, source="test") == plan
    blocks = plan_to_dict(_plan())
    assert "tensor_layout" not in blocks["stages"][0]
    assert plan_from_dict(blocks, source="test").stages[0].tensor_layout is TensorLayout.BLOCKS
    data["stages"][0]["tensor_layout"] = "sequential"
    with pytest.raises(SpecError) as caught:
        plan_from_dict(data, source="test")
    assert caught.value.field == "stages[0].tensor_layout"


def test_a_layout_needs_a_tensor_group() -> None:
    with pytest.raises(SpecError) as caught:
        dataclasses.replace(
            _plan(),
            stages=(
                _plan().stages[0],
                dataclasses.replace(_plan().stages[1], tensor_layout=TensorLayout.VOCABULARY),
            ),
        )
    assert caught.value.field == "stages[1].tensor_layout"


@pytest.mark.parametrize(
    ("first", "field"),
    [
        ({"tensor_parallel_degree": 3}, "stages[0].tensor_parallel_degree"),
        # 4 does not divide tiny's 2 key/value heads
        ({"tensor_parallel_degree": 4}, "stages[0].tensor_parallel_degree"),
        # ranks 3 and 4 sit in different nodes
        ({"ranks": (0, 1, 3, 6)}, "stages[0].ranks"),
        # a group's members run the same micro-batches
        ({"num_micro_batches": (3, 2, 1, 2)}, "stages[0].num_micro_batches"),
        ({"micro_batch_size": (2, 1, 2, 2)}, "stages[0].micro_batch_size"),
        ({"shard_fraction": (0.5, 0.25, 0.125, 0.125)}, "stages[0].shard_fraction"),
    ],
)
def test_bad_tensor_groups_name_their_field(first: dict[str, Any], field: str) -> None:
    assert _field_of_error(**first) == field


def test_routes_name_tensor_group_leaders() -> None:
    with pytest.raises(SpecError) as caught:
        _plan(routes=((1, 4), (2, 5), (0, 4), (0, 5)))
    assert caught.value.field == "routes[0]"
    assert "leaders" in str(caught.value)


def test_a_whole_number_of_groups() -> None:
    with pytest.raises(SpecError) as caught:
        Plan(
            cluster=CLUSTER,
            model=MODEL,
            job=JOB,
            stages=(
                Stage(
                    layer_start=0,
                    layer_end=6,
                    ranks=(0, 1, 2),
                    micro_batch_size=(2, 2, 2),
                    num_micro_batches=(2, 2, 0),
                    shard_fraction=(0.5, 0.5, 0.0),
                    zero=ZeroMode.OPTIMIZER,
                    tensor_parallel_degree=2,
                ),
            ),
            routes=((0,), (0,), (0,), (0,)),
        )
    assert caught.value.field == "stages[0].ranks"
