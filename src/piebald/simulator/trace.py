"""A simulated step as a Chrome / Perfetto trace (the JSON "Trace Event Format").

One process per GPU, named ``rank 3 · A100-80GB · stage 1`` and sorted by stage, with three
threads: the compute stream, the data-parallel channel, and the transfers it sends. A pass
of a tensor-parallel stage (``tp 2, leader 4`` in the process name) is followed on the
compute thread by its tensor-parallel share ("tensor comm", ``tp F3``). Open
the file at https://ui.perfetto.dev or chrome://tracing. Times are in microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from piebald.outputs import write_atomic
from piebald.simulator.result import Lane, SimulationResult
from piebald.specs.plan import Plan

__all__ = ["chrome_trace", "write_trace"]

_LANES = tuple(Lane)


def chrome_trace(plan: Plan, result: SimulationResult) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for order, rank in enumerate(plan.used_ranks):  # stage by stage
        stage = plan.stage_of_rank[rank]
        device = plan.cluster.device_of(rank).name
        t = plan.stages[stage].tensor_parallel_degree
        group = f" · tp {t}, leader {plan.stages[stage].leader_of(rank)}" if t > 1 else ""
        name = f"rank {rank} · {device} · stage {stage}{group}"
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": name}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": order}}
        )
        for tid, lane in enumerate(_LANES):
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": rank,
                    "tid": tid,
                    "args": {"name": lane.value},
                }
            )
    for interval in result.intervals:
        events.append(
            {
                "name": interval.label,
                "cat": interval.kind,
                "ph": "X",
                "ts": interval.start_s * 1e6,
                "dur": (interval.end_s - interval.start_s) * 1e6,
                "pid": interval.rank,
                "tid": _LANES.index(interval.lane),
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": plan.model.name,
            "cluster": plan.cluster.name,
            "schedule": plan.schedule.value,
            "step_time_s": result.step_time_s,
            "bubble_fraction": result.bubble_fraction,
        },
    }


def write_trace(
    plan: Plan,
    result: SimulationResult,
    path: Path,
    *,
    overwrite: bool = False,
    flag: str = "--trace",
) -> None:
    """Write the trace JSON (``piebald.outputs``); an existing file is kept unless
    ``overwrite``, and even then only a regular file is replaced."""
    write_atomic(path, json.dumps(chrome_trace(plan, result)), flag=flag, force=overwrite)
