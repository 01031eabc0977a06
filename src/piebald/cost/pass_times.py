"""Prefix sums of per-layer pass times, cached, so a stage's time is two lookups.

The planner prices thousands of (stage, layer range) pairs; summing layer times each time
would dominate planning. For one model and one ``PassShape`` (device, dtype, micro-batch
size, sequence length, recompute) the forward and backward times of layers [a, b) are
``prefix[b] - prefix[a]``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from piebald.cost.compute import (
    DEFAULT_CURVE,
    EfficiencyCurve,
    layer_backward_time_s,
    layer_forward_time_s,
)
from piebald.cost.pass_shape import PassShape
from piebald.specs.model import ModelSpec

__all__ = ["PassTimes", "pass_times"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTimes:
    forward_prefix_s: npt.NDArray[np.float64]  # length num_layers + 1, starts at 0
    backward_prefix_s: npt.NDArray[np.float64]

    def forward_s(self, start: int, end: int) -> float:
        return float(self.forward_prefix_s[end] - self.forward_prefix_s[start])

    def backward_s(self, start: int, end: int) -> float:
        return float(self.backward_prefix_s[end] - self.backward_prefix_s[start])

    def pass_s(self, start: int, end: int) -> float:
        """Forward plus backward of one micro-batch through layers [start, end)."""
        return self.forward_s(start, end) + self.backward_s(start, end)

    @property
    def total_prefix_s(self) -> npt.NDArray[np.float64]:
        return self.forward_prefix_s + self.backward_prefix_s


@functools.lru_cache(maxsize=4096)
def pass_times(
    model: ModelSpec, *, shape: PassShape, curve: EfficiencyCurve = DEFAULT_CURVE
) -> PassTimes:
    """Prefix sums of forward and backward times of ``model``'s layers, one micro-batch of
    ``shape`` each: compute only, on one rank of a tensor group at degree > 1 (its
    collectives are ``cost.tensor_comm``'s)."""
    # Blocks are identical: price each distinct layer once.
    forward_of: dict[object, float] = {}
    backward_of: dict[object, float] = {}
    forward = np.zeros(model.num_layers + 1)
    backward = np.zeros(model.num_layers + 1)
    for layer in shape.layers(model):
        key = (layer.kind, layer.num_params, layer.matmul_flops_per_token)
        if key not in forward_of:
            forward_of[key] = layer_forward_time_s(layer, shape=shape, curve=curve)
            backward_of[key] = layer_backward_time_s(layer, shape=shape, curve=curve)
        forward[layer.index + 1] = forward_of[key]
        backward[layer.index + 1] = backward_of[key]
    return PassTimes(forward_prefix_s=np.cumsum(forward), backward_prefix_s=np.cumsum(backward))
