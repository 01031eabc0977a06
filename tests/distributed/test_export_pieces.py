"""``--save-model`` under a plan (finding 6): the stage pieces of an earlier, killed run
beside the destination are neither merged into the new model nor deleted with the files
around them; this run's own pieces are removed once merged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_harness import StageSpec, make_plan
from safetensors.torch import load_file, save_file

from piebald.runtime.models.hf_names import hf_tensors
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate

pytestmark = pytest.mark.distributed

PLAN = make_plan(
    [
        StageSpec(layer_end=3, ranks=(0,), num_micro_batches=(2,), fractions=(1.0,)),
        StageSpec(layer_end=6, ranks=(1,), num_micro_batches=(2,), fractions=(1.0,)),
    ],
    num_gpus=2,
    tied=False,
)


def test_stale_export_pieces_are_neither_merged_nor_deleted(tmp_path: Path) -> None:
    destination = tmp_path / "model"
    arch = PLAN.model.arch
    table = hf_tensors(arch, layer_start=0, layer_end=PLAN.model.num_layers, has_embedding=True)
    names = {t.hf_names[0] for t in table}
    # What the old code's `.model.parts` held after a kill: pieces of a stage index this
    # plan has and of one it does not, both all zeros under a real parameter's name (the
    # old code merged the second over the trained embedding), and a file of the user's.
    embedding = next(t.local_name for t in table if "embed" in t.local_name)
    stale = tmp_path / ".model.parts"
    stale.mkdir()
    for index in (0, 7):
        zeros = {embedding: torch.zeros(arch.vocab_size, arch.hidden_size)}
        save_file(zeros, str(stale / f"stage-{index}.safetensors"))
    (stale / "notes.txt").write_text("the user's")
    before = sorted(p.name for p in stale.iterdir())

    emulate(PLAN, TrainConfig(steps=1, seed=3, save_model_path=destination), max_params=10**9)

    weights = load_file(str(destination / "model.safetensors"))
    assert set(weights) == names  # nothing merged from the stale pieces
    assert all(value.abs().sum() > 0 for value in weights.values())  # trained, not zeros
    assert sorted(p.name for p in stale.iterdir()) == before  # nothing of theirs removed
    assert (stale / "notes.txt").read_text() == "the user's"
    # This run's own pieces were removed, and only scratch of this run ever existed.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.parts", "model"]
