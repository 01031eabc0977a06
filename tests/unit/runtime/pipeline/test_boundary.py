"""Activations crossing into an fp16 rank: finite values beyond fp16's range are clamped to
its largest finite value and counted; everything else is a plain cast."""

from __future__ import annotations

import torch

from piebald.runtime.pipeline.boundary import FP16_MAX, to_compute_dtype


def test_bf16_values_beyond_fp16_range_are_clamped_and_counted() -> None:
    values = torch.tensor([1.0, -7e4, 1e5, 6e4, float("inf"), float("nan")])
    cast, clamped = to_compute_dtype(values.to(torch.bfloat16), torch.float16, clamp=True)
    assert clamped == 2  # -7e4 and 1e5; 6e4 fits, inf and nan are not finite
    assert cast.dtype == torch.float16
    assert cast[1].item() == -FP16_MAX and cast[2].item() == FP16_MAX
    assert (
        cast[0].item() == 1.0
        and abs(cast[3].item() - 6e4) < 300
        and cast[4].item() == float("inf")
        and cast[5].isnan()
    )
    # A plain cast would have made them inf: that is what the clamp prevents.
    assert torch.isinf(values.to(torch.bfloat16).to(torch.float16)[1:3]).all()


def test_gradients_and_widening_casts_are_not_clamped() -> None:
    big = torch.tensor([1e5], dtype=torch.float32)
    cast, clamped = to_compute_dtype(big, torch.float16, clamp=False)
    assert clamped == 0 and cast.isinf().all()  # the loss scaler's overflow signal
    cast, clamped = to_compute_dtype(big.half(), torch.bfloat16, clamp=True)
    assert clamped == 0 and cast.dtype == torch.bfloat16
