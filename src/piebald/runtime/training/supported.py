"""What the runtime cannot execute yet, refused before any process starts.

The plan format, the cost model, the simulator and the planner know tensor-parallel
stages (``Stage.tensor_parallel_degree``); the runtime's model split, tensor groups and
leader-to-member broadcasts are not built yet. Training such a plan would run its followers
idle and its leaders on whole blocks, which is not what the plan priced, so it is refused
with one line instead.
"""

from __future__ import annotations

from piebald.errors import SpecError
from piebald.specs.plan import Plan

__all__ = ["check_runtime_supports"]


def check_runtime_supports(plan: Plan) -> None:
    """Raise :class:`SpecError` naming the first stage the runtime cannot execute."""
    for index, stage in enumerate(plan.stages):
        if stage.tensor_parallel_degree > 1:
            raise SpecError(
                source="plan",
                field=f"stages[{index}].tensor_parallel_degree",
                value=stage.tensor_parallel_degree,
                expected="1 to train: the runtime does not execute tensor parallelism yet "
                "(plan with --tensor-parallel 1)",
            )
