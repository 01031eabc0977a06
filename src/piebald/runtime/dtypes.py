"""The torch dtype of each of piebald's training dtypes (one table for the whole runtime)."""

from __future__ import annotations

import torch

from piebald.specs.devices import Dtype

__all__ = ["TORCH_DTYPES", "torch_dtype"]

TORCH_DTYPES = {Dtype.BF16: torch.bfloat16, Dtype.FP16: torch.float16, Dtype.FP32: torch.float32}


def torch_dtype(dtype: Dtype) -> torch.dtype:
    return TORCH_DTYPES[dtype]
