"""One-line descriptions of a plan's structure, for runner-ups, comparisons and logs."""

from __future__ import annotations

from collections import Counter

from piebald.specs.plan import Plan
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

__all__ = ["describe_plan"]


def describe_plan(plan: Plan) -> str:
    """``"2 stages: layers 0-8 on 2x A100-80GB (zero optimizer) | layers 9-17 on ..."``; a
    tensor-parallel stage says ``tp 2 x 4 groups``, and its layout where it is not the
    runtime's (``tp 8 x 8 groups sequence``)."""
    parts = []
    for stage in plan.stages:
        types = Counter(plan.cluster.device_of(rank).name for rank in stage.ranks)
        gpus = " + ".join(f"{count}x {name}" for name, count in types.items())
        sizes = sorted(set(stage.micro_batch_size))
        extras = [f"zero {stage.zero.value}"]
        t = stage.tensor_parallel_degree
        if t > 1:
            layout = "" if stage.tensor_layout is TensorLayout.BLOCKS else f" {stage.tensor_layout}"
            extras.insert(0, f"tp {t} x {len(stage.tensor_groups)} groups{layout}")
        if stage.recompute is Recompute.FULL:
            extras.append("recompute")
        elif stage.recompute is Recompute.SELECTIVE:
            extras.append("selective recompute")
        extras.append("mbs " + "/".join(str(s) for s in sizes))
        parts.append(
            f"layers {stage.layer_start}-{stage.layer_end - 1} on {gpus} ({', '.join(extras)})"
        )
    idle = f"; {len(plan.idle_ranks)} GPUs idle" if plan.idle_ranks else ""
    count = len(plan.stages)
    return f"{count} stage{'s' if count > 1 else ''}: " + " | ".join(parts) + idle
