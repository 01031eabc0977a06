"""Which rows of the global batch each micro-batch takes.

Micro-batch j takes the next ``plan.micro_batch_sizes()[j]`` rows, in route order. The split
depends on the plan, the batch does not (docs/design.md section 3): every plan sums the same per-row
losses, so every plan computes the same loss and gradients as one process would.
"""

from __future__ import annotations

from itertools import accumulate

from piebald.specs.plan import Plan

__all__ = ["micro_batch_rows"]


def micro_batch_rows(plan: Plan) -> tuple[range, ...]:
    """Row ranges of the global batch, one per micro-batch, covering it exactly once."""
    sizes = plan.micro_batch_sizes()
    ends = list(accumulate(sizes))
    return tuple(range(end - size, end) for size, end in zip(sizes, ends, strict=True))
