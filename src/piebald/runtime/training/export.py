"""Write the trained model as a Hugging Face directory (``--save-model DIR``): the
``config.json`` of the architecture it was trained as and its weights as safetensors,
every tensor under its Hugging Face name, so ``AutoModelForCausalLM.from_pretrained(DIR)``
(and vLLM) load it with no missing or unexpected key.

Under a plan, the first rank of each stage writes its part's parameters (a ZeRO-3 stage
gathers them first, a tensor group its members' slices) to a piece in a directory beside
the destination named for this run only, and the leader merges exactly the pieces of
this run's stages, then removes them; a tied head's replica is left out (the embedding's
table is the tensor). Parameters are written in the dtype they trained in; a model whose
stages trained in different 16-bit types (bf16 beside fp16) is written in fp32, which
holds both exactly. The directory is built under a temporary name and renamed into place
(``hf_export``). A model fine-tuned from a Hugging Face directory keeps that directory's
tokenizer files and token ids.

A piece that cannot be written (a full disk) or a merge that fails is the same one line
naming ``--save-model`` on every rank (an :class:`~piebald.outputs.OutputError`, agreed on
before anyone raises, so no rank waits for a failed one), and the pieces' directory is
removed. Pieces are created with :func:`piebald.outputs.open_run_file` semantics (a new
directory and new files, no link followed).
"""

from __future__ import annotations

import contextlib
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from piebald.errors import SpecError, error_fields
from piebald.outputs import make_run_directory, open_run_file, write_error
from piebald.runtime.distributed.collectives import all_reduce
from piebald.runtime.distributed.groups import CommGroup, ProcessGroups
from piebald.runtime.distributed.optimizer import ShardedOptimizer
from piebald.runtime.models.hf_export import carried_over, save_safetensors, write_hf_model
from piebald.runtime.models.hf_names import hf_tensors
from piebald.runtime.models.stage_part import StagePart
from piebald.runtime.models.tensor_parallel import TensorSplit, whole_weights
from piebald.specs.hf_config_write import hf_config_from_arch
from piebald.specs.model import ModelSpec

__all__ = ["export_part_weights", "part_weights", "save_hf_model"]


def part_weights(part: StagePart) -> dict[str, torch.Tensor]:
    """The part's parameters under global names, without a tied head's replica (CPU)."""
    replicas = {t.local_name for t in part.tied_parameters() if t.layer_index != 0}
    return {
        name: p.detach().to("cpu", copy=True)
        for name, p in part.named_parameters()
        if name not in replicas
    }


def save_hf_model(
    weights: Mapping[str, torch.Tensor],
    *,
    model: ModelSpec,
    directory: Path,
    source: Path | None = None,
) -> None:
    """Write the whole model's ``weights`` (global piebald names) as a Hugging Face
    directory; every parameter of ``model`` must be there, and nothing else. A ``source``
    (the ``--init-from`` directory) hands on its tokenizer and token ids."""
    arch = model.arch
    table = hf_tensors(arch, layer_start=0, layer_end=model.num_layers, has_embedding=True)
    expected = {tensor.local_name for tensor in table}
    if set(weights) != expected:
        missing = sorted(expected - set(weights))[:3]
        extra = sorted(set(weights) - expected)[:3]
        raise ValueError(f"weights of {model.name}: missing {missing}, unexpected {extra}")
    dtype = _common_dtype({t.dtype for t in weights.values()})
    tensors = {}
    for tensor in table:
        value = weights[tensor.local_name].to(dtype)
        tensors[tensor.hf_names[0]] = value.t() if tensor.transpose else value
    config = hf_config_from_arch(arch)
    # transformers 5 reads ``torch_dtype`` as ``dtype``; older readers know only this name.
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    files: dict[str, Path] = {}
    if source is not None:
        files, token_ids = carried_over(source)
        config.update(token_ids)
    write_hf_model(directory, tensors=tensors, config=config, files=files)


def export_part_weights(
    directory: Path,
    *,
    part: StagePart,
    optimizer: ShardedOptimizer,
    groups: ProcessGroups,
    rank: int,
    source: Path | None = None,
    split: TensorSplit | None = None,
) -> None:
    """Collective over the used ranks: merge every stage's weights into ``directory``
    (``save_hf_model``). ``split``: this rank's tensor-parallel slices, gathered whole."""
    assert groups.stage is not None and groups.stage_index is not None
    # The pieces go in a directory named for this run only (a token the leader draws and
    # every rank learns): a piece left by an earlier, killed run is never merged, and
    # cleaning up removes only the pieces this run wrote (findings 6 and its class).
    token = _run_token(groups, rank=rank, device=next(iter(part.parameters())).device)
    pieces = directory.with_name(f".{directory.name}.parts-{token:016x}")
    expected = [pieces / f"stage-{index}.safetensors" for index in range(len(groups.layout.stages))]
    optimizer.gather_params()  # ZeRO-3 stages hold shards at rest
    weights = part_weights(part)
    if split is not None and split.params:  # every member takes part in the gathers
        weights = whole_weights(weights, split, device=next(iter(part.parameters())).device)
    verdict = None
    if rank == groups.stage.ranks[0]:
        piece = expected[groups.stage_index]

        def write_piece() -> None:
            make_run_directory(pieces, flag=_FLAG)
            with open(open_run_file(piece, "create", flag=_FLAG), "wb"):
                pass  # claims the name: a link or a file put there is refused, not followed
            save_safetensors(weights, piece)

        verdict = _attempt(write_piece, directory=directory)
    optimizer.release_params()
    verdicts = _all_gather_objects(verdict, groups.used)
    leader = rank == groups.used.ranks[0]
    if leader and not any(verdicts):
        verdict = _attempt(
            lambda: save_hf_model(
                _merged(expected), model=part.model, directory=directory, source=source
            ),
            directory=directory,
        )
    if leader:
        _remove_pieces(pieces, expected)
    verdicts += _all_gather_objects(verdict if leader else None, groups.used)
    for fields in verdicts:
        if fields is not None:
            raise SpecError(**fields)


_FLAG = "--save-model"


def _merged(pieces: list[Path]) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for piece in pieces:
        merged.update(load_file(str(piece)))
    return merged


def _attempt(work: Callable[[], object], *, directory: Path) -> dict[str, Any] | None:
    """Run ``work``: None when done, else its one-line error's fields (an OS error as the
    ``--save-model`` line naming ``directory``), for every rank to raise alike."""
    try:
        work()
    except SpecError as error:
        return error_fields(error)
    except OSError as error:
        return error_fields(write_error(error, flag=_FLAG, path=directory))
    return None


def _all_gather_objects(obj: object, group: CommGroup) -> list[Any]:
    if group.size == 1:
        return [obj]
    everyone: list[Any] = [None] * group.size
    dist.all_gather_object(everyone, obj, group=group.process_group)
    return everyone


def _remove_pieces(pieces: Path, expected: list[Path]) -> None:
    """Remove this run's pieces and their directory (a directory holding anything else is
    someone's: it stays, as what is in it); never follows a link put in their place."""
    try:
        info = pieces.lstat()
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode):
        return
    for piece in expected:
        with contextlib.suppress(OSError):
            piece.unlink()
    with contextlib.suppress(OSError):  # not empty: someone else's files stay
        pieces.rmdir()


def _run_token(groups: ProcessGroups, *, rank: int, device: torch.device) -> int:
    """A random number, the same on every used rank (the leader's), new on every run."""
    value = secrets.randbits(62) if rank == groups.used.ranks[0] else 0
    token = torch.tensor([value], dtype=torch.int64, device=device)
    all_reduce(token, group=groups.used)  # a sum with zeros: the leader's number
    return int(token.item())


def _common_dtype(dtypes: set[torch.dtype]) -> torch.dtype:
    """The one dtype every parameter is written in (module docstring)."""
    return dtypes.pop() if len(dtypes) == 1 else torch.float32
