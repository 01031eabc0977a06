"""When a searched value counts as better: by more than float noise.

Two structures that price alike up to rounding must not move a search (a local search
stepping between them forever, a depth scan reset by noise), so every comparison of the
planner's estimates goes through :func:`improves`.
"""

from __future__ import annotations

__all__ = ["IMPROVEMENT", "improves"]

IMPROVEMENT = 1e-9  # relative margin a new value must win by


def improves(new: float, old: float) -> bool:
    """Whether ``new`` is smaller than ``old`` by more than the relative IMPROVEMENT."""
    return new < old * (1 - IMPROVEMENT)
