"""The two communication operations of Megatron-LM tensor parallelism (Shoeybi et al. 2019,
section 3, figure 3), as autograd functions over a tensor group's process group:

* ``f`` (:func:`copy_to_tensor_group`): identity forward, all-reduce backward. It sits
  before the column-parallel layers, whose input every member reads whole: each member's
  gradient of that input covers only its slice of the heads (or MLP width), and their sum
  is the input's gradient.
* ``g`` (:func:`reduce_from_tensor_group`): all-reduce forward, identity backward. It sits
  after the row-parallel layers, each of which makes a partial sum of the output from its
  slice of the inner width.

With no process group (tensor-parallel degree 1) both are the identity and
:func:`row_parallel_linear` is the plain ``nn.Linear`` call, so a block that is not split
computes exactly what it did before. Why these are hand-written rather than DTensor's
``parallelize_module``: :mod:`piebald.runtime.models.tensor_parallel`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

__all__ = ["copy_to_tensor_group", "reduce_from_tensor_group", "row_parallel_linear"]


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


def copy_to_tensor_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Megatron's ``f``: ``x`` forward, the group's sum of the gradients backward."""
    if group is None:
        return x
    # torch declares Function.apply without types.
    out: torch.Tensor = _CopyToGroup.apply(x, group)  # type: ignore[no-untyped-call]
    return out


def reduce_from_tensor_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Megatron's ``g``: the group's sum of ``x`` forward, the gradient as it is backward."""
    if group is None:
        return x
    out: torch.Tensor = _ReduceFromGroup.apply(x, group)  # type: ignore[no-untyped-call]
    return out


def row_parallel_linear(
    x: torch.Tensor, linear: nn.Linear, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """``linear(x)`` for a row-parallel layer holding columns of the full weight: the
    partial products are summed over the group (``g``), then the bias, which every member
    holds whole, is added once."""
    if group is None:
        out: torch.Tensor = linear(x)
        return out
    summed = reduce_from_tensor_group(functional.linear(x, linear.weight), group)
    return summed if linear.bias is None else summed + linear.bias
