"""Resume refuses a checkpoint that is not this run's or not what its directory says
(reliability findings 10, 11, 24, 29, 30), in one line that names the newest intact older
checkpoint, and can go back to a named older checkpoint. Single process: the checkpoints
are saved from a one-rank optimizer with the extras ``piebald train`` records."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from dist_harness import StageSpec, build_params, make_plan

from piebald.errors import SpecError
from piebald.runtime.distributed.checkpoint import (
    find_latest_checkpoint,
    read_checkpoint_info,
    save_checkpoint,
)
from piebald.runtime.distributed.flat_bucket import FlatBucket
from piebald.runtime.distributed.group_layout import BucketPlacement
from piebald.runtime.distributed.groups import single_rank_group
from piebald.runtime.distributed.optimizer import OptimizerConfig, ShardedOptimizer
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.resume import checkpoint_extra, resolve_resume
from piebald.specs.model import ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import PRESETS

PLAN = make_plan(
    [StageSpec(layer_end=6, ranks=(0,), num_micro_batches=(3,), fractions=(1.0,))], num_gpus=1
)
# Another plan of the same model: two stages on two GPUs.
OTHER_PLAN = make_plan(
    [
        StageSpec(layer_end=3, ranks=(0,), num_micro_batches=(3,), fractions=(1.0,)),
        StageSpec(layer_end=6, ranks=(1,), num_micro_batches=(3,), fractions=(1.0,)),
    ],
    num_gpus=2,
)
GROUP = single_rank_group(0)
CONFIG = TrainConfig(steps=10, seed=3)


def _checkpoints(directory: Path, *, steps: tuple[int, ...] = (2, 4, 6)) -> None:
    """Checkpoints at ``steps`` as ``piebald train`` writes them (seed, model, ...)."""
    params = build_params(("a.weight", "a.bias"), seed=1)
    bucket = FlatBucket(
        "stage0",
        named_params=list(params.items()),
        placement=BucketPlacement(ranks=(0,), fractions=(1.0,), zero=ZeroMode.NONE),
        group=GROUP,
        rank=0,
    )
    optimizer = ShardedOptimizer([bucket], config=OptimizerConfig(), used_group=GROUP)
    for step in steps:
        save_checkpoint(
            directory,
            step=step,
            optimizer=optimizer,
            group=GROUP,
            rank=0,
            extra=checkpoint_extra(CONFIG, plan=PLAN),
        )


def _edit_manifest(path: Path, *, recompute_checksum: bool, **changes: object) -> None:
    """Change manifest fields; with ``recompute_checksum`` as a careful forger would,
    following the documented rule (SHA-256 of the sorted, compact JSON without the key)."""
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(changes)
    if recompute_checksum:
        content = {key: value for key, value in manifest.items() if key != "checksum"}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        manifest["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))


def _refusal(config: TrainConfig, *, plan: object = PLAN) -> str:
    with pytest.raises(SpecError) as caught:
        resolve_resume(config, plan=plan)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    return message


def _resume(directory: Path, **changes: object) -> TrainConfig:
    return dataclasses.replace(CONFIG, checkpoint_dir=directory, resume=True, **changes)


def test_an_edited_manifest_is_corrupt_and_the_intact_older_one_is_named(tmp_path: Path) -> None:
    """Finding 10: step 6 -> 7 in the manifest was accepted and skipped step 7."""
    _checkpoints(tmp_path)
    newest = tmp_path / "step-00000006"
    _edit_manifest(newest, recompute_checksum=False, step=7)
    message = _refusal(_resume(tmp_path))
    assert str(newest / "manifest.json") in message and "checksum" in message
    assert f"newest intact older checkpoint is {tmp_path / 'step-00000004'}" in message

    # The same edit with a matching checksum still disagrees with the directory's name.
    _edit_manifest(newest, recompute_checksum=True, step=7)
    message = _refusal(_resume(tmp_path))
    assert "step: got 7; expected 6" in message and "step-00000004" in message


def test_a_negative_step_is_corrupt(tmp_path: Path) -> None:
    """Finding 24: "step": -5 gave a ValueError traceback."""
    _checkpoints(tmp_path, steps=(2,))
    moved = tmp_path / "elsewhere"
    (tmp_path / "step-00000002").rename(moved)  # a name that says no step
    _edit_manifest(moved, recompute_checksum=True, step=-5)
    with pytest.raises(SpecError, match=r"step: got -5; expected a step count >= 0"):
        read_checkpoint_info(moved)
    _edit_manifest(moved, recompute_checksum=False, step=-5, num_updates=-1)
    with pytest.raises(SpecError, match="checksum"):
        read_checkpoint_info(moved)


def test_when_no_older_checkpoint_is_intact_the_error_says_so(tmp_path: Path) -> None:
    _checkpoints(tmp_path, steps=(2, 4))
    shard = tmp_path / "step-00000002" / "rank-00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, another digest
    shard.write_bytes(bytes(data))
    (tmp_path / "step-00000004" / "rank-00000.pt").unlink()
    message = _refusal(_resume(tmp_path))
    assert "rank-00000.pt" in message and "no older checkpoint in this directory is intact" in (
        message
    )


def test_another_seed_or_model_is_refused_another_plan_is_not(tmp_path: Path) -> None:
    """Finding 11: --resume --seed 1 on a seed-0 checkpoint was accepted."""
    _checkpoints(tmp_path)
    message = _refusal(_resume(tmp_path, seed=4))
    assert "--seed: got 4; expected 3" in message

    wider = dataclasses.replace(PRESETS["tiny"], hidden_size=2 * PRESETS["tiny"].hidden_size)
    other_model = make_plan(
        [StageSpec(layer_end=6, ranks=(0,), num_micro_batches=(3,), fractions=(1.0,))],
        num_gpus=1,
        model=ModelSpec(name="tiny-tied", arch=wider),
    )
    message = _refusal(_resume(tmp_path), plan=other_model)
    assert "--plan" in message and "another architecture under the same name" in message

    assert resolve_resume(_resume(tmp_path), plan=OTHER_PLAN) == tmp_path / "step-00000006"


def test_resuming_at_or_past_the_last_step_is_refused(tmp_path: Path) -> None:
    """Finding 29: --resume --steps 4 from a step-6 checkpoint exited 0 with 0 tokens/s."""
    _checkpoints(tmp_path)
    for steps in (4, 6):
        message = _refusal(_resume(tmp_path, steps=steps))
        assert f"--steps: got {steps}; expected more than 6" in message
        assert "already at step 6" in message
    assert resolve_resume(_resume(tmp_path, steps=7), plan=PLAN) == tmp_path / "step-00000006"


def test_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path: Path) -> None:
    """Finding 30: there was no way back to an older checkpoint."""
    _checkpoints(tmp_path)
    message = _refusal(_resume(tmp_path / "step-00000004"))  # the directory of one of them
    assert f"--checkpoint-dir {tmp_path} --resume-from {tmp_path / 'step-00000004'}" in message

    chosen = resolve_resume(_resume(tmp_path, resume_from=Path("step-00000004")), plan=PLAN)
    assert chosen == tmp_path / "step-00000004"
    # The abandoned line is kept, but a later --resume continues the new one.
    assert (tmp_path / "superseded-step-00000006" / "manifest.json").is_file()
    assert find_latest_checkpoint(tmp_path) == chosen

    message = _refusal(_resume(tmp_path, resume_from=Path("step-00000005")))
    assert "--resume-from: got 'step-00000005'" in message


def test_a_fresh_run_never_reuses_a_directory_with_checkpoints(tmp_path: Path) -> None:
    _checkpoints(tmp_path, steps=(2,))
    fresh = dataclasses.replace(CONFIG, checkpoint_dir=tmp_path)
    with pytest.raises(FileExistsError, match="pass --resume"):
        resolve_resume(fresh, plan=PLAN)
    assert (
        resolve_resume(dataclasses.replace(fresh, checkpoint_dir=tmp_path / "new"), plan=PLAN)
        is None
    )
