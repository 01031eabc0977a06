"""One rank of a training run that ``torchrun`` started (``piebald train --plan`` under
``piebald launch``, ``piebald.train``): the device, the dtype, the process group, and
:func:`~piebald.runtime.training.rank_worker.run_rank` inside it. With ``config.elastic``
every (re)start plans for the live nodes and resumes from the newest checkpoint
(``elastic_rendezvous``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.elastic_rendezvous import train_elastic
from piebald.runtime.training.metrics import RunSummary
from piebald.runtime.training.plan_support import check_runtime_supports
from piebald.runtime.training.precision import ComputeDtype
from piebald.runtime.training.rank_worker import run_rank
from piebald.specs.plan import Plan

__all__ = ["train_rank", "under_torchrun"]


def under_torchrun() -> bool:
    """Whether torchrun (or another launcher) set this process's rank and world size."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def train_rank(
    plan: Plan,
    config: TrainConfig,
    *,
    device: str | None = None,
    compute_dtype: ComputeDtype | None = None,
    print_line: Callable[[str], None] | None = None,
) -> RunSummary | None:
    """Train this rank under ``plan``; the leader returns the run's summary, the other
    ranks None. ``device``: cpu or cuda (default: cuda if there is one). ``compute_dtype``
    default: GPUs compute what the plan priced (native), a CPU run fp32 (to compare
    exactly with the single-process reference)."""
    check_runtime_supports(plan)  # one line before any process group
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    config = replace(config, device=chosen)
    if compute_dtype is None:
        compute_dtype = ComputeDtype.NATIVE if chosen == "cuda" else ComputeDtype.FP32
    config = replace(config, compute_dtype=compute_dtype)
    backend = "nccl" if chosen == "cuda" else "gloo"
    if config.elastic:
        return train_elastic(plan, config, backend=backend, print_line=print_line)
    dist.init_process_group(backend, timeout=timedelta(seconds=config.timeout_s))
    try:
        result = run_rank(plan, config, print_line=print_line)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return result.summary
