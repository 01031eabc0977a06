"""Where a run starts: fresh, or from which checkpoint, after checking that the checkpoint
belongs to this run.

Called once per run by the process holding the checkpoint directory's lock
(``checkpoint_lock``), before any rank builds anything, so every check here is one line
and no race: the emulator's parent, or the leader rank under ``torchrun``.

What "belongs to this run" means: the same seed (the batches of every step are drawn from
(seed, step), so another seed is another run) and the same model architecture (the plan's
model, whatever its name). Another *plan* of that model is fine: checkpoints hold named
slices of flat tensors and reshard on load. Another learning-rate schedule or job (batch,
sequence length) is allowed with a warning.

Resuming from an older checkpoint than the newest (``resume_from``) starts a new line of
history: the newer checkpoints of the directory are renamed ``superseded-step-*``, kept
for the user but never picked up by a later ``--resume``, which would otherwise continue
the abandoned line after a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.runtime.distributed.checkpoint import (
    CheckpointInfo,
    checkpoint_step,
    find_latest_checkpoint,
    list_checkpoints,
    read_checkpoint_info,
    verify_checkpoint,
)
from piebald.runtime.training.config import TrainConfig
from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan
from piebald.specs.presets import model_to_dict

__all__ = [
    "SUPERSEDED_PREFIX",
    "checkpoint_extra",
    "free_name",
    "model_sha256",
    "resolve_resume",
    "warn_if_schedule_changed",
]

logger = logging.getLogger(__name__)

SUPERSEDED_PREFIX = "superseded-"
_SOURCE = "piebald train"


def model_sha256(model: ModelSpec) -> str:
    """SHA-256 of the model's architecture numbers (not its name: a config.json renamed is
    the same model)."""
    arch = {key: value for key, value in model_to_dict(model).items() if key != "name"}
    return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()


def checkpoint_extra(config: TrainConfig, *, plan: Plan) -> dict[str, Any]:
    """What every checkpoint of a run records about the run (``extra`` of its manifest)."""
    return {
        "seed": config.seed,
        "plan_model": plan.model.name,
        "model_sha256": model_sha256(plan.model),
        "job": {"global_batch_size": plan.job.global_batch_size, "seq_len": plan.job.seq_len},
        "lr": config.optimizer.lr,
        "lr_schedule": config.lr_schedule.as_dict(),
    }


def resolve_resume(config: TrainConfig, *, plan: Plan) -> Path | None:
    """The checkpoint this run resumes from, or None for a fresh run; the caller holds the
    lock on ``config.checkpoint_dir``. Raises a one-line :class:`SpecError` for a checkpoint
    that is corrupt, of another run, or already at ``config.steps``, and FileExistsError for
    a fresh run into a directory that holds checkpoints."""
    directory = config.checkpoint_dir
    if directory is None:
        if config.resume or config.resume_from is not None:
            raise SpecError(
                source=_SOURCE,
                field="--resume",
                value=True,
                expected="a --checkpoint-dir holding the checkpoints to resume from",
            )
        return None
    if checkpoint_step(directory) is not None and (directory / "manifest.json").is_file():
        raise SpecError(
            source=_SOURCE,
            field="--checkpoint-dir",
            value=str(directory),
            expected="the directory holding the step-* checkpoints, not one of them (to "
            f"continue from this one: --checkpoint-dir {directory.parent} "
            f"--resume-from {directory})",
        )
    latest = find_latest_checkpoint(directory)
    if config.resume_from is not None:
        chosen = _locate(config.resume_from, directory=directory)
    elif config.resume:
        if latest is None:
            raise SpecError(
                source=str(directory),
                field="--resume",
                value=True,
                expected="a directory holding a complete checkpoint (step-NNNNNNNN) to resume from",
            )
        chosen = latest
    else:
        if latest is not None:
            raise FileExistsError(
                f"{directory}: already holds checkpoint {latest.name}; pass --resume to "
                "continue that run, or choose another --checkpoint-dir (nothing was "
                "overwritten)"
            )
        return None
    info = read_checkpoint_info(chosen)
    _check_same_run(info, config=config, plan=plan)
    if info.step >= config.steps:
        raise SpecError(
            source=_SOURCE,
            field="--steps",
            value=config.steps,
            expected=f"more than {info.step}: {info.path} is already at step {info.step} "
            "(--steps is the step to train up to)",
        )
    _set_newer_aside(info, directory=directory, latest=latest)
    _warn_if_settings_changed(info.extra, config=config, plan=plan, checkpoint=info.path)
    return info.path


def _locate(resume_from: Path, *, directory: Path) -> Path:
    """``resume_from`` as given, or the checkpoint of that name in ``directory``."""
    chosen = resume_from
    if not chosen.exists() and (directory / resume_from).exists():
        chosen = directory / resume_from
    if not (chosen / "manifest.json").is_file():
        raise SpecError(
            source=_SOURCE,
            field="--resume-from",
            value=str(resume_from),
            expected="a checkpoint (a step-NNNNNNNN directory with manifest.json)"
            + (", here or in --checkpoint-dir" if not chosen.exists() else ""),
        )
    return chosen


def _check_same_run(info: CheckpointInfo, *, config: TrainConfig, plan: Plan) -> None:
    saved = info.extra
    if "seed" not in saved or "model_sha256" not in saved:
        raise SpecError(
            source=str(info.path),
            field="extra",
            value=sorted(saved),
            expected="a checkpoint written by piebald train (it records the seed and model)",
        )
    if saved["seed"] != config.seed:
        raise SpecError(
            source=_SOURCE,
            field="--seed",
            value=config.seed,
            expected=f"{saved['seed']}, the seed {info.path} was trained with (the seed "
            "draws every step's batch: another seed is another run, in another "
            "--checkpoint-dir)",
        )
    if saved["model_sha256"] != model_sha256(plan.model):
        named = saved.get("plan_model")
        same_name = named == plan.model.name
        note = " (another architecture under the same name)" if same_name else ""
        raise SpecError(
            source=_SOURCE,
            field="--plan",
            value=f"a plan of {plan.model.name}",
            expected=f"a plan of the model {info.path} was trained with: {named}{note}",
        )


def _set_newer_aside(info: CheckpointInfo, *, directory: Path, latest: Path | None) -> None:
    """Rename the checkpoints newer than ``info`` in ``directory`` (resuming from an older
    one); refuse to mix a checkpoint of elsewhere into a directory holding others."""
    if info.path.parent.resolve() != directory.resolve():
        if latest is not None:
            raise FileExistsError(
                f"{directory}: already holds checkpoint {latest.name}; a run resumed from "
                f"{info.path} would mix two runs: choose an empty --checkpoint-dir"
            )
        return
    newer = [p for p in list_checkpoints(directory) if (checkpoint_step(p) or 0) > info.step]
    if not newer:
        return
    verify_checkpoint(info.path)  # every byte, before anything is renamed for its sake
    for path in newer:
        aside = free_name(directory, f"{SUPERSEDED_PREFIX}{path.name}")
        path.rename(aside)
        logger.warning(
            "resuming from %s: the newer checkpoint %s is renamed %s (kept, but a later "
            "--resume will not continue it)",
            info.path.name,
            path.name,
            aside.name,
        )


def free_name(directory: Path, name: str) -> Path:
    """``directory / name``, or ``name.2``, ``name.3``... there, the first that is free."""
    candidate, number = directory / name, 1
    while candidate.exists():
        number += 1
        candidate = directory / f"{name}.{number}"
    return candidate


def _warn_if_settings_changed(
    saved: Mapping[str, Any], *, config: TrainConfig, plan: Plan, checkpoint: Path
) -> None:
    """Another schedule or job than the checkpoint's is allowed, but said."""
    warn_if_schedule_changed(saved, config=config, checkpoint=checkpoint)
    job = checkpoint_extra(config, plan=plan)["job"]
    if "job" in saved and saved["job"] != job:
        logger.warning(
            "%s was trained with %s; this plan's job is %s", checkpoint, saved["job"], job
        )


def warn_if_schedule_changed(
    saved: Mapping[str, Any], *, config: TrainConfig, checkpoint: Path
) -> None:
    """The schedule is a function of the step and of this run's settings, so a resumed
    run continues it exactly when the settings are the same; different ones (a longer
    --steps with the default --decay-steps, say) are allowed, but said."""
    now = {"lr": config.optimizer.lr, "lr_schedule": config.lr_schedule.as_dict()}
    then = {key: saved.get(key) for key in now}
    if "lr_schedule" in saved and then != now:
        logger.warning(
            "%s was trained with learning rate %s and schedule %s; this run continues with "
            "%s and %s (pass the same --lr, --warmup-steps, --lr-decay, --decay-steps and "
            "--min-lr to continue the schedule unchanged)",
            checkpoint,
            then["lr"],
            then["lr_schedule"],
            now["lr"],
            now["lr_schedule"],
        )
