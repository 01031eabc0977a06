"""The per-micro-batch loss term: a sum of token cross-entropies.

The runtime divides by the number of tokens in the whole global batch (docs/design.md section 3), so
summing these terms over micro-batches and ranks gives the mean loss of one process training
on the whole batch, and every gradient reduction stays a plain sum.
"""

from __future__ import annotations

import torch
from torch.nn import functional

__all__ = ["token_loss_sum"]


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """sum over tokens t of -log softmax(logits_t)[labels_t], in fp32.

    logits [b, s, V] (any float dtype), labels [b, s] int64 -> scalar fp32.
    """
    vocab_size = logits.shape[-1]
    return functional.cross_entropy(
        logits.reshape(-1, vocab_size).float(), labels.reshape(-1), reduction="sum"
    )
