"""Values crossing between ranks that compute in different dtypes (the policy and its price:
``piebald.cost.precision``).

An activation from a bf16 or fp32 rank may exceed fp16's largest finite value (65504); cast
as it is it would become inf on an fp16 rank and poison every later layer, step after
step, which no loss scale can fix (activations are not scaled). The receiver therefore
clamps finite values beyond fp16's range to +-65504 and counts them, so the run says how
often it happened. Non-finite values pass unchanged, and gradients are never clamped: they
carry the global loss scale, and their overflow is the loss scaler's signal to back off.
"""

from __future__ import annotations

import torch

__all__ = ["FP16_MAX", "to_compute_dtype"]

FP16_MAX = torch.finfo(torch.float16).max


def to_compute_dtype(
    tensor: torch.Tensor, dtype: torch.dtype, *, clamp: bool
) -> tuple[torch.Tensor, int]:
    """``tensor`` in ``dtype``, and how many of its values were clamped to fp16's range
    (only when ``clamp`` and narrowing a wider dtype to fp16)."""
    if not clamp or dtype != torch.float16 or tensor.dtype == torch.float16:
        return tensor.to(dtype), 0
    beyond = (tensor.abs() > FP16_MAX) & torch.isfinite(tensor)
    count = int(beyond.sum().item())
    cast = tensor.to(dtype)
    if count:  # the limit written in fp16 itself (bf16 cannot hold 65504: it rounds up)
        cast = torch.where(beyond, tensor.sign().to(dtype) * FP16_MAX, cast)
    return cast, count
