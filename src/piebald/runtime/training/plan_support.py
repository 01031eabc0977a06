"""What the runtime cannot run yet, refused before anything starts: one line naming the
plan field or the flag, on every rank alike (the check reads only the plan and the
configuration), instead of a failure half way into a run.

Tensor-parallel stages (``Stage.tensor_parallel_degree`` > 1) run under ZeRO none and
ZeRO-1 only: ZeRO-2/3 streams every layer's gathers and reduce-scatters over the
data-parallel group inside each pass, beside the tensor group's sums, which is not built
yet. And sequence parallelism, always on at degree t > 1, cuts every sequence into t
equal chunks (``models.tensor_ops``): the job's ``seq_len`` must be a multiple of t.
"""

from __future__ import annotations

from piebald.errors import SpecError
from piebald.runtime.training.config import TrainConfig
from piebald.specs.plan import Plan

__all__ = ["check_runtime_supports"]


def check_runtime_supports(plan: Plan, config: TrainConfig) -> None:
    """Raise :class:`SpecError` for the first thing of ``plan`` this runtime cannot run
    with ``config`` (module docstring)."""
    for index, stage in enumerate(plan.stages):
        degree = stage.tensor_parallel_degree
        if degree == 1:
            continue
        where = f"stages[{index}]"
        if stage.zero.per_pass:
            raise SpecError(
                source="plan",
                field=f"{where}.zero",
                value=stage.zero.value,
                expected=f"'none' or 'optimizer' at tensor_parallel_degree {degree}: ZeRO-2/3 "
                "of tensor-parallel stages is not supported by the runtime yet",
            )
        seq_len = plan.job.seq_len
        if seq_len % degree:
            raise SpecError(
                source="plan",
                field=f"{where}.tensor_parallel_degree",
                value=degree,
                expected=f"a divisor of the job's seq_len ({seq_len}): sequence parallelism "
                "cuts each sequence into tensor_parallel_degree equal chunks",
            )
