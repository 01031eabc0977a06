"""Memory of one rank: weights, gradients, optimizer state, activations, working buffers.

Bytes per parameter follow Megatron-LM's distributed-optimizer accounting (docs,
"Distributed Optimizer"): with 16-bit compute, 2 for weights, 4 for the fp32 gradient
accumulator, 12 for AdamW's fp32 master copy, m and v (4 for SGD's master copy); with fp32
compute, 4 + 4 + 8 (m, v; the weights are the master). ZeRO (Rajbhandari et al. 2020)
divides a state by the rank's shard fraction once it is sharded. Activations are the
model's per-token bytes (Korthikanti et al. 2022, see ``piebald.specs.model``) times the
tokens of every micro-batch the schedule keeps in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import Optimizer
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.plan import Schedule, ZeroMode

__all__ = ["MemoryBreakdown", "framework_reserve_bytes", "in_flight_micro_batches", "rank_memory"]

GIB = 2.0**30


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    working_bytes: float  # gathered parameters, gradient buckets, recompute, p2p buffers
    reserve_bytes: float  # CUDA context, allocator fragmentation

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.working_bytes
            + self.reserve_bytes
        )

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


def framework_reserve_bytes(device: DeviceType) -> float:
    """What the framework keeps beyond tensors: ~1 GiB of CUDA context and workspaces, plus
    ~5% of capacity lost to allocator fragmentation."""
    return 1.0 * GIB + 0.05 * device.memory_bytes


def bytes_per_param(*, dtype: Dtype, optimizer: Optimizer) -> tuple[float, float, float]:
    """(weights, gradient accumulator, optimizer state) bytes per parameter."""
    if dtype is Dtype.FP32:
        return 4.0, 4.0, 8.0 if optimizer is Optimizer.ADAMW else 0.0
    return 2.0, 4.0, 12.0 if optimizer is Optimizer.ADAMW else 4.0


def in_flight_micro_batches(
    *,
    schedule: Schedule,
    stage_index: int,
    num_stages: int,
    rank_micro_batches: int,
    stage_micro_batches: int,
) -> int:
    """Micro-batches whose activations a rank holds at its peak.

    GPipe keeps all of them. 1F1B keeps at most ``num_stages - stage_index`` per stage
    (Narayanan et al. 2021, PipeDream-Flush); a stage's ranks share those by their share of
    the stage's micro-batches.
    """
    if rank_micro_batches <= 0:
        return 0
    if schedule is Schedule.GPIPE:
        return rank_micro_batches
    depth = num_stages - stage_index
    share = math.ceil(depth * rank_micro_batches / stage_micro_batches)
    return max(1, min(rank_micro_batches, share))


def rank_memory(
    model: ModelSpec,
    *,
    layer_start: int,
    layer_end: int,
    device: DeviceType,
    dtype: Dtype,
    optimizer: Optimizer,
    zero: ZeroMode,
    shard_fraction: float,
    micro_batch_size: int,
    seq_len: int,
    num_in_flight: int,
    recompute: bool,
    num_neighbor_stages: int,
) -> MemoryBreakdown:
    """Peak memory of a rank holding layers [layer_start, layer_end) of ``model``."""
    layers = model.layers[layer_start:layer_end]
    params = float(model.stage_params(layer_start, layer_end))
    weight_b, grad_b, optim_b = bytes_per_param(dtype=dtype, optimizer=optimizer)
    weight_f = shard_fraction if zero is ZeroMode.FULL else 1.0
    grad_f = shard_fraction if zero in (ZeroMode.GRADIENTS, ZeroMode.FULL) else 1.0
    optim_f = 1.0 if zero is ZeroMode.NONE else shard_fraction
    largest_layer = max(layer.num_params + layer.num_tied_params for layer in layers)
    working = 0.0
    if zero in (ZeroMode.GRADIENTS, ZeroMode.FULL):
        working += largest_layer * grad_b  # one layer's full gradient before reduce-scatter
    if zero is ZeroMode.FULL:
        working += 2 * largest_layer * weight_b  # the gathered layer and the prefetched one

    tokens = micro_batch_size * seq_len
    scale = dtype.num_bytes / 2  # per-token figures assume 16-bit activations
    stored_per_token = sum(
        layer.recompute_activation_bytes_per_token
        if recompute
        else layer.activation_bytes_per_token
        for layer in layers
    )
    activations = num_in_flight * tokens * stored_per_token * scale
    if recompute and any(layer.kind is LayerKind.BLOCK for layer in layers):
        working += tokens * max(layer.activation_bytes_per_token for layer in layers) * scale
    # Send and receive buffers of activations and their gradients at each stage boundary.
    working += num_neighbor_stages * 2 * tokens * model.arch.hidden_size * dtype.num_bytes
    return MemoryBreakdown(
        weights_bytes=params * weight_b * weight_f,
        gradients_bytes=params * grad_b * grad_f,
        optimizer_bytes=params * optim_b * optim_f,
        activations_bytes=activations,
        working_bytes=working,
        reserve_bytes=framework_reserve_bytes(device),
    )
