"""The dtype each rank computes in: the plan's precision where its GPU supports it (bf16,
else fp16 with a loss scaler, else fp32, as ``DeviceType.training_dtype`` decides), or fp32
everywhere for emulation and CPU runs, so they can be compared with the fp32 reference."""

from __future__ import annotations

import torch

from piebald.specs.devices import Dtype
from piebald.specs.plan import Plan

__all__ = ["TORCH_DTYPES", "needs_loss_scaler", "rank_dtypes"]

TORCH_DTYPES = {Dtype.BF16: torch.bfloat16, Dtype.FP16: torch.float16, Dtype.FP32: torch.float32}


def rank_dtypes(plan: Plan, *, fp32: bool) -> dict[int, torch.dtype]:
    """Compute dtype of every used rank (also the dtype it sends its activations in)."""
    if fp32:
        return dict.fromkeys(plan.used_ranks, torch.float32)
    return {
        rank: TORCH_DTYPES[plan.cluster.device_of(rank).training_dtype(plan.job.precision)]
        for rank in plan.used_ranks
    }


def needs_loss_scaler(dtypes: dict[int, torch.dtype]) -> bool:
    """fp16 anywhere: every used rank scales (the overflow verdict is global)."""
    return torch.float16 in dtypes.values()
