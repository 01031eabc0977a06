"""What the runtime cannot run yet, refused before anything starts: one line naming the
plan field or the flag, on every rank alike (the check reads only the plan and the
configuration), instead of a failure half way into a run.

Tensor-parallel stages (``Stage.tensor_parallel_degree`` > 1) run under every ZeRO mode,
but their checkpoints are not built yet: a checkpoint stores each owner's shard under the
parameter's global name, and the members of a tensor group hold different slices under
one name (the saved model, ``--save-model``, is gathered whole and works).
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
        if config.checkpoint_dir is not None or config.resume or config.resume_from is not None:
            raise SpecError(
                source="piebald train",
                field="--checkpoint-dir",
                value=str(config.checkpoint_dir or config.resume_from),
                expected=f"no checkpoints for a plan with tensor-parallel stages ({where} has "
                f"tensor_parallel_degree {degree}): tensor-parallel checkpoints are not "
                "supported yet",
            )
