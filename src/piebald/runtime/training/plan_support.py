"""What the runtime cannot run yet, refused before anything starts (``emulate`` and
``torchrun.train_rank`` check before any process or process group): one line naming the
plan field, instead of a failure half way into a run.

Tensor-parallel stages (``Stage.tensor_parallel_degree`` > 1) run under every ZeRO mode
in the two layouts that leave the embedding and head whole (``specs.tensor_layout``):
``sequence`` (sequence parallel, what the planner makes) and ``blocks``
(``models.tensor_ops``). The vocabulary layouts are in the plan format to price other
systems' runs. Sequence parallelism cuts every sequence into t equal chunks, so the
job's ``seq_len`` must be a multiple of t.
"""

from __future__ import annotations

from piebald.errors import SpecError
from piebald.specs.plan import Plan

__all__ = ["check_runtime_supports"]


def check_runtime_supports(plan: Plan) -> None:
    """Raise :class:`SpecError` for the first thing of ``plan`` this runtime cannot run
    (module docstring)."""
    for index, stage in enumerate(plan.stages):
        degree = stage.tensor_parallel_degree
        if degree == 1:
            continue
        where = f"stages[{index}]"
        layout = stage.tensor_layout
        if layout.splits_vocabulary:
            raise SpecError(
                source="plan",
                field=f"{where}.tensor_layout",
                value=layout.value,
                expected="'sequence' or 'blocks': the runtime does not split the embedding "
                "and head over the vocabulary (re-plan with piebald, which makes 'sequence')",
            )
        seq_len = plan.job.seq_len
        if layout.splits_sequence and seq_len % degree:
            raise SpecError(
                source="plan",
                field=f"{where}.tensor_parallel_degree",
                value=degree,
                expected=f"a divisor of the job's seq_len ({seq_len}): sequence parallelism "
                "cuts each sequence into tensor_parallel_degree equal chunks",
            )
