"""The communication of a tensor-parallel stage, as autograd functions over its tensor
group: Megatron-LM's column/row splits (Shoeybi et al. 2019, section 3), with or without
sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.2.2), as the stage's plan says (:class:`TensorGroup`:
``sequence`` layout, or ``blocks``; ``specs.tensor_layout``).

Without sequence parallelism (``blocks``) every member runs the norms and residual adds on
the whole sequence, ``[b, s, h]``:

* :func:`column_parallel_linears` (Megatron's ``f``): the layers read the input as it is;
  backward, the gradient of that input is the group's sum of the members' (each covers its
  slice of the heads or the width): one all-reduce.
* :func:`row_parallel_linear` (``g``): each member's product of its slice of the inner
  width is a partial sum of the output: one all-reduce, then the bias, which every member
  holds whole, added once. Backward: the gradient as it is.

With sequence parallelism (``sequence``), between the two tensor-parallel regions of a
block (and between blocks) a member holds only its chunk of the sequence, ``[b, s/t, h]``
(``distributed.sequence_chunks``): the norms and residual adds run on it, so their
activations are 1/t of the whole.

* :func:`column_parallel_linears` (Korthikanti's ``g``): all-gather the chunks into the
  whole sequence, then the column-parallel layers (Q, K, V; the MLP's gate and up) on it.
  Backward: the gradient of the whole input is the sum of the members', and each member
  needs only its chunk of it: a reduce-scatter. The function keeps the chunk, not the
  gathered input, for the weight gradients and gathers it again in the backward (section
  4.2.2: "we store only the sequence parallel part ... and perform an extra all-gather in
  the backward pass"), started before the input's gradient is computed so that the two
  overlap.
* :func:`row_parallel_linear` (``g``-bar): a reduce-scatter completes the partial sums and
  leaves each member its chunk, where the bias is added. Backward: an all-gather of the
  chunks' gradients (the row-parallel layer reads its whole input).
* :func:`enter_sequence_chunks` at a stage's first block: the whole input (the
  embedding's output, or the received activation, the same on every member) is cut to the
  member's chunk. Backward: an all-gather, so every member holds the whole input gradient
  (the embedding's, or the one the leader sends back).
* :func:`leave_sequence_chunks` after a stage's last block: an all-gather, so the final
  norm and head (or the send) see the whole sequence as without sequence parallelism.
  Backward: the member's chunk of the gradient, which is the same on every member (the
  head runs whole on each, and a received gradient is broadcast).
* :func:`sequence_parallel_norm` and the row-parallel bias: a weight every member holds
  whole but applies to its chunk only gets the gradient of that chunk; the function
  :func:`sum_gradients_over_group` (identity forward) all-reduces it in the backward, so
  every member's copy has the whole gradient, as without sequence parallelism, and the
  tensor group's leader, which owns the replicated weights (``distributed.group_layout``),
  steps the right one. It runs per use, inside autograd, rather than once per step before
  the data-parallel reduction as Megatron-LM does: ZeRO-2/3 stages reduce each layer's
  gradients as soon as its backward is done (``pipeline.layer_stream``), and a sum inside
  the backward is right for every ZeRO mode, recompute included.

Without sequence parallelism the chunk functions are the identity and the norms plain. With
no group (tensor-parallel degree 1) every function is the identity or the plain layer, so
a block that is not split computes exactly what it did before. Why these are hand-written
rather than DTensor's ``parallelize_module``: :mod:`piebald.runtime.models.tensor_parallel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from piebald.runtime.distributed.sequence_chunks import (
    gather_sequence,
    own_chunk,
    reduce_scatter_sequence,
    start_gather_sequence,
    start_reduce_scatter_sequence,
)
from piebald.runtime.models.norms import RMSNorm, rms_norm

__all__ = [
    "TensorGroup",
    "column_parallel_linears",
    "enter_sequence_chunks",
    "leave_sequence_chunks",
    "row_parallel_linear",
    "sequence_parallel_norm",
    "sum_gradients_over_group",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorGroup:
    """The tensor group a split block meets, and whether it runs sequence parallel (the
    stage's ``sequence`` layout) or not (``blocks``)."""

    process_group: dist.ProcessGroup = field(compare=False)
    sequence_parallel: bool


def _sequence_group(group: TensorGroup | None) -> dist.ProcessGroup | None:
    """The process group of a sequence-parallel ``group``; None without one."""
    return group.process_group if group is not None and group.sequence_parallel else None


def _all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    # A new tensor: autograd may still hold the input (and gloo reduces in place).
    out = tensor.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _EnterChunks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, whole: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return own_chunk(whole, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return gather_sequence(grad, ctx.group), None


class _LeaveChunks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, chunk: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return gather_sequence(chunk, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return own_chunk(grad, ctx.group), None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter_sequence(partial, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return gather_sequence(grad, ctx.group), None


class _SumGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: dist.ProcessGroup, *tensors: torch.Tensor) -> Any:
        ctx.group = group
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        # One all-reduce for all of them (a norm's weight and bias).
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=ctx.group)
        summed = torch.split(flat, [g.numel() for g in grads])
        return (None, *(s.view_as(g) for s, g in zip(summed, grads, strict=True)))


class _GatherColumns(torch.autograd.Function):
    """All-gather the chunk, then ``linear(whole, w_i, b_i)`` for each pair; keeps the
    chunk (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, chunk: torch.Tensor, group: dist.ProcessGroup, *weights_and_biases: Any
    ) -> Any:
        weights = weights_and_biases[0::2]
        biases = weights_and_biases[1::2]
        whole = gather_sequence(chunk, group)
        pairs = zip(weights, biases, strict=True)
        outputs = tuple(functional.linear(whole, w, b) for w, b in pairs)
        ctx.group = group
        ctx.has_bias = tuple(b is not None for b in biases)
        ctx.save_for_backward(chunk, *weights)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        chunk, *weights = ctx.saved_tensors
        gathering = start_gather_sequence(chunk, ctx.group)  # the extra all-gather
        grad_whole = grads[0] @ weights[0]  # [b, s, out] x [out, h] -> [b, s, h]
        for grad, weight in zip(grads[1:], weights[1:], strict=True):
            grad_whole = grad_whole + grad @ weight
        scattering = start_reduce_scatter_sequence(grad_whole, ctx.group)
        del grad_whole  # the reduce-scatter holds what it needs (peak memory)
        whole = gathering.wait().reshape(-1, chunk.shape[-1])  # [b * s, h]
        needs = ctx.needs_input_grad[2:]
        param_grads: list[torch.Tensor | None] = []
        for k, (grad, weight) in enumerate(zip(grads, weights, strict=True)):
            rows = grad.reshape(-1, weight.shape[0])  # [b * s, out]
            param_grads.append(rows.t() @ whole if needs[2 * k] else None)
            param_grads.append(rows.sum(0) if ctx.has_bias[k] and needs[2 * k + 1] else None)
        return (scattering.wait(), None, *param_grads)


def _apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    # torch declares Function.apply without types.
    return function.apply(*args)  # type: ignore[no-untyped-call]


def enter_sequence_chunks(x: torch.Tensor, group: TensorGroup | None) -> torch.Tensor:
    """A stage's whole input [b, s, h] -> this member's chunk [b, s/t, h] (backward: the
    group's chunks gathered); ``x`` itself without sequence parallelism."""
    process_group = _sequence_group(group)
    if process_group is None:
        return x
    out: torch.Tensor = _apply(_EnterChunks, x, process_group)
    return out


def leave_sequence_chunks(x: torch.Tensor, group: TensorGroup | None) -> torch.Tensor:
    """The members' chunks [b, s/t, h] -> the whole sequence [b, s, h] (backward: this
    member's chunk of the gradient); ``x`` itself without sequence parallelism."""
    process_group = _sequence_group(group)
    if process_group is None:
        return x
    out: torch.Tensor = _apply(_LeaveChunks, x, process_group)
    return out


def sum_gradients_over_group(
    tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, ...]:
    """``tensors`` as they are forward; backward, each one's gradient summed over the group
    (one all-reduce for all of them)."""
    if group is None:
        return tuple(tensors)
    out: tuple[torch.Tensor, ...] = _apply(_SumGradients, group, *tensors)
    return out


def column_parallel_linears(
    x: torch.Tensor, linears: Sequence[nn.Linear], group: TensorGroup | None
) -> tuple[torch.Tensor, ...]:
    """``linear(x)`` for each of ``linears``, column-parallel layers reading the same input,
    the outputs [b, s, out/t] covering the whole sequence: sequence parallel, ``x`` is this
    member's chunk [b, s/t, h]; else the whole [b, s, h]."""
    if group is None:
        return tuple(linear(x) for linear in linears)
    if not group.sequence_parallel:
        x = _apply(_CopyToGroup, x, group.process_group)
        return tuple(linear(x) for linear in linears)
    pairs = [tensor for linear in linears for tensor in (linear.weight, linear.bias)]
    out: tuple[torch.Tensor, ...] = _apply(_GatherColumns, x, group.process_group, *pairs)
    return out


def row_parallel_linear(
    x: torch.Tensor, linear: nn.Linear, group: TensorGroup | None
) -> torch.Tensor:
    """``linear(x)`` for a row-parallel layer holding columns of the full weight: the
    partial products [b, s, h] are summed over the group, onto each member's chunk
    [b, s/t, h] when sequence parallel, then the bias, which every member holds whole, is
    added once."""
    if group is None:
        whole: torch.Tensor = linear(x)
        return whole
    partial = functional.linear(x, linear.weight)
    if not group.sequence_parallel:
        summed: torch.Tensor = _apply(_ReduceFromGroup, partial, group.process_group)
        return summed if linear.bias is None else summed + linear.bias
    chunk: torch.Tensor = _apply(_ReduceScatter, partial, group.process_group)
    if linear.bias is None:
        return chunk
    # Added to the chunk only: the bias's gradient is the sum of every member's.
    (bias,) = sum_gradients_over_group((linear.bias,), group.process_group)
    return chunk + bias


def sequence_parallel_norm(
    norm: nn.Module, x: torch.Tensor, group: TensorGroup | None
) -> torch.Tensor:
    """``norm(x)`` (an RMSNorm or a LayerNorm); sequence parallel, on this member's chunk,
    its weight's (and bias's) gradient summed over the group."""
    process_group = _sequence_group(group)
    if process_group is None:
        out: torch.Tensor = norm(x)
        return out
    if isinstance(norm, RMSNorm):
        (weight,) = sum_gradients_over_group((norm.weight,), process_group)
        return rms_norm(x, weight, eps=norm.eps)
    if isinstance(norm, nn.LayerNorm):
        params = (norm.weight,) if norm.bias is None else (norm.weight, norm.bias)
        summed = sum_gradients_over_group(params, process_group)
        bias = summed[1] if len(summed) > 1 else None
        return functional.layer_norm(x, norm.normalized_shape, summed[0], bias, norm.eps)
    raise TypeError(f"no sequence-parallel form of {type(norm).__name__}")
