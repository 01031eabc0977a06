"""Rotary position embeddings (Su et al. 2021, RoFormer): the cos/sin tables and their
application to queries and keys, with the frequency scalings of specs/rope_scaling.py.

The frequencies are computed in fp32 on the CPU with the same operations, in the same order,
as transformers' RoPE initialisers (``modeling_rope_utils``), so that a model loaded from a
Hugging Face checkpoint rotates by exactly the same angles; the formulas are cited below.
"""

from __future__ import annotations

import math

import torch

from piebald.specs.rope_scaling import RopeScaling, RopeType

__all__ = ["Rope", "apply_rope", "inverse_frequencies", "rope_tables"]

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each [s, d], fp32


def inverse_frequencies(
    *, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """The d/2 rotary frequencies (radians per position), fp32 on the CPU.

    Unscaled, frequency i is theta^(-2i/d) (RoFormer eq. 15).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim  # [d/2]
    base = 1.0 / theta**exponents
    if scaling is None:
        return base
    if scaling.rope_type is RopeType.LINEAR:
        return base / scaling.factor  # positions / factor (Chen et al. 2023, eq. 4)
    if scaling.rope_type is RopeType.LLAMA3:
        return _llama3(base, scaling)
    return _yarn(theta**exponents, scaling, theta=theta, head_dim=head_dim)


def _llama3(base: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's banded scaling: wavelengths above original / low_freq_factor divided by
    factor, below original / high_freq_factor kept, and in between interpolated linearly in
    original / wavelength."""
    original = scaling.original_max_position_embeddings
    low, high, factor = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
    wavelength = 2 * math.pi / base
    long_waves = torch.where(wavelength > original / low, base / factor, base)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * long_waves / factor + smooth * long_waves
    medium = ~(wavelength < original / high) * ~(wavelength > original / low)
    return torch.where(medium, smoothed, long_waves)


def _yarn(
    powers: torch.Tensor, scaling: RopeScaling, *, theta: float, head_dim: int
) -> torch.Tensor:
    """YaRN's NTK-by-parts (Peng et al. 2023, eqs. 17-20). ``powers`` are theta^(2i/d).

    Dimension i turns original / wavelength_i times over the original context; the
    correction range is where that count falls between beta_slow and beta_fast (solved for
    i: d ln(L / (2 pi beta)) / (2 ln theta)). Below the range the frequency is kept
    (extrapolated), above it divided by factor (interpolated), linearly mixed within it.
    """
    original = scaling.original_max_position_embeddings

    def dimension(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the share of the original (extrapolated) frequency
    return (1.0 / (scaling.factor * powers)) * (1 - keep) + (1.0 / powers) * keep


def rope_tables(
    *,
    seq_len: int,
    head_dim: int,
    theta: float,
    device: torch.device,
    scaling: RopeScaling | None = None,
) -> Rope:
    """cos and sin of the rotary angles (RoFormer eq. 34), rotate-half layout, times the
    scaling's cos/sin factor (YaRN's attention factor; 1 otherwise).

    Position m turns pair i by m * frequency_i. The two halves of the head dimension form
    the pairs (dimension j with j + d/2), as in Hugging Face's Llama, instead of the
    interleaved pairs of the paper.
    """
    inv_freq = inverse_frequencies(head_dim=head_dim, theta=theta, scaling=scaling).to(device)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)  # [s]
    angles = torch.outer(positions, inv_freq)  # [s, d/2]
    angles = torch.cat((angles, angles), dim=-1)  # [s, d]
    scale = 1.0 if scaling is None else scaling.cos_sin_scale
    return angles.cos() * scale, angles.sin() * scale


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate queries or keys x [b, heads, s, d] by their positions."""
    cos, sin = (table.to(x.dtype) for table in rope)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [b, heads, s, d]
    return x * cos + rotated * sin
