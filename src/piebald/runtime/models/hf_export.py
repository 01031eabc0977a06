"""Write a Hugging Face model directory: ``config.json`` and the weights as safetensors,
one ``model.safetensors`` or, above a shard size, ``model-0000K-of-0000N.safetensors``
with the ``model.safetensors.index.json`` that maps every tensor to its file (the layout
``save_pretrained`` writes, so ``from_pretrained`` and vLLM read it as they read any model).

The directory is built under a fresh temporary name beside its destination, every file
synced, then renamed into place without replacing anything (``piebald.outputs``): an
interrupted export never leaves a partial model under the user's name, and an existing
destination, even one that appeared during the run, is never replaced: the finished model
is then kept under the temporary name the one-line error gives. A write that fails (a
full disk) removes the temporary directory and is one line naming the flag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from piebald.outputs import OutputError, file_mode, rename_no_replace, write_error

__all__ = [
    "CARRIED_FILES",
    "DEFAULT_SHARD_BYTES",
    "INDEX_NAME",
    "SINGLE_FILE",
    "TOKEN_ID_KEYS",
    "carried_over",
    "save_safetensors",
    "write_hf_model",
]

DEFAULT_SHARD_BYTES = 5 * 2**30  # save_pretrained's default max_shard_size, "5GB"
SINGLE_FILE = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# What a fine-tuned model keeps of the directory it started from: its tokenizer (the files
# tokenizers, sentencepiece and transformers save), chat template and generation settings,
# and the special tokens' ids in config.json. The weights and the architecture are the run's.
CARRIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def carried_over(source: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    """The files (name -> path) and config.json token ids of ``source`` that a model
    trained from it keeps (``CARRIED_FILES``, ``TOKEN_ID_KEYS``); whatever is absent is
    left out."""
    files = {name: source / name for name in CARRIED_FILES if (source / name).is_file()}
    try:
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        config = {}
    ids = {key: config[key] for key in TOKEN_ID_KEYS if isinstance(config, dict) and key in config}
    return files, ids


def write_hf_model(
    directory: Path,
    *,
    tensors: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    files: Mapping[str, Path] | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    flag: str = "--save-model",
) -> None:
    """Create ``directory`` holding ``config``, ``tensors`` (under their Hugging Face
    names) and copies of ``files`` (name in the directory -> source path). The model is
    written first (the caller checked the destination before the work that made it), then
    renamed into place; a destination that exists by then (it appeared during the run) is
    never replaced: the :class:`~piebald.outputs.OutputError` naming ``flag`` says where
    the complete model is kept instead. An OS error while writing (a full disk) is an
    OutputError naming ``flag``, the destination and the OS's words, and leaves nothing."""
    directory = Path(directory)
    # A fresh, uniquely named scratch directory per export: nothing left by another run
    # is ever reused or removed. mkdtemp makes it private; the model gets the usual mode.
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    except OSError as error:
        raise write_error(error, flag=flag, path=directory) from None
    try:
        scratch.chmod(file_mode(executable=True))
        _write_json(scratch / "config.json", dict(config))
        for name, path in (files or {}).items():
            shutil.copyfile(path, scratch / name)
            _fsync(scratch / name)
        shards = _shards(tensors, max_shard_bytes=max_shard_bytes)
        names = (
            [SINGLE_FILE]
            if len(shards) == 1
            else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
        )
        weight_map: dict[str, str] = {}
        for file_name, shard in zip(names, shards, strict=True):
            save_safetensors(
                {name: tensor.contiguous() for name, tensor in shard.items()},
                scratch / file_name,
                metadata={"format": "pt"},
            )
            _fsync(scratch / file_name)
            weight_map.update(dict.fromkeys(shard, file_name))
        if len(shards) > 1:
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }
            _write_json(scratch / INDEX_NAME, index)
    except BaseException as error:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(error, OSError):
            raise write_error(error, flag=flag, path=directory) from None
        raise
    try:
        rename_no_replace(scratch, directory)  # never onto something that appeared meanwhile
    except FileExistsError:
        # Someone created the destination while the model was written: keep theirs, and
        # keep the model too (a training run is not thrown away), under the scratch name.
        raise OutputError(
            flag=flag,
            path=directory,
            expected=f"a path that does not exist (it exists now, made by someone else "
            f"during the run; nothing was overwritten; the model is complete in {scratch}: "
            "rename it)",
        ) from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: Path, *, metadata: dict[str, str] | None = None
) -> None:
    """``safetensors.torch.save_file``, whose I/O errors (a full disk) are raised as the
    OSError they are, not as a SafetensorError wrapping the OS's words."""
    try:
        save_file(dict(tensors), str(path), metadata=metadata)
    except SafetensorError as error:
        found = _OS_ERROR.search(str(error))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


def _shards(
    tensors: Mapping[str, torch.Tensor], *, max_shard_bytes: int
) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, a new shard whenever the next one would pass ``max_shard_bytes``
    (a tensor larger than that gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _fsync(path)


def _fsync(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())
