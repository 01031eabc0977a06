"""Load Hugging Face safetensors weights (Llama family, GPT-2) into a stage part.

Only the tensors of the part's layers are read, from the ``*.safetensors`` files of a local
directory (one file or a sharded set); nothing is ever downloaded. Names are those of
``LlamaForCausalLM`` ("model.layers.3.self_attn.q_proj.weight") and ``GPT2LMHeadModel``
("transformer.h.3.attn.c_attn.weight"), with or without the "model."/"transformer." prefix
(checkpoints saved from the bare ``LlamaModel``/``GPT2Model``, and OpenAI's GPT-2 files, have
none). GPT-2 stores its linear maps as Conv1D, [in, out]: they are transposed to [out, in].
A tied head reads the embedding table. Every problem is one line naming the file and tensor.

Qwen2 and Llama models with biases also read the ``.bias`` tensors their ModelArch has.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from piebald.errors import SpecError
from piebald.runtime.models.stage_part import StagePart
from piebald.specs.model import Family, ModelArch

__all__ = ["load_hf_weights"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Source:
    local_name: str  # in the part's named_parameters()
    hf_names: tuple[str, ...]  # candidates, first found wins
    transpose: bool  # GPT-2 Conv1D


def load_hf_weights(part: StagePart, directory: Path) -> None:
    """Copy the weights of ``part``'s layers from the safetensors files in ``directory``."""
    files = _index_tensors(Path(directory))
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
            parameter.copy_(tensor.to(dtype=parameter.dtype))


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
    names: dict[str, Path] = {}
    for path in paths:
        try:
            with safe_open(str(path), framework="pt") as handle:
                names.update(dict.fromkeys(handle.keys(), path))
        except (SafetensorError, OSError) as error:
            raise SpecError(
                source=str(path),
                field="",
                has_value=False,
                expected=f"a safetensors file ({error})",
            ) from None
    return names


def _read(path: Path, name: str) -> torch.Tensor:
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(name)
            return tensor
    except (SafetensorError, OSError) as error:
        raise SpecError(
            source=str(path), field=name, has_value=False, expected=f"a readable tensor ({error})"
        ) from None


def _stored_shape(shape: torch.Size, transpose: bool) -> list[int]:
    return list(reversed(shape)) if transpose else list(shape)


def _sources(part: StagePart) -> list[_Source]:
    arch = part.model.arch
    names = _gpt2_names if arch.family is Family.GPT2 else _llama_names
    prefixes = ("transformer.", "") if arch.family is Family.GPT2 else ("model.", "")
    sources = []
    for index in range(part.layer_start, part.layer_end):
        for local, hf_name, transpose in names(arch, index, part):
            candidates = (
                (hf_name,)
                if hf_name == "lm_head.weight"
                else tuple(prefix + hf_name for prefix in prefixes)
            )
            sources.append(
                _Source(
                    local_name=f"layers.{index}.{local}",
                    hf_names=candidates,
                    transpose=transpose,
                )
            )
    return sources


def _head_output(arch: ModelArch, part: StagePart, embedding_name: str) -> list[tuple[str, str]]:
    """(local, hf) for the head's projection, if the head owns one: a tied replica reads the
    embedding table (tied checkpoints do not store lm_head.weight)."""
    if arch.tie_embeddings and part.has_embedding:
        return []  # the head uses the embedding's parameter, loaded with layer 0
    return [("output.weight", embedding_name if arch.tie_embeddings else "lm_head.weight")]


def _llama_names(arch: ModelArch, index: int, part: StagePart) -> list[tuple[str, str, bool]]:
    if index == 0:
        return [("tok_embeddings.weight", "embed_tokens.weight", False)]
    if index <= arch.num_blocks:
        hf = f"layers.{index - 1}."
        pairs = {
            "attention_norm.weight": "input_layernorm.weight",
            "attention.wq.weight": "self_attn.q_proj.weight",
            "attention.wk.weight": "self_attn.k_proj.weight",
            "attention.wv.weight": "self_attn.v_proj.weight",
            "attention.wo.weight": "self_attn.o_proj.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight",
            "feed_forward.w1.weight": "mlp.gate_proj.weight",
            "feed_forward.w2.weight": "mlp.down_proj.weight",
            "feed_forward.w3.weight": "mlp.up_proj.weight",
        }
        biases = [
            (f"attention.{ours}.bias", f"self_attn.{theirs}.bias")
            for ours, theirs, present in (
                ("wq", "q_proj", arch.attention_qkv_bias),
                ("wk", "k_proj", arch.attention_qkv_bias),
                ("wv", "v_proj", arch.attention_qkv_bias),
                ("wo", "o_proj", arch.attention_out_bias),
            )
            if present
        ]
        if arch.mlp_bias:
            biases += [
                ("feed_forward.w1.bias", "mlp.gate_proj.bias"),
                ("feed_forward.w2.bias", "mlp.down_proj.bias"),
                ("feed_forward.w3.bias", "mlp.up_proj.bias"),
            ]
        named = [*pairs.items(), *biases]
        return [(local, hf + name, False) for local, name in named]
    head = [("norm.weight", "norm.weight"), *_head_output(arch, part, "embed_tokens.weight")]
    return [(local, name, False) for local, name in head]


def _gpt2_names(arch: ModelArch, index: int, part: StagePart) -> list[tuple[str, str, bool]]:
    if index == 0:
        return [
            ("tok_embeddings.weight", "wte.weight", False),
            ("pos_embeddings.weight", "wpe.weight", False),
        ]
    if index <= arch.num_blocks:
        hf = f"h.{index - 1}."
        names = []
        for module in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            is_conv1d = not module.startswith("ln_")
            names.append((f"{module}.weight", f"{hf}{module}.weight", is_conv1d))
            names.append((f"{module}.bias", f"{hf}{module}.bias", False))
        return names
    head = [("norm.weight", "ln_f.weight"), ("norm.bias", "ln_f.bias")]
    head += _head_output(arch, part, "wte.weight")
    return [(local, name, False) for local, name in head]
