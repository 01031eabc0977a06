"""Load Hugging Face safetensors weights (Llama family, GPT-2) into a stage part.

Only the tensors of the part's layers are read, from the ``*.safetensors`` files of a local
directory (one file or a sharded set); nothing is ever downloaded. Which tensor goes where
is ``hf_names``' table. A ``config.json`` in the directory that describes another model is
refused (``specs.hf_config_match``: the field and both values). A checkpoint holding
tensors the model would leave unread, a missing tensor, a shape that differs and an integer
tensor for a floating-point parameter are each refused in one line naming the file and
tensor.

Which file each tensor is read from: with a ``model.safetensors.index.json`` (what
``save_pretrained`` writes beside shards), its ``weight_map`` decides, and files it does not
name are not read; without one, every ``*.safetensors`` file is read, and a tensor held by
two of them (a stale shard, a second copy) is refused naming both. Each weight file must be
a regular file (a named pipe would block ``safe_open`` forever), checked before it is
opened; the index is read by :func:`~piebald.specs.user_input.read_user_json`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from piebald.errors import SpecError
from piebald.runtime.models.hf_export import INDEX_NAME
from piebald.runtime.models.hf_names import HfTensor, hf_tensors, unused_hf_names
from piebald.runtime.models.stage_part import StagePart
from piebald.specs.hf_config_match import check_config_matches
from piebald.specs.model import ModelSpec
from piebald.specs.user_input import check_regular_file, read_user_json

__all__ = ["MAX_INDEX_BYTES", "check_hf_weights", "load_hf_weights"]

MAX_INDEX_BYTES = 64 << 20  # a weight map of 10^5 tensors is a few MB


def load_hf_weights(part: StagePart, directory: Path) -> None:
    """Copy the weights of ``part``'s layers from the safetensors files in ``directory``,
    which must hold exactly the whole model's tensors (``check_hf_weights``)."""
    files = check_hf_weights(part.model, Path(directory))
    parameters = dict(part.named_parameters())
    searched = f"{directory}/*.safetensors ({len(set(files.values()))} files)"
    with torch.no_grad():
        for source in _sources(part):
            parameter = parameters[source.local_name]
            found = next((name for name in source.hf_names if name in files), None)
            if found is None:
                raise SpecError(
                    source=searched,
                    field=source.hf_names[0],
                    has_value=False,
                    expected=f"a tensor of shape {list(parameter.shape)} for "
                    f"{source.local_name} (tensor missing)",
                )
            tensor = _read(files[found], found)
            if source.transpose:
                tensor = tensor.t()
            if tensor.shape != parameter.shape:
                raise SpecError(
                    source=str(files[found]),
                    field=found,
                    value=list(tensor.shape) if not source.transpose else list(tensor.t().shape),
                    expected=f"shape {_stored_shape(parameter.shape, source.transpose)} "
                    f"for {source.local_name} of model {part.model.name!r}",
                )
            if parameter.dtype.is_floating_point and not (
                tensor.dtype.is_floating_point or tensor.dtype.is_complex
            ):
                raise SpecError(
                    source=str(files[found]),
                    field=found,
                    value=_dtype_name(tensor.dtype),
                    expected=f"a floating-point tensor for {source.local_name} (a parameter "
                    f"of {_dtype_name(parameter.dtype)}; integer weights are not converted)",
                )
            parameter.copy_(tensor.to(dtype=parameter.dtype))


def check_hf_weights(model: ModelSpec, directory: Path) -> dict[str, Path]:
    """Tensor name -> file of the checkpoint in ``directory``, refused in one line when its
    ``config.json`` describes another model than ``model`` (a field and both values,
    :func:`~piebald.specs.hf_config_match.check_config_matches`), or when it holds tensors
    ``model`` has no parameter for (another architecture, or a setting piebald does not
    implement) or lacks one it needs; shapes are checked as they are read."""
    files = _index_tensors(directory)
    check_config_matches(model, directory)
    whole = hf_tensors(model.arch, layer_start=0, layer_end=model.num_layers, has_embedding=True)
    for tensor in whole:
        if not any(name in files for name in tensor.hf_names):
            raise SpecError(
                source=f"{directory}/*.safetensors",
                field=tensor.hf_names[0],
                has_value=False,
                expected=f"a tensor for {tensor.local_name} of model {model.name!r} "
                "(tensor missing)",
            )
    unused = unused_hf_names(model.arch, num_layers=model.num_layers, stored=set(files))
    if unused:
        shown = ", ".join(unused[:3]) + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
        raise SpecError(
            source=f"{directory}/*.safetensors",
            field=unused[0],
            has_value=False,
            expected=f"only tensors of model {model.name!r}; {len(unused)} would be left "
            f"unread ({shown}): is this checkpoint of another architecture?",
        )
    return files


def _index_tensors(directory: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it."""
    if not directory.is_dir():
        raise SpecError(
            source=str(directory),
            field="",
            has_value=False,
            expected="a directory of Hugging Face *.safetensors weights (no such directory)",
        )
    paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise SpecError(
            source=str(directory),
            field="",
            has_value=False,
            expected="*.safetensors weight files in this directory (found none)",
        )
    for path in paths:
        check_regular_file(path, source=str(path))
    index = directory / INDEX_NAME
    if os.path.lexists(index):
        return _indexed_tensors(directory, index)
    names: dict[str, Path] = {}
    for path in paths:
        for name in _keys(path):
            if name in names:
                raise SpecError(
                    source=str(path),
                    field=name,
                    has_value=False,
                    expected=f"each tensor in one file (also in {names[name]}; remove the "
                    f"stale file, or add a {INDEX_NAME} whose weight_map says which to read)",
                )
            names[name] = path
    return names


def _indexed_tensors(directory: Path, index: Path) -> dict[str, Path]:
    """tensor name -> file, as the index's ``weight_map`` says; each file must hold them."""
    data = read_user_json(index, source=str(index), max_bytes=MAX_INDEX_BYTES)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise SpecError(
            source=str(index),
            field="weight_map",
            value=weight_map,
            expected="a mapping of tensor name: safetensors file name",
        )
    names: dict[str, Path] = {}
    held: dict[Path, set[str]] = {}
    for name, file in weight_map.items():
        if (
            not isinstance(file, str)
            or not file.endswith(".safetensors")
            or "/" in file
            or file.startswith(".")
        ):
            raise SpecError(
                source=str(index),
                field=f"weight_map.{name}",
                value=file,
                expected=f"the name of a *.safetensors file in {directory}",
            )
        path = directory / file
        if path not in held:
            if not os.path.lexists(path):
                raise SpecError(
                    source=str(index),
                    field=f"weight_map.{name}",
                    value=file,
                    expected=f"a file in {directory} (no such file)",
                )
            check_regular_file(path, source=str(path))
            held[path] = set(_keys(path))
        if name not in held[path]:
            raise SpecError(
                source=str(index),
                field=f"weight_map.{name}",
                value=file,
                expected=f"the file holding {name} (it does not)",
            )
        names[name] = path
    return names


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as error:
        raise SpecError(
            source=str(path),
            field="",
            has_value=False,
            expected=f"a safetensors file ({error})",
        ) from None


def _read(path: Path, name: str) -> torch.Tensor:
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(name)
            return tensor
    except (SafetensorError, OSError) as error:
        raise SpecError(
            source=str(path), field=name, has_value=False, expected=f"a readable tensor ({error})"
        ) from None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _stored_shape(shape: torch.Size, transpose: bool) -> list[int]:
    return list(reversed(shape)) if transpose else list(shape)


def _sources(part: StagePart) -> list[HfTensor]:
    return hf_tensors(
        part.model.arch,
        layer_start=part.layer_start,
        layer_end=part.layer_end,
        has_embedding=part.has_embedding,
    )
