"""Write the trained model's weights as one file: every parameter once, under its global
name (``layers.3.attention.wq.weight``), as one process holding the whole model would name
it. Stage parts write their pieces, the leader merges them; a tied head's replica is left
out (the whole model's head uses the embedding's table).

The file is written next to its final path and renamed into place, so an interrupted
export never leaves a partial file under the user's name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from piebald.runtime.distributed.collectives import barrier
from piebald.runtime.distributed.groups import ProcessGroups
from piebald.runtime.distributed.optimizer import ShardedOptimizer
from piebald.runtime.models.stage_part import StagePart

__all__ = ["export_part_weights", "part_weights", "save_weights"]


def part_weights(part: StagePart) -> dict[str, torch.Tensor]:
    """The part's parameters under global names, without a tied head's replica (CPU)."""
    replicas = {t.local_name for t in part.tied_parameters() if t.layer_index != 0}
    return {
        name: p.detach().to("cpu", copy=True)
        for name, p in part.named_parameters()
        if name not in replicas
    }


def save_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` to a temporary name beside ``path``, then rename onto it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        torch.save(weights, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def export_part_weights(
    path: Path,
    *,
    part: StagePart,
    optimizer: ShardedOptimizer,
    groups: ProcessGroups,
    rank: int,
) -> None:
    """Collective over the used ranks: merge every stage's weights into ``path``."""
    assert groups.stage is not None and groups.stage_index is not None
    pieces = path.with_name(f".{path.name}.parts")
    optimizer.gather_params()  # ZeRO-3 stages hold shards at rest
    if rank == groups.stage.ranks[0]:
        pieces.mkdir(parents=True, exist_ok=True)
        save_weights(part_weights(part), pieces / f"stage-{groups.stage_index}.pt")
    optimizer.release_params()
    barrier(groups.used)
    if rank == groups.used.ranks[0]:
        merged: dict[str, torch.Tensor] = {}
        for piece in sorted(pieces.glob("stage-*.pt")):
            merged.update(torch.load(piece, weights_only=True))
        save_weights(merged, path)
        shutil.rmtree(pieces)
