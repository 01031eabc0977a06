"""RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4).

y = x / sqrt(mean(x^2) + eps) * g. The statistics are taken in fp32 whatever the activation
dtype and the result is cast back before the scale, exactly as Hugging Face's LlamaRMSNorm,
so loaded Llama weights give the same numbers.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RMSNorm", "rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """``RMSNorm`` with a given ``weight`` (``models.tensor_ops`` passes one whose gradient
    it sums over a tensor group)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, *, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., h] -> [..., h]
        return rms_norm(x, self.weight, eps=self.eps)
