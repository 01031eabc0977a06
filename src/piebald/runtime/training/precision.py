"""The dtype each rank computes in, as ``piebald.cost.precision`` prices it (the policy and
why is written there; ``runtime.distributed.buckets`` applies its wire dtype).

``--compute-dtype native`` (what a GPU run does) gives every rank its GPU's training dtype
for the plan's precision: bf16, else fp16, else fp32. ``--compute-dtype fp32`` computes in
fp32 everywhere, so a run can be compared exactly with the fp32 single-process reference.
CPU tensors support bf16 and fp16, so emulation runs the native path for real.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from piebald.specs.devices import Dtype
from piebald.specs.plan import Plan

__all__ = ["ComputeDtype", "needs_loss_scaler", "rank_dtypes"]


class ComputeDtype(StrEnum):
    NATIVE = "native"  # each rank in its GPU's training dtype (what the plan priced)
    FP32 = "fp32"  # every rank in fp32 (exact comparison with the reference)


def rank_dtypes(plan: Plan, *, compute: ComputeDtype) -> dict[int, Dtype]:
    """Compute dtype of every used rank (also the dtype it sends its activations in)."""
    if compute is ComputeDtype.FP32:
        return dict.fromkeys(plan.used_ranks, Dtype.FP32)
    return {
        rank: plan.cluster.device_of(rank).training_dtype(plan.job.precision)
        for rank in plan.used_ranks
    }


def needs_loss_scaler(dtypes: Mapping[int, Dtype]) -> bool:
    """fp16 anywhere: every used rank scales (the overflow verdict is global)."""
    return Dtype.FP16 in dtypes.values()
