"""What the runtime cannot run yet, refused before anything starts (``emulate`` and
``torchrun.train_rank`` check before any process or process group): one line naming the
plan field, instead of a failure half way into a run.

Tensor-parallel stages (``Stage.tensor_parallel_degree`` > 1) run under every ZeRO mode
and split their blocks only (``TensorLayout.BLOCKS``: embedding, head and norms
replicated; the other layouts are in the plan format to price other systems' runs). The
blocks run sequence parallel between their split regions (``models.tensor_ops``), which
cuts every sequence into t equal chunks: the job's ``seq_len`` must be a multiple of t.
"""

from __future__ import annotations

from piebald.errors import SpecError
from piebald.specs.plan import Plan
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["check_runtime_supports"]


def check_runtime_supports(plan: Plan) -> None:
    """Raise :class:`SpecError` for the first thing of ``plan`` this runtime cannot run
    (module docstring)."""
    for index, stage in enumerate(plan.stages):
        degree = stage.tensor_parallel_degree
        if degree == 1:
            continue
        where = f"stages[{index}]"
        if stage.tensor_layout is not TensorLayout.BLOCKS:
            raise SpecError(
                source="plan",
                field=f"{where}.tensor_layout",
                value=stage.tensor_layout.value,
                expected=f"'{TensorLayout.BLOCKS.value}': the runtime splits blocks only (the "
                "embedding, head and norms are replicated on every member of a tensor group)",
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
