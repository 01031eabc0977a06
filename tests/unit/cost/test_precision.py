"""The precision policy's wire dtype, and that the cost model prices it: a data-parallel
group whose ranks compute in bf16 and fp16 moves fp32 (twice the bytes of a bf16 group)."""

from __future__ import annotations

import pytest

from cluster_builders import cluster, group
from piebald.cost.plan_estimate import estimate_plan
from piebald.cost.precision import group_wire_dtype, wire_dtype_of_devices
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.job import JobSpec
from piebald.specs.plan import Plan, Stage, ZeroMode
from piebald.specs.presets import load_model


def test_common_dtype_else_fp32() -> None:
    assert group_wire_dtype([Dtype.BF16, Dtype.BF16]) is Dtype.BF16
    assert group_wire_dtype([Dtype.FP16]) is Dtype.FP16
    assert group_wire_dtype([Dtype.BF16, Dtype.FP16]) is Dtype.FP32
    assert group_wire_dtype([Dtype.FP16, Dtype.FP32]) is Dtype.FP32
    with pytest.raises(ValueError, match="at least one"):
        group_wire_dtype([])


def test_devices_wire_dtype_follows_their_training_dtypes() -> None:
    catalog = builtin_catalog()
    a100, v100 = catalog["A100-80GB"], catalog["V100-32GB"]
    assert wire_dtype_of_devices([a100, a100], precision=Dtype.BF16) is Dtype.BF16
    assert wire_dtype_of_devices([v100, v100], precision=Dtype.BF16) is Dtype.FP16
    assert wire_dtype_of_devices([a100, v100], precision=Dtype.BF16) is Dtype.FP32
    assert wire_dtype_of_devices([a100, v100], precision=Dtype.FP16) is Dtype.FP16


def _one_stage_plan(second_gpu: str) -> Plan:
    nic = ("ethernet", "1Gb/s")  # slow, so the sync is large next to the latency
    spec = cluster("pair", group("a", "A100-80GB", 1, nic=nic), group("b", second_gpu, 1, nic=nic))
    model = load_model("gpt2")
    return Plan(
        cluster=spec,
        model=model,
        job=JobSpec(global_batch_size=8, seq_len=256),
        stages=(
            Stage(
                layer_start=0,
                layer_end=model.num_layers,
                ranks=(0, 1),
                micro_batch_size=(1, 1),
                num_micro_batches=(4, 4),
                shard_fraction=(0.5, 0.5),
                zero=ZeroMode.OPTIMIZER,
            ),
        ),
        routes=tuple((j % 2,) for j in range(8)),
    )


def test_a_mixed_dtype_group_syncs_twice_the_bytes() -> None:
    same = estimate_plan(_one_stage_plan("A100-40GB")).stages[0].sync_s
    mixed = estimate_plan(_one_stage_plan("V100-32GB")).stages[0].sync_s
    assert mixed == pytest.approx(2 * same, rel=0.01)
