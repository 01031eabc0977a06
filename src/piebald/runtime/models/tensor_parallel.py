"""Split a stage part's blocks over a tensor group, Megatron-LM style (Shoeybi et al. 2019),
and put the slices back together for export.

In every block: Q, K, V and the MLP's gate/up (GPT-2: the fused ``c_attn``, ``c_fc``) are
column-parallel, each member keeping its rows of the weight (its 1/t of the query heads,
of the key/value heads, of the MLP width) and of the bias; the attention output and the
MLP down projection are row-parallel, each member keeping its columns of the weight and
the whole bias, added once after the sum (``tensor_ops.row_parallel_linear``). Norms are
replicated. The stage's tensor layout (``specs.tensor_layout``) says where they run:
``sequence``, between the two split regions of a block each member runs them (and the
residual adds) on its chunk of the sequence only (sequence parallelism); ``blocks``, every
member on the whole sequence (``tensor_ops``; the blocks, their attention and MLP and the
part carry the group as ``tensor_group``). The other layouts, which split the embedding
and head, are not run (``training.plan_support`` refuses them before anything starts).
The embedding and the LM head are replicated: every member of the group holds them
whole and computes them on the same micro-batches (simple; a vocabulary-parallel
embedding and head would save their memory and time and are not done). Which elements a
member keeps is one rule, ``distributed.tensor_slice``, which export (joining slices
whole) and checkpoints (finding them in the whole tensor) follow too.

Every member builds the whole part from the same seeded initialisation as single-process
training (``models.init``, and any ``--init-from`` weights) and then keeps its slices, so
a tensor-parallel run starts from exactly the reference's weights.

Why by hand and not with DTensor (``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel``): the runtime's ZeRO buckets (``distributed.flat_bucket``) make every
parameter a view into one flat buffer by assigning ``param.data``, and checkpoints and
exports copy parameters into plain tensors. Tried on torch 2.13 with two gloo ranks: on a
DTensor parameter, ``param.data = flat[a:b].view(local_shape)`` is accepted but leaves a
DTensor whose global shape became the local one and whose local tensor does not share the
flat buffer (an optimizer step on the buffer would never reach the weights), and
``FlatBucket`` fails at once copying the DTensor into its fp32 buffer ("aten.copy_.default
got mixed torch.Tensor and DTensor"). Plain sliced parameters plus the small autograd
functions of ``tensor_ops`` need none of that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from piebald.runtime.distributed.tensor_slice import TensorSlice, join_slices
from piebald.runtime.models.gpt2 import MLP, CausalSelfAttention, GPT2Block
from piebald.runtime.models.llama import Attention, FeedForward, LlamaBlock
from piebald.runtime.models.stage_part import StagePart
from piebald.runtime.models.tensor_ops import TensorGroup
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["SplitParameter", "TensorSplit", "split_stage_part", "whole_weights"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitParameter:
    """How a member's slice of a parameter sits in the whole: along ``dim``, in ``chunks``
    equal runs (3 for GPT-2's fused [q | k | v], else 1), member p holding the p-th
    1/t of every run."""

    dim: int
    chunks: int = 1

    def member(self, *, degree: int, position: int) -> TensorSlice:
        """What member ``position`` of ``degree`` holds (``distributed.tensor_slice``)."""
        return TensorSlice(dim=self.dim, chunks=self.chunks, degree=degree, position=position)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSplit:
    """A member's share of its tensor group's stage part."""

    degree: int  # members of the group; 1: nothing split
    position: int  # this member's place in the group (0: the leader)
    # The position of each rank of ``group``, in the group's (sorted) rank order.
    positions: tuple[int, ...]
    group: dist.ProcessGroup | None = field(compare=False)
    params: Mapping[str, SplitParameter]  # the split parameters, by name in the part

    @property
    def slices(self) -> dict[str, TensorSlice]:
        """This member's slice of every split parameter, by name in the part (the global
        name: split parameters are block weights, never a tied replica)."""
        return {
            name: how.member(degree=self.degree, position=self.position)
            for name, how in self.params.items()
        }


def _keep(
    linear: nn.Linear, *, dim: int, chunks: int, degree: int, position: int, bias: bool
) -> dict[str, SplitParameter]:
    """Replace ``linear``'s weight (and bias, when ``bias``) by the member's slice."""
    split = SplitParameter(dim=dim, chunks=chunks)
    bias_split = SplitParameter(dim=0, chunks=chunks)
    with torch.no_grad():
        weight = split.member(degree=degree, position=position).of(linear.weight)
        linear.weight = nn.Parameter(weight.clone())
        kept = {"weight": split}
        if bias and linear.bias is not None:
            kept_bias = bias_split.member(degree=degree, position=position).of(linear.bias)
            linear.bias = nn.Parameter(kept_bias.clone())
            kept["bias"] = bias_split
    linear.out_features, linear.in_features = linear.weight.shape
    return kept


def _column(
    linear: nn.Linear, degree: int, position: int, chunks: int = 1
) -> dict[str, SplitParameter]:
    return _keep(linear, dim=0, chunks=chunks, degree=degree, position=position, bias=True)


def _row(linear: nn.Linear, degree: int, position: int) -> dict[str, SplitParameter]:
    return _keep(linear, dim=1, chunks=1, degree=degree, position=position, bias=False)


def _split_module(
    module: nn.Module, degree: int, position: int, group: TensorGroup
) -> dict[str, dict[str, SplitParameter]] | None:
    """The split of one attention or MLP module, by its linear layers' names (None: a
    module that is not split)."""
    if isinstance(module, Attention | FeedForward | CausalSelfAttention | MLP):
        module.tensor_group = group
    if isinstance(module, LlamaBlock | GPT2Block):
        module.tensor_group = group  # sequence parallel, its norms run on chunks
    if isinstance(module, Attention):
        module.num_heads //= degree
        module.num_kv_heads //= degree
        return {
            "wq": _column(module.wq, degree, position),
            "wk": _column(module.wk, degree, position),
            "wv": _column(module.wv, degree, position),
            "wo": _row(module.wo, degree, position),
        }
    if isinstance(module, FeedForward):
        return {
            "w1": _column(module.w1, degree, position),
            "w3": _column(module.w3, degree, position),
            "w2": _row(module.w2, degree, position),
        }
    if isinstance(module, CausalSelfAttention):
        module.num_heads //= degree
        return {
            "c_attn": _column(module.c_attn, degree, position, chunks=3),
            "c_proj": _row(module.c_proj, degree, position),
        }
    if isinstance(module, MLP):
        return {
            "c_fc": _column(module.c_fc, degree, position),
            "c_proj": _row(module.c_proj, degree, position),
        }
    return None


def split_stage_part(
    part: StagePart,
    *,
    degree: int,
    position: int,
    positions: tuple[int, ...] = (0,),
    group: dist.ProcessGroup | None = None,
    layout: TensorLayout = TensorLayout.BLOCKS,
) -> TensorSplit:
    """Keep member ``position``'s slices of every block of ``part`` (in place) and route
    the blocks' collectives through ``group``, sequence parallel where ``layout`` is
    ``sequence`` (``positions``: see :class:`TensorSplit`). Degree 1 changes nothing."""
    if degree == 1:
        return TensorSplit(degree=1, position=0, positions=(0,), group=None, params={})
    if group is None or sorted(positions) != list(range(degree)):
        raise ValueError(f"tensor-parallel degree {degree} needs the tensor group's process group")
    if layout.splits_vocabulary:
        raise ValueError(f"tensor layout {layout.value!r}: the embedding and head are not split")
    tensor_group = TensorGroup(process_group=group, sequence_parallel=layout.splits_sequence)
    part.tensor_group = tensor_group  # sequence parallel: the cut and gather at its ends
    split: dict[str, SplitParameter] = {}
    for name, module in part.named_modules():
        layers = _split_module(module, degree, position, tensor_group)
        if layers is None:
            continue
        for linear, params in layers.items():
            for param, how in params.items():
                split[f"{name}.{linear}.{param}"] = how
    names = {name for name, _ in part.named_parameters()}
    assert set(split) <= names, sorted(set(split) - names)
    return TensorSplit(
        degree=degree, position=position, positions=positions, group=group, params=split
    )


def _gather(
    local: torch.Tensor, how: SplitParameter, split: TensorSplit, device: torch.device
) -> torch.Tensor:
    """The whole parameter from every member's slice (collective over the group, on
    ``device``: NCCL gathers GPU tensors only), where ``local`` is."""
    piece = local.to(device).contiguous()
    gathered = [torch.empty_like(piece) for _ in split.positions]
    dist.all_gather(gathered, piece, group=split.group)
    by_position = [gathered[split.positions.index(p)] for p in range(split.degree)]
    return join_slices(by_position, dim=how.dim, chunks=how.chunks).to(local.device)


def whole_weights(
    weights: Mapping[str, torch.Tensor], split: TensorSplit, *, device: torch.device
) -> dict[str, torch.Tensor]:
    """``weights`` (by name in the part) with every split parameter gathered whole:
    collective over the tensor group (on ``device``, the group's) when anything is split,
    every member passing the same names in the same order."""
    return {
        name: (_gather(value, split.params[name], split, device) if name in split.params else value)
        for name, value in weights.items()
    }
