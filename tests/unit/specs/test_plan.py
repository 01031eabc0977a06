"""Plan validation, the weighted round robin of routes, and plan files (JSON round trip).

Every broken plan must be rejected with a :class:`SpecError` that names the offending
field, so a hand-edited plan file is easy to fix.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piebald.errors import SpecError
from piebald.outputs import OutputError
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, Prediction, Schedule, Stage, ZeroMode, weighted_round_robin
from piebald.specs.plan_io import load_plan, plan_from_dict, plan_to_dict, save_plan
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute

CLUSTER = parse_cluster(
    {
        "name": "four",
        "gpu_types": [
            {
                "name": "odd",
                "memory": "12.5GB",
                "bf16_tflops": 0.1,
                "fp16_tflops": 0.3,
                "fp32_tflops": 0.07,
                "memory_bandwidth": "333GB/s",
            }
        ],
        "nodes": [
            {"name": "a", "gpu": "A100-80GB", "gpus_per_node": 2, "intra_link": "300GB/s"},
            {
                "name": "b",
                "gpu": "odd",
                "gpus_per_node": 2,
                "intra_link": "16GB/s",
                "nic": {"kind": "roce", "bandwidth": "100Gb/s"},
            },
        ],
    },
    source="test",
)
MODEL = load_model("tiny")  # 6 layers: embedding, 4 blocks, head
JOB = JobSpec(global_batch_size=8, seq_len=32)


def _stages() -> tuple[Stage, Stage]:
    return (
        Stage(
            layer_start=0,
            layer_end=3,
            ranks=(0, 1),
            micro_batch_size=(2, 2),
            num_micro_batches=(2, 2),
            shard_fraction=(0.5, 0.5),
        ),
        Stage(
            layer_start=3,
            layer_end=6,
            ranks=(2, 3),
            micro_batch_size=(2, 2),
            num_micro_batches=(2, 2),
            shard_fraction=(0.75, 0.25),
            zero=ZeroMode.OPTIMIZER,
            recompute=Recompute.FULL,
        ),
    )


ROUTES = ((0, 2), (1, 3), (0, 2), (1, 3))


def _plan(
    *,
    stage0: dict[str, Any] | None = None,
    stage1: dict[str, Any] | None = None,
    **overrides: Any,
) -> Plan:
    first, second = _stages()
    fields: dict[str, Any] = dict(
        cluster=CLUSTER,
        model=MODEL,
        job=JOB,
        stages=(
            dataclasses.replace(first, **(stage0 or {})),
            dataclasses.replace(second, **(stage1 or {})),
        ),
        routes=ROUTES,
    )
    fields.update(overrides)
    return Plan(**fields)


def _field_of_error(**kwargs: Any) -> str:
    with pytest.raises(SpecError) as caught:
        _plan(**kwargs)
    error = caught.value
    assert error.field in str(error)
    assert error.source == "plan"
    return error.field


def test_the_base_plan_is_valid() -> None:
    plan = _plan()
    assert plan.num_stages == 2
    assert plan.used_ranks == (0, 1, 2, 3)
    assert plan.idle_ranks == ()
    assert plan.stage_of_rank == {0: 0, 1: 0, 2: 1, 3: 1}
    assert plan.micro_batch_sizes() == (2, 2, 2, 2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"stage1": {"ranks": (2, 4)}}, "stages[1].ranks"),  # the cluster has ranks 0..3
        ({"stage1": {"ranks": (2, -1)}}, "stages[1].ranks"),
        ({"stage1": {"ranks": (1, 3)}}, "stages[1].ranks"),  # rank 1 is in stage 0 already
        ({"stage0": {"ranks": (0, 0)}}, "stages[0].ranks"),
        ({"stage0": {"ranks": ()}}, "stages[0].ranks"),
    ],
)
def test_bad_ranks(kwargs: dict[str, Any], field: str) -> None:
    assert _field_of_error(**kwargs) == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"stage1": {"layer_start": 4}}, "stages[1].layers"),  # gap: layer 3 is in no stage
        ({"stage1": {"layer_start": 2}}, "stages[1].layers"),  # overlap
        ({"stage0": {"layer_start": 1}}, "stages[0].layers"),  # the embedding is missing
        ({"stage0": {"layer_end": 0}, "stage1": {"layer_start": 0}}, "stages[0].layers"),
        ({"stage1": {"layer_end": 5}}, "stages[1].layers"),  # the head is missing
    ],
)
def test_layers_must_be_contiguous_and_complete(kwargs: dict[str, Any], field: str) -> None:
    assert _field_of_error(**kwargs) == field


def test_micro_batches_must_sum_to_the_global_batch() -> None:
    assert _field_of_error(stage0={"num_micro_batches": (2, 1)}) == "stages[0].num_micro_batches"
    with pytest.raises(SpecError, match="global batch 8"):
        _plan(stage1={"num_micro_batches": (3, 2)})


def test_sizes_and_counts_must_be_positive() -> None:
    assert _field_of_error(stage0={"micro_batch_size": (0, 4)}) == "stages[0].micro_batch_size"
    assert _field_of_error(stage0={"num_micro_batches": (-1, 5)}) == "stages[0].num_micro_batches"


@pytest.mark.parametrize(
    "fractions", [(0.75, 0.5), (0.5, 0.4), (1.5, -0.5), (math.nan, 1.0), (math.inf, 0.0)]
)
def test_shard_fractions_must_sum_to_one(fractions: tuple[float, float]) -> None:
    assert _field_of_error(stage1={"shard_fraction": fractions}) == "stages[1].shard_fraction"


def test_uneven_fractions_need_a_zero_mode() -> None:
    assert _field_of_error(stage0={"shard_fraction": (0.6, 0.4)}) == "stages[0].shard_fraction"
    # The same fractions are fine once the state is sharded.
    _plan(stage0={"shard_fraction": (0.6, 0.4), "zero": ZeroMode.OPTIMIZER})
    _plan(stage0={"shard_fraction": (0.6, 0.4), "zero": ZeroMode.FULL}, schedule=Schedule.GPIPE)


@pytest.mark.parametrize("zero", [ZeroMode.GRADIENTS, ZeroMode.FULL])
def test_per_pass_zero_needs_its_ranks_in_lockstep(zero: ZeroMode) -> None:
    """A ZeRO-2/3 stage of several ranks meets in collectives inside every pass: equal
    micro-batch counts, and no 1F1B pipeline (whose pass order follows the inputs)."""
    # A 1F1B pipeline: refused, with the stage's zero named.
    assert _field_of_error(stage1={"zero": zero}) == "stages[1].zero"
    # GPipe: every rank runs all forwards, then all backwards; fine with equal counts ...
    _plan(stage1={"zero": zero}, schedule=Schedule.GPIPE)
    # ... but not with unequal ones.
    routes = ((0, 2), (1, 2), (0, 2), (1, 3))
    assert (
        _field_of_error(
            stage1={"zero": zero, "num_micro_batches": (3, 1)},
            routes=routes,
            schedule=Schedule.GPIPE,
        )
        == "stages[1].num_micro_batches"
    )
    # One stage under 1F1B (every rank alternates forward and backward): per-rank sizes in
    # equal counts.
    alone = Stage(
        layer_start=0,
        layer_end=6,
        ranks=(0, 1),
        micro_batch_size=(3, 1),
        num_micro_batches=(2, 2),
        shard_fraction=(0.7, 0.3),
        zero=zero,
    )
    one_stage = Plan(
        cluster=CLUSTER,
        model=MODEL,
        job=JOB,
        stages=(alone,),
        routes=tuple((r,) for r in weighted_round_robin([2, 2])),
    )
    assert one_stage.stages[0].num_sequences == 8  # per-rank sizes, equal counts


@pytest.mark.parametrize(
    ("name", "value"),
    [("micro_batch_size", (4,)), ("num_micro_batches", (2, 1, 1)), ("shard_fraction", (1.0,))],
)
def test_per_rank_lists_must_match_the_ranks(name: str, value: tuple[Any, ...]) -> None:
    assert _field_of_error(stage0={name: value}) == f"stages[0].{name}"


@pytest.mark.parametrize(
    ("routes", "field"),
    [
        (ROUTES[:3], "routes"),  # 3 routes for 4 micro-batches
        ((*ROUTES, (0, 2)), "routes"),
        (((0, 2), (1, 3), (0, 2), (2, 3)), "routes[3]"),  # rank 2 is not in stage 0
        (((0, 2), (1, 3), (0, 2), (1,)), "routes[3]"),  # a route must visit every stage
        (((0, 2), (0, 3), (0, 2), (1, 3)), "stages[0].num_micro_batches"),  # 3 visits to rank 0
        (((0, 2), (1, 2), (0, 2), (1, 3)), "stages[1].num_micro_batches"),  # 3 visits to rank 2
    ],
)
def test_routes_must_agree_with_the_micro_batch_counts(
    routes: tuple[tuple[int, ...], ...], field: str
) -> None:
    assert _field_of_error(routes=routes) == field


def test_a_multi_stage_plan_has_one_micro_batch_size() -> None:
    # Stage 1 alone is consistent (8 micro-batches of 1), but a micro-batch of 2 sequences
    # cannot become one of 1 at the stage boundary.
    field = _field_of_error(stage1={"micro_batch_size": (1, 1), "num_micro_batches": (4, 4)})
    assert field == "stages[*].micro_batch_size"


def test_a_one_stage_plan_may_mix_micro_batch_sizes() -> None:
    stage = Stage(
        layer_start=0,
        layer_end=6,
        ranks=(0, 2),
        micro_batch_size=(2, 1),
        num_micro_batches=(3, 2),
        shard_fraction=(0.5, 0.5),
    )
    plan = Plan(
        cluster=CLUSTER,
        model=MODEL,
        job=JOB,
        stages=(stage,),
        routes=((0,), (2,), (0,), (2,), (0,)),
    )
    assert plan.micro_batch_sizes() == (2, 1, 2, 1, 2)
    assert plan.idle_ranks == (1, 3)


def test_wrong_version() -> None:
    assert _field_of_error(version=2) == "version"


def test_no_stages() -> None:
    assert _field_of_error(stages=()) == "stages"


def test_gpt2_sequence_is_capped_by_its_positions() -> None:
    gpt2 = load_model("gpt2")
    stage = Stage(
        layer_start=0,
        layer_end=gpt2.num_layers,
        ranks=(0,),
        micro_batch_size=(1,),
        num_micro_batches=(1,),
        shard_fraction=(1.0,),
    )
    with pytest.raises(SpecError) as caught:
        Plan(
            cluster=CLUSTER,
            model=gpt2,
            job=JobSpec(global_batch_size=1, seq_len=2048),
            stages=(stage,),
            routes=((0,),),
        )
    assert caught.value.field == "job.seq_len"


# --- weighted round robin -----------------------------------------------------------------


def test_weighted_round_robin_documented_example() -> None:
    assert weighted_round_robin([2, 1, 1]) == [0, 1, 2, 0]


def test_weighted_round_robin_three_to_one_separates_the_one() -> None:
    order = weighted_round_robin([3, 1])
    assert Counter(order) == {0: 3, 1: 1}
    assert order[0] == 0 and order[-1] == 0  # the single 1 is surrounded by 0s


def test_weighted_round_robin_edge_cases() -> None:
    assert weighted_round_robin([]) == []
    assert weighted_round_robin([0, 0]) == []
    assert weighted_round_robin([0, 3, 0]) == [1, 1, 1]


def _positions(order: list[int], index: int) -> list[int]:
    return [p for p, value in enumerate(order) if value == index]


def _max_gap(positions: list[int]) -> int:
    return max((b - a for a, b in itertools.pairwise(positions)), default=0)


@given(st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_weighted_round_robin_respects_counts_and_spreads(counts: list[int]) -> None:
    order = weighted_round_robin(counts)
    total = sum(counts)
    assert len(order) == total
    assert Counter(order) == {i: c for i, c in enumerate(counts) if c}
    for index, count in enumerate(counts):
        if count == 0:
            continue
        positions = _positions(order, index)
        period = math.ceil(total / count)
        # No index waits more than a period for its first turn or after its last one,
        # and no gap is longer than two periods.
        assert positions[0] < period, (counts, order, index)
        assert total - positions[-1] <= period, (counts, order, index)
        assert _max_gap(positions) <= 2 * period, (counts, order, index)


def test_weighted_round_robin_two_ranks_gaps_within_a_period_plus_one() -> None:
    for first in range(1, 25):
        for second in range(1, 25):
            order = weighted_round_robin([first, second])
            total = first + second
            for index, count in enumerate((first, second)):
                gap = _max_gap(_positions(order, index))
                assert gap <= math.ceil(total / count) + 1, (first, second, order)


# --- plan files ---------------------------------------------------------------------------


def _full_plan() -> Plan:
    return _plan(
        predicted=Prediction(
            step_time_s=1.25, tokens_per_s=204.8, peak_memory_bytes={0: 1e9, 1: 2e9, 2: 3.5e9}
        ),
        upper_bound_tokens_per_s=300.0,
        notes=("hand-made", "two stages"),
        schedule=Schedule.GPIPE,
    )


def test_plan_json_round_trip_is_equal() -> None:
    plan = _full_plan()
    text = json.dumps(plan_to_dict(plan))
    again = plan_from_dict(json.loads(text), source="round-trip.json")
    assert again == plan
    assert again.cluster == CLUSTER
    assert again.predicted is not None
    assert dict(again.predicted.peak_memory_bytes) == {0: 1e9, 1: 2e9, 2: 3.5e9}


def test_plan_dict_carries_the_documented_fields() -> None:
    data = plan_to_dict(_full_plan())
    assert data["version"] == 1
    assert data["schedule"] == "gpipe"
    assert data["num_layers"] == 6
    assert data["stages"][1]["layers"] == [3, 6]
    assert data["stages"][1]["shard_fraction"] == [0.75, 0.25]
    assert data["stages"][1]["zero"] == "optimizer"
    assert data["stages"][1]["devices"] == ["odd", "odd"]
    assert data["routes"] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert data["achievable_efficiency"] == pytest.approx(204.8 / 300.0)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("none", Recompute.NONE),
        ("selective", Recompute.SELECTIVE),
        ("full", Recompute.FULL),
        (True, Recompute.FULL),  # older plans: whole blocks or nothing
        (False, Recompute.NONE),
    ],
)
def test_recompute_reads_every_mode_and_older_plans_booleans(
    written: object, read: Recompute
) -> None:
    data = plan_to_dict(_full_plan())
    data["stages"][0]["recompute"] = written
    plan = plan_from_dict(data, source="p.json")
    assert plan.stages[0].recompute is read
    if isinstance(written, str):
        assert plan_to_dict(plan)["stages"][0]["recompute"] == written


def test_a_bad_recompute_names_the_field_and_the_modes() -> None:
    data = plan_to_dict(_full_plan())
    data["stages"][0]["recompute"] = "partial"
    with pytest.raises(SpecError) as caught:
        plan_from_dict(data, source="p.json")
    message = str(caught.value)
    assert "recompute" in message and "partial" in message and "selective" in message
    assert "\n" not in message


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(_full_plan(), path)
    assert load_plan(path) == _full_plan()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left over


def test_load_plan_bad_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"version": 1, "stages": [', encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_plan(path)
    assert caught.value.source == str(path)
    assert str(path) in str(caught.value)


def test_load_plan_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(SpecError) as caught:
        load_plan(path)
    assert str(path) in str(caught.value)


def test_load_plan_without_stages_names_file_and_field(tmp_path: Path) -> None:
    data = plan_to_dict(_full_plan())
    del data["stages"]
    path = tmp_path / "no-stages.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_plan(path)
    assert caught.value.source == str(path)
    assert caught.value.field == "stages"
    assert str(path) in str(caught.value)


def test_load_plan_inconsistent_stage_names_file_and_field(tmp_path: Path) -> None:
    data = plan_to_dict(_full_plan())
    data["stages"][1]["shard_fraction"] = [0.75, 0.75]
    path = tmp_path / "bad-fractions.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_plan(path)
    assert caught.value.source == str(path)
    assert caught.value.field == "stages[1].shard_fraction"


def test_load_plan_wrong_version_names_the_field(tmp_path: Path) -> None:
    data = plan_to_dict(_full_plan())
    data["version"] = 99
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_plan(path)
    assert caught.value.field == "version"
    assert str(path) in str(caught.value)


def test_save_plan_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("precious\n", encoding="utf-8")
    with pytest.raises(OutputError, match="already exists"):
        save_plan(_full_plan(), path)
    assert path.read_text(encoding="utf-8") == "precious\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_save_plan_overwrites_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("precious\n", encoding="utf-8")
    save_plan(_full_plan(), path, overwrite=True)
    assert load_plan(path) == _full_plan()
