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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from piebald.api.arguments import check_bool, check_callable, check_finite, check_int
from piebald.api.inputs import as_plan, check_job
from piebald.errors import ArgumentError
from piebald.outputs import (
    OutputError,
    check_appendable_file,
    check_new_directory,
    check_output_directory,
    check_output_file,
)
from piebald.specs.job import JobSpec
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

if TYPE_CHECKING:
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
    "check_config",
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


def check_config(
    config: TrainConfig, *, flags: Mapping[str, str] | None = None, restarted: bool = False
) -> None:
    """Refuse, before anything is spawned or trained, a run that could not keep its results:
    every place it will write can be written and nothing of the user's is in the way (an
    existing ``metrics_path`` unless ``resume``, a ``save_model_path`` that exists or
    cannot be created, a ``checkpoint_dir`` or ``tensorboard_dir`` that is not a writable
    directory), TensorBoard is installed where asked for, ``resume`` has a
    ``checkpoint_dir``, and ``eval_every`` has an ``eval_data_path``.

    A refusal is an ArgumentError naming the field (``config.metrics_path``); ``flags``
    maps a field to the name the caller knows it by instead (the CLI's ``--metrics``), and
    then an output refusal is the ``OutputError`` naming it. ``restarted``: this process
    may be a restart of the run (an elastic rank under torchrun, started again with the
    same arguments), so its metrics file may exist, as on ``resume``. :func:`emulate`,
    :func:`train` and :func:`train_reference` call this first."""

    def name(field: str) -> str:
        return flags.get(field, field) if flags is not None else f"config.{field}"

    def refuse(field: str, value: object, expected: str) -> ArgumentError:
        return ArgumentError(argument=name(field), value=value, expected=expected)

    if config.tensorboard_dir is not None:
        from piebald.runtime.training.tensorboard import MISSING_PACKAGE, tensorboard_available

        if not tensorboard_available():
            raise refuse("tensorboard_dir", str(config.tensorboard_dir), MISSING_PACKAGE)
    if config.resume and config.checkpoint_dir is None and config.resume_from is None:
        raise refuse(
            "resume", True, f"a {name('checkpoint_dir')} holding the checkpoints to resume from"
        )
    try:
        _check_outputs(config, name, restarted=restarted)
    except OutputError as error:
        if flags is not None:
            raise
        raise ArgumentError(
            argument=error.source, value=error.value, expected=error.expected
        ) from None
    if config.elastic and config.checkpoint_dir is None and config.resume_from is None:
        raise refuse("elastic", True, f"a {name('checkpoint_dir')}: an elastic run resumes from it")
    if config.fallback_dir is not None and not config.elastic:
        raise refuse("fallback_dir", str(config.fallback_dir), f"{name('elastic')} with it")
    if config.membership_path is not None and not config.elastic:
        raise refuse("membership_path", str(config.membership_path), f"{name('elastic')} with it")
    if config.eval_data_path is None and config.eval_every:
        raise refuse(
            "eval_every", config.eval_every, f"an {name('eval_data_path')} file to evaluate on"
        )


def _check_outputs(
    config: TrainConfig, name: Callable[[str], str], *, restarted: bool = False
) -> None:
    if config.metrics_path is not None:
        if config.resume or restarted:  # a resumed run appends to its metrics
            check_appendable_file(config.metrics_path, flag=name("metrics_path"))
        else:
            check_output_file(
                config.metrics_path,
                flag=name("metrics_path"),
                hint=f"choose another {name('metrics_path')} file, or pass {name('resume')} "
                "to continue its run",
            )
    if config.tensorboard_dir is not None:
        check_output_directory(config.tensorboard_dir, flag=name("tensorboard_dir"))
    checkpoint_dir = config.checkpoint_dir
    if checkpoint_dir is None and config.resume_from is not None:
        checkpoint_dir = config.resume_from.parent  # where a resumed run's checkpoints go
    if checkpoint_dir is not None:
        check_output_directory(checkpoint_dir, flag=name("checkpoint_dir"))
    if config.save_model_path is not None:
        check_new_directory(config.save_model_path, flag=name("save_model_path"))


def _config(config: object, *, restarted: bool = False, **defaults: object) -> TrainConfig:
    """``config`` checked (a TrainConfig or None: then one of ``defaults``), with its
    outputs checked (:func:`check_config`)."""
    from piebald.runtime.training.config import TrainConfig

    if config is None:
        config = TrainConfig(**defaults)  # type: ignore[arg-type]  # checked by TrainConfig
    if not isinstance(config, TrainConfig):
        raise ArgumentError(
            argument="config",
            value=config,
            expected="a TrainConfig (piebald.TrainConfig(steps=...)) or None",
        )
    check_config(config, restarted=restarted)
    return config


def emulate(
    plan: Plan | str | Path,
    *,
    steps: int = 2,
    seed: int = 0,
    time_scale: float | None = None,
    max_params: int = 50_000_000,
    config: TrainConfig | None = None,
    lines_to_stderr: bool = False,
    source: str | None = None,
) -> RunSummary:
    """Train ``steps`` steps under ``plan`` (or the plan file at that path) on this
    machine, one CPU process per GPU of the plan's cluster (gloo over loopback), as
    ``piebald train --emulate`` does; models above ``max_params`` parameters train at
    reduced width. ``time_scale`` paces every operation to the emulated GPU's time (wall
    seconds per emulated second; None: as fast as this machine goes). ``config`` (a
    ``TrainConfig``) gives every other setting (data, checkpoints, optimizer...) and then
    replaces ``steps``, ``seed`` and ``time_scale``. Imports torch; the workers print one
    line per step on stdout (on stderr with ``lines_to_stderr``). ``source`` is what a
    refusal of the plan names it by (default: the plan file's path when given one).

    Before any work, as ``piebald train --emulate`` does: a bad argument is an
    ArgumentError naming it (``max_params`` >= 1), a plan that no longer fits its
    cluster's memory a SpecError, and an output the run could not write or would
    overwrite (:func:`check_config`) an ArgumentError naming the config field.

    >>> summary = emulate(load_plan("plan.json"), steps=2)  # doctest: +SKIP
    >>> summary.losses  # doctest: +SKIP
    """
    check_int("steps", steps)
    check_int("seed", seed, minimum=0)
    check_finite("time_scale", time_scale, positive=True, optional=True)
    check_int("max_params", max_params)
    check_bool("lines_to_stderr", lines_to_stderr)
    if source is not None and not isinstance(source, str):
        raise ArgumentError(argument="source", value=type(source).__name__, expected="a str")
    chosen = as_plan(plan)  # before torch: a plan that no longer fits is refused at once
    named = source if source is not None else "plan" if isinstance(plan, Plan) else str(plan)
    checked = _config(config, steps=steps, seed=seed, time_scale=time_scale)
    from piebald.runtime.training.emulate import emulate as emulate_plan

    return emulate_plan(
        chosen, checked, max_params=max_params, lines_to_stderr=lines_to_stderr, source=named
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
    ``print_line``: where the step lines go (default: stdout). The arguments, the plan and
    the config's outputs are checked before training, as :func:`emulate` checks them
    (:func:`train_reference` too). Outside torchrun this is a
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
    check_int("steps", steps)
    check_int("seed", seed, minimum=0)
    check_callable("print_line", print_line)
    chosen = as_plan(plan)
    # An elastic rank is started again, with the same arguments, after every change.
    restarted = getattr(config, "elastic", False) is True
    checked = _config(config, restarted=restarted, steps=steps, seed=seed)
    from piebald.runtime.training.torchrun import train_rank

    return train_rank(
        chosen,
        checked,
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
    if not isinstance(model, ModelSpec):
        raise ArgumentError(
            argument="model",
            value=model,
            expected="a ModelSpec (piebald.load_model(...))",
        )
    check_job(job)
    check_int("micro_batch_size", micro_batch_size, optional=True)
    check_callable("print_line", print_line)
    if config is None:
        raise ArgumentError(argument="config", value=None, expected="a TrainConfig")
    checked = _config(config)
    from piebald.runtime.training.reference import train_reference as train_one

    return train_one(model, job, checked, micro_batch_size=micro_batch_size, print_line=print_line)
