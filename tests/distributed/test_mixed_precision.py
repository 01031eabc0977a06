"""Mixed precision across GPU generations, run for real on CPU (``--compute-dtype native``):
a data-parallel group mixing bf16 and fp16 ranks (also as tensor groups, under ZeRO-1 and
ZeRO-3), and a tied embedding/head shared by a bf16 stage and an fp16 stage, train
``tiny`` for 20 steps to within 5% of the fp32 reference.

On GPUs these plans stopped at start-up (a group's buckets refused ranks of different
dtypes); emulation computed in fp32 everywhere, so no test could see it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from dist_harness import StageSpec, make_plan

from cli_runner import run_cli
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.metrics import RunSummary
from piebald.runtime.training.precision import ComputeDtype, rank_dtypes
from piebald.runtime.training.reference import train_reference
from piebald.specs.devices import Dtype
from piebald.specs.plan import Plan, ZeroMode
from piebald.specs.plan_io import load_plan

pytestmark = pytest.mark.distributed

STEPS = 20
NATIVE = TrainConfig(
    steps=STEPS,
    seed=1,
    optimizer=OptimizerConfig(lr=3e-3, max_grad_norm=1.0),
    compute_dtype=ComputeDtype.NATIVE,
)

MIXED_CLUSTER = """\
name: mixed
nodes:
  - {name: a, gpu: A100-80GB, gpus_per_node: 1, intra_link: 300GB/s,
     nic: {kind: infiniband, bandwidth: 100Gb/s}}
  - {name: v, gpu: V100-32GB, gpus_per_node: 1, intra_link: 300GB/s,
     nic: {kind: infiniband, bandwidth: 100Gb/s}}
  - {name: t, gpu: T4, gpus_per_node: 1, intra_link: 300GB/s,
     nic: {kind: infiniband, bandwidth: 100Gb/s}}
"""


def _cephalo_plan(tmp_path: Path) -> Plan:
    """``piebald plan --strategy cephalo`` on an A100, a V100 and a T4: one data-parallel
    stage whose ranks compute in bf16, fp16 and fp16."""
    cluster = tmp_path / "mixed.yaml"
    cluster.write_text(MIXED_CLUSTER)
    out = tmp_path / "plan.json"
    code, output = run_cli(
        "plan",
        "--cluster",
        str(cluster),
        "--model",
        "tiny",
        "--global-batch",
        "12",
        "--seq-len",
        "64",
        "--strategy",
        "cephalo",
        "--out",
        str(out),
    )
    assert code == 0, output
    return load_plan(out)


def _tied_across_dtypes(_: Path) -> Plan:
    """Embedding on an A100 (bf16), head on a V100 (fp16), the two tied."""
    return make_plan(
        [
            StageSpec(layer_end=3, ranks=(0,), num_micro_batches=(4,), fractions=(1.0,)),
            StageSpec(layer_end=6, ranks=(1,), num_micro_batches=(4,), fractions=(1.0,)),
        ],
        num_gpus=2,
        tied=True,
        gpu_types=("A100-80GB", "V100-32GB"),
    )


def _tensor_groups_across_dtypes(_: Path, zero: ZeroMode = ZeroMode.OPTIMIZER) -> Plan:
    """Two tensor groups of 2, one of A100s (bf16) and one of V100s (fp16), data-parallel
    over each other under ZeRO-1 (3:1 micro-batches) or ZeRO-3 (equal counts): each
    group's sums run in its own dtype, the shared gradients cross dtypes (and under ZeRO-3
    every gather, through an fp32 wire buffer, before a leader broadcasts the replicated
    weights in its own dtype)."""
    counts = (2, 2, 2, 2) if zero.per_pass else (2, 2, 1, 1)
    return make_plan(
        [
            StageSpec(
                layer_end=6,
                ranks=(0, 1, 2, 3),
                num_micro_batches=counts,
                fractions=(0.3, 0.3, 0.2, 0.2),
                zero=zero,
                tensor_parallel_degree=2,
            )
        ],
        num_gpus=4,
        tied=True,
        gpu_types=("A100-80GB", "A100-80GB", "V100-32GB", "V100-32GB"),
    )


PLANS: dict[str, Callable[[Path], Plan]] = {
    "one stage of bf16 + fp16 ranks (cephalo)": _cephalo_plan,
    "tied embedding/head on a bf16 and an fp16 stage": _tied_across_dtypes,
    "tensor groups of bf16 and of fp16 ranks": _tensor_groups_across_dtypes,
    "tensor groups of bf16 and of fp16 ranks, ZeRO-3": functools.partial(
        _tensor_groups_across_dtypes, zero=ZeroMode.FULL
    ),
}


def _run(plan: Plan, config: TrainConfig) -> RunSummary:
    return emulate(plan, config, max_params=10**9, lines_to_stderr=True)


@pytest.mark.parametrize("name", list(PLANS))
def test_mixed_dtypes_train_close_to_the_fp32_reference(name: str, tmp_path: Path) -> None:
    plan = PLANS[name](tmp_path)
    dtypes = rank_dtypes(plan, compute=ComputeDtype.NATIVE)
    if name.startswith("tied"):
        assert plan.model.arch.tie_embeddings and plan.num_stages == 2
        assert [dtypes[r] for s in plan.stages for r in s.ranks] == [Dtype.BF16, Dtype.FP16]
    else:
        assert plan.num_stages == 1
        assert {dtypes[r] for r in plan.stages[0].ranks} == {Dtype.BF16, Dtype.FP16}
    reference = train_reference(
        plan.model,
        plan.job,
        dataclasses.replace(NATIVE, compute_dtype=ComputeDtype.FP32),
        print_line=lambda _: None,
    )
    native = _run(plan, NATIVE)
    assert native.compute_dtype == "native" and len(native.losses) == STEPS
    assert all(math.isfinite(loss) for loss in native.losses)
    assert native.losses[-1] < native.losses[0] - 0.5  # it learns
    assert native.losses[-1] == pytest.approx(reference.losses[-1], rel=0.05)
    # 16-bit arithmetic really ran: the losses are close to fp32's, not equal to them.
    assert max(abs(a - b) for a, b in zip(native.losses, reference.losses, strict=True)) > 1e-5
