"""The tensor-parallel slice rule and how a checkpoint finds slices in whole-tensor
coordinates, against brute force: every member's indices are its slice of the whole's
indices, increasing, and together they tile the whole; joining the slices gives the whole
back; and a loading piece of any slice (or the whole) assembled from pieces saved under
any other slicing holds exactly the elements it should."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from piebald.runtime.distributed.checkpoint import _Matcher, _SavedPiece
from piebald.runtime.distributed.tensor_slice import TensorSlice, join_slices

# (whole shape, dim, chunks): column-parallel weight and bias, row-parallel weight,
# GPT-2's fused [q | k | v] weight and bias.
SPLITS = [
    ((8, 6), 0, 1),
    ((8,), 0, 1),
    ((6, 8), 1, 1),
    ((24, 4), 0, 3),
    ((24,), 0, 3),
]


@pytest.mark.parametrize(("shape", "dim", "chunks"), SPLITS)
@pytest.mark.parametrize("degree", [1, 2, 4])
def test_slices_tile_the_whole_in_order(
    shape: tuple[int, ...], dim: int, chunks: int, degree: int
) -> None:
    whole = torch.randn(shape)
    members = [
        TensorSlice(dim=dim, chunks=chunks, degree=degree, position=p) for p in range(degree)
    ]
    indices = [m.flat_indices(shape) for m in members]
    for member, found in zip(members, indices, strict=True):
        assert torch.equal(whole.reshape(-1)[found], member.of(whole).reshape(-1))
        assert bool((found[1:] > found[:-1]).all())  # increasing
        assert member.whole_shape(member.of(whole).shape) == shape
    assert sorted(torch.cat(indices).tolist()) == list(range(math.prod(shape)))
    joined = join_slices([m.of(whole) for m in members], dim=dim, chunks=chunks)
    assert torch.equal(joined, whole)


def test_only_other_members_of_one_split_are_known_disjoint() -> None:
    a = TensorSlice(dim=1, chunks=1, degree=2, position=0)
    assert a.disjoint_from(TensorSlice(dim=1, chunks=1, degree=2, position=1))
    assert not a.disjoint_from(a)
    assert not a.disjoint_from(TensorSlice(dim=1, chunks=1, degree=4, position=3))
    with pytest.raises(ValueError, match="position"):
        TensorSlice(dim=0, chunks=1, degree=2, position=2)


def _saved_pieces(
    whole: torch.Tensor, part: TensorSlice | None, *, cuts: int, rank: int
) -> tuple[list[_SavedPiece], torch.Tensor]:
    """``part``'s slice of ``whole`` (or the whole), flattened and cut in ``cuts`` uneven
    pieces stored back to front in one shard (so shard offsets differ from parameter
    offsets)."""
    flat = (part.of(whole) if part is not None else whole).reshape(-1)
    bounds = sorted({0, flat.numel(), *torch.randint(1, flat.numel(), (cuts,)).tolist()})
    pieces, stored, offset = [], [], 0
    for start, end in reversed(list(itertools.pairwise(bounds))):
        pieces.append(
            _SavedPiece(
                param_start=start,
                param_end=end,
                rank=rank,
                bucket="b",
                shard_offset=offset,
                part=part,
            )
        )
        stored.append(flat[start:end])
        offset += end - start
    return pieces, torch.cat(stored)


def _members(dim: int, chunks: int, degree: int) -> list[TensorSlice | None]:
    """Every member's slice, or the whole at degree 1."""
    if degree == 1:
        return [None]
    return [TensorSlice(dim=dim, chunks=chunks, degree=degree, position=p) for p in range(degree)]


@pytest.mark.parametrize(("shape", "dim", "chunks"), SPLITS)
@pytest.mark.parametrize(
    ("saved_degree", "loaded_degree"), [(2, 1), (1, 2), (2, 4), (4, 2), (2, 2)]
)
def test_a_piece_is_assembled_from_any_other_slicing(
    shape: tuple[int, ...], dim: int, chunks: int, saved_degree: int, loaded_degree: int
) -> None:
    torch.manual_seed(0)
    whole = torch.randn(shape)
    saved: list[tuple[_SavedPiece, torch.Tensor]] = []
    for rank, part in enumerate(_members(dim, chunks, saved_degree)):
        pieces, shard = _saved_pieces(whole, part, cuts=2, rank=rank)
        saved.extend((piece, shard) for piece in pieces)
    for mine in _members(dim, chunks, loaded_degree):
        expected = (mine.of(whole) if mine is not None else whole).reshape(-1)
        n = expected.numel()
        lo, hi = (1, n - 1) if n > 2 else (0, n)  # a range of the slice, not all of it
        matcher = _Matcher(lo=lo, hi=hi, mine=mine, whole_shape=shape)
        out = torch.full((hi - lo,), float("nan"))
        covered = 0
        for piece, shard in saved:
            found = matcher.match(piece)
            if found is not None:
                src, dst, count = found
                out[dst] = shard[src]
                covered += count
        assert covered == hi - lo
        assert torch.equal(out, expected[lo:hi])
