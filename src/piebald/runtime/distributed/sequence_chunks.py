"""A micro-batch's hidden states cut along the sequence into a tensor group's chunks, and
put back together: the collectives of Megatron sequence parallelism (Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.2.2),
without autograd (``models.tensor_ops`` wraps them).

Tensors are laid out ``[b, s, ...]`` (batch first, as the models run them). The member of
group rank r holds positions ``[r * s/t, (r + 1) * s/t)`` of every row: chunks follow the
group's rank order, which is the order ``all_gather_single`` concatenates in, not the
member's tensor-parallel position (which slice of the weights it holds); the two need not
agree, every member only has to know its own chunk. ``s`` must divide by t
(``runtime.training.plan_support`` refuses a plan whose sequence length does not).

Both collectives are torch 2.13's equal-size ``all_gather_single`` and
``reduce_scatter_single`` (the names that replaced ``all_gather_into_tensor`` and
``reduce_scatter_tensor``): checked on gloo with two ranks in fp32, bf16 and fp16 (the
uneven sizes refused there, docs/research/torch_distributed.md section 3, never occur:
the chunks are equal), and gloo's reduce-scatter leaves its input as it was. Gloo takes
flat buffers only (a stacked ``[t, ...]`` output fails its shape check), and both ops cut
along dim 0, so the sequence moves to the front around them: ``[b, s, h]`` becomes
``[t, b, s/t, h]``, a copy unless b == 1.

Each collective can start in the background (``async_op``), so that the backward of a
column-parallel layer overlaps its gathering of the input with its first matmul
(``models.tensor_ops``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "PendingChunks",
    "chunk_length",
    "gather_sequence",
    "own_chunk",
    "reduce_scatter_sequence",
    "start_gather_sequence",
    "start_reduce_scatter_sequence",
]


def chunk_length(seq_len: int, group: dist.ProcessGroup) -> int:
    """Positions per member: ``seq_len`` / the group's size, which must divide it."""
    degree = dist.get_world_size(group)
    if seq_len % degree:
        raise ValueError(
            f"sequence of {seq_len} positions over a tensor group of {degree}: sequence "
            "parallelism needs the sequence length to be a multiple of the degree"
        )
    return seq_len // degree


def own_chunk(whole: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """This member's chunk of ``whole`` ([b, s, ...] -> [b, s/t, ...]), a copy: a view
    would keep the whole tensor's storage alive as long as the chunk."""
    length = chunk_length(whole.shape[1], group)
    return whole.narrow(1, dist.get_rank(group) * length, length).clone()


class PendingChunks:
    """A collective of this module under way: :meth:`wait` (once) returns its result and
    lets go of every buffer, so that none outlives it in the caller's frame."""

    def __init__(
        self, work: dist.Work | None, *, source: torch.Tensor, buffer: torch.Tensor, gathered: bool
    ) -> None:
        self._work = work
        self._source: torch.Tensor | None = source  # the input, alive until the work is done
        # [t, b, c, ...] to put back as [b, t * c, ...] (a gather), or the [b, c, ...] chunk
        # (a reduce-scatter).
        self._buffer: torch.Tensor | None = buffer
        self._gathered = gathered

    def wait(self) -> torch.Tensor:
        buffer = self._buffer
        assert buffer is not None, "waited twice"
        if self._work is not None:
            self._work.wait()
        self._work, self._source, self._buffer = None, None, None
        if not self._gathered:
            return buffer
        degree, b, c, *rest = buffer.shape
        return buffer.transpose(0, 1).reshape(b, degree * c, *rest)


def start_gather_sequence(chunk: torch.Tensor, group: dist.ProcessGroup) -> PendingChunks:
    """Start gathering every member's ``chunk`` ([b, c, ...]) into the whole sequence."""
    degree = dist.get_world_size(group)
    piece = chunk.contiguous()
    out = piece.new_empty((degree, *piece.shape))
    work = dist.all_gather_single(out.view(-1), piece.view(-1), group=group, async_op=True)
    return PendingChunks(work, source=piece, buffer=out, gathered=True)


def gather_sequence(chunk: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The whole sequence [b, s, ...] from every member's chunk [b, s/t, ...]."""
    return start_gather_sequence(chunk, group).wait()


def start_reduce_scatter_sequence(whole: torch.Tensor, group: dist.ProcessGroup) -> PendingChunks:
    """Start summing ``whole`` ([b, s, ...]) over the group, each member keeping only its
    chunk of the sum."""
    degree = dist.get_world_size(group)
    b, s, *rest = whole.shape
    length = chunk_length(s, group)
    # [t, b, c, ...]: member r's chunk of every row, contiguous in the flat input.
    stacked = whole.reshape(b, degree, length, *rest).transpose(0, 1).contiguous()
    out = whole.new_empty((b, length, *rest))
    work = dist.reduce_scatter_single(out.view(-1), stacked.view(-1), group=group, async_op=True)
    return PendingChunks(work, source=stacked, buffer=out, gathered=False)


def reduce_scatter_sequence(whole: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """This member's chunk [b, s/t, ...] of the group's sum of ``whole`` [b, s, ...]."""
    return start_reduce_scatter_sequence(whole, group).wait()
