"""Layer ranges [a, b) as the planner prices them all at once: an (L+1) x (L+1) matrix
indexed [a, b], or its entries over the ranges that exist (a < b) in row-major order."""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

__all__ = [
    "Flags",
    "Matrix",
    "Positions",
    "Ranges",
    "range_positions",
    "read_only_ranges",
    "valid_ranges",
]

Matrix = npt.NDArray[np.float64]  # [a, b]: layers [a, b)
# One entry per layer range [a, b) with a < b, in row-major order of Matrix: the ranges
# that exist, about half of the matrix, which is all the pricing below works on.
Ranges = npt.NDArray[np.float64]
Positions = npt.NDArray[np.intp]
Flags = npt.NDArray[np.bool_]


@functools.cache
def range_positions(size: int) -> Positions:
    """[a, b] -> the position of range [a, b) in ``Ranges`` order (garbage where b <= a)."""
    positions = np.zeros((size, size), dtype=np.intp)
    positions[valid_ranges(size)] = np.arange(size * (size - 1) // 2)
    positions.setflags(write=False)
    return positions


@functools.cache
def valid_ranges(size: int) -> npt.NDArray[np.bool_]:
    """[a, b] -> a < b: where the ranges lie in a matrix (read-only)."""
    valid = np.arange(size)[:, None] < np.arange(size)[None, :]
    valid.setflags(write=False)
    return valid


def read_only_ranges(matrix: Matrix) -> Ranges:
    """The entries of ``matrix`` over the ranges that exist."""
    ranges: Ranges = matrix[valid_ranges(len(matrix))]
    ranges.setflags(write=False)
    return ranges
