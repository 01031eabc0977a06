"""token_loss_sum against the definition, token by token."""

from __future__ import annotations

import math

import pytest
import torch

from piebald.runtime.models import token_loss_sum


def test_token_loss_sum_is_the_sum_of_token_cross_entropies() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 5, (2, 3), generator=generator)
    expected = 0.0
    for b in range(2):
        for t in range(3):
            row = logits[b, t].tolist()
            log_norm = math.log(sum(math.exp(v) for v in row))
            expected += log_norm - row[int(labels[b, t])]
    got = token_loss_sum(logits.float(), labels)
    assert got.dtype == torch.float32 and got.shape == ()
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # Low-precision logits are reduced in fp32: the result is still fp32.
    assert token_loss_sum(logits.bfloat16(), labels).dtype == torch.float32
