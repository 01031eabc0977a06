"""Training under a plan: emulated on this machine's CPUs (``piebald train --emulate``), one
rank of a torchrun job (``piebald train --plan``), or the single-process reference every
plan must reproduce (``piebald train --model``).

Everything here imports torch, and only when called or first named: the functions import
the runtime inside, and the runtime's types (:class:`TrainConfig`, :class:`RunSummary`,
...) are loaded on first use by the module's ``__getattr__`` (PEP 562), so ``import
piebald.api`` stays torch-free.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from piebald.api.inputs import as_plan
from piebald.errors import ArgumentError
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

if TYPE_CHECKING:
    from pathlib import Path

    from piebald.runtime.distributed.optimizer import OptimizerConfig
    from piebald.runtime.models.hf_weights import check_hf_weights
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.lr_schedule import LrDecay, LrSchedule
    from piebald.runtime.training.metrics import RunSummary
    from piebald.runtime.training.precision import ComputeDtype
    from piebald.runtime.training.reduced import DEFAULT_MAX_EMULATED_PARAMS, emulated_model
    from piebald.runtime.training.tensorboard import MISSING_PACKAGE, tensorboard_available
    from piebald.runtime.training.torchrun import under_torchrun

__all__ = [
    "DEFAULT_MAX_EMULATED_PARAMS",
    "MISSING_PACKAGE",
    "ComputeDtype",
    "LrDecay",
    "LrSchedule",
    "OptimizerConfig",
    "RunSummary",
    "TrainConfig",
    "check_hf_weights",
    "emulate",
    "emulated_model",
    "tensorboard_available",
    "train",
    "train_reference",
    "under_torchrun",
]

# The runtime's names, each imported (with torch) on first use.
LAZY = {
    "ComputeDtype": "piebald.runtime.training.precision",
    "DEFAULT_MAX_EMULATED_PARAMS": "piebald.runtime.training.reduced",
    "LrDecay": "piebald.runtime.training.lr_schedule",
    "LrSchedule": "piebald.runtime.training.lr_schedule",
    "MISSING_PACKAGE": "piebald.runtime.training.tensorboard",
    "OptimizerConfig": "piebald.runtime.distributed.optimizer",
    "RunSummary": "piebald.runtime.training.metrics",
    "TrainConfig": "piebald.runtime.training.config",
    "check_hf_weights": "piebald.runtime.models.hf_weights",
    "emulated_model": "piebald.runtime.training.reduced",
    "tensorboard_available": "piebald.runtime.training.tensorboard",
    "under_torchrun": "piebald.runtime.training.torchrun",
}


def __getattr__(name: str) -> object:
    module = LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Not cached here: the runtime module stays the one place the name lives.
    return getattr(importlib.import_module(module), name)


PrintLine = Callable[[str], None]


def emulate(
    plan: Plan | str | Path,
    *,
    steps: int = 2,
    seed: int = 0,
    time_scale: float | None = None,
    max_params: int = 50_000_000,
    config: TrainConfig | None = None,
    lines_to_stderr: bool = False,
) -> RunSummary:
    """Train ``steps`` steps under ``plan`` (or the plan file at that path) on this
    machine, one CPU process per GPU of the plan's cluster (gloo over loopback), as
    ``piebald train --emulate`` does; models above ``max_params`` parameters train at
    reduced width. ``time_scale`` paces every operation to the emulated GPU's time (wall
    seconds per emulated second; None: as fast as this machine goes). ``config`` (a
    ``TrainConfig``) gives every other setting (data, checkpoints, optimizer...) and then
    replaces ``steps``, ``seed`` and ``time_scale``. Imports torch; the workers print one
    line per step on stdout (on stderr with ``lines_to_stderr``).

    >>> summary = emulate(load_plan("plan.json"), steps=2)  # doctest: +SKIP
    >>> summary.losses  # doctest: +SKIP
    """
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.emulate import emulate as emulate_plan

    if config is None:
        config = TrainConfig(steps=steps, seed=seed, time_scale=time_scale)
    return emulate_plan(
        as_plan(plan), config, max_params=max_params, lines_to_stderr=lines_to_stderr
    )


def train(
    plan: Plan | str | Path,
    *,
    steps: int = 10,
    seed: int = 0,
    device: str | None = None,
    config: TrainConfig | None = None,
    compute_dtype: ComputeDtype | None = None,
    print_line: PrintLine | None = None,
) -> RunSummary | None:
    """Train this rank under ``plan`` (or the plan file at that path), in a script that
    ``torchrun`` runs once per GPU of the plan's cluster (``piebald launch --plan`` prints
    those commands); the leader (rank 0) returns the run's summary, the other ranks None.
    ``device``: cpu or cuda (default: cuda if there is one); GPUs compute in the dtype the
    plan priced unless ``compute_dtype`` says otherwise (a CPU run: fp32). ``config`` (a
    ``TrainConfig``) gives every other setting and then replaces ``steps`` and ``seed``.
    ``print_line``: where the step lines go (default: stdout). Outside torchrun this is a
    RuntimeError: use :func:`emulate` to run the plan's cluster on this machine. Imports
    torch.

    >>> summary = train(load_plan("plan.json"), steps=100)  # doctest: +SKIP
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # before importing torch
        raise RuntimeError(
            "piebald.train runs one rank of a torchrun job (RANK and WORLD_SIZE are not "
            "set); start it with torchrun (see `piebald launch --plan`), or call "
            "piebald.emulate to run the plan's cluster on this machine"
        )
    if device not in (None, "cpu", "cuda"):
        raise ArgumentError(argument="device", value=device, expected="cpu or cuda")
    from piebald.runtime.training.config import TrainConfig
    from piebald.runtime.training.torchrun import train_rank

    return train_rank(
        as_plan(plan),
        config or TrainConfig(steps=steps, seed=seed),
        device=device,
        compute_dtype=compute_dtype,
        print_line=print_line,
    )


def train_reference(
    model: ModelSpec,
    job: JobSpec,
    config: TrainConfig,
    *,
    micro_batch_size: int | None = None,
    print_line: PrintLine | None = None,
) -> RunSummary:
    """Train ``model`` on ``job`` for ``config.steps`` steps in this one process, in fp32
    (``piebald train`` without a plan): the run every plan's training must reproduce.
    ``micro_batch_size``: rows per forward pass (memory only; the losses are the same).
    Imports torch.

    >>> summary = train_reference(model, job, TrainConfig(steps=2))  # doctest: +SKIP
    """
    from piebald.runtime.training.reference import train_reference as train_one

    return train_one(model, job, config, micro_batch_size=micro_batch_size, print_line=print_line)
