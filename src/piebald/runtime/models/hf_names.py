"""Which Hugging Face tensor holds which piebald parameter, both ways: the one table the
weight loader (``hf_weights``) reads by and the exporter (``training.export``) writes by.

piebald names a parameter ``layers.{i}.{module}`` (layer 0 the embedding, 1..N the blocks,
N+1 the final norm and head); Hugging Face names are those of ``LlamaForCausalLM``
("model.layers.3.self_attn.q_proj.weight"; Mistral and Qwen2 alike, with the ``.bias``
tensors an architecture has) and ``GPT2LMHeadModel``
("transformer.h.3.attn.c_attn.weight"). A loader also accepts the names without the
"model."/"transformer." prefix (checkpoints of the bare ``LlamaModel``/``GPT2Model`` and
OpenAI's GPT-2 files); the exporter writes the first, prefixed, name. GPT-2 stores its
linear maps as Conv1D, [in, out]: those are transposed. A tied head has no tensor of its
own: it reads the embedding table (``lm_head.weight`` is not stored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from piebald.specs.model import Family, ModelArch

__all__ = ["HfTensor", "hf_tensors", "unused_hf_names"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HfTensor:
    local_name: str  # the parameter's global piebald name: layers.{i}.{module}.{weight|bias}
    hf_names: tuple[str, ...]  # where a checkpoint may hold it; the first is written
    transpose: bool  # GPT-2 Conv1D: stored as [in, out]


# Buffers some checkpoints carry that are no parameter: RoPE frequencies (older Llama
# exports) and GPT-2's causal-mask buffers (OpenAI's files).
_BUFFERS = re.compile(r"(^|\.)(rotary_emb\.inv_freq|attn\.(masked_)?bias)$")


def hf_tensors(
    arch: ModelArch, *, layer_start: int, layer_end: int, has_embedding: bool
) -> list[HfTensor]:
    """The tensors of layers [layer_start, layer_end) of a part that holds the embedding
    table (layer 0) or not (then a tied head keeps a replica, read from the table)."""
    gpt2 = arch.family is Family.GPT2
    names = _gpt2_names if gpt2 else _llama_names
    prefixes = ("transformer.", "") if gpt2 else ("model.", "")
    tensors = []
    for index in range(layer_start, layer_end):
        for local, hf_name, transpose in names(arch, index, has_embedding=has_embedding):
            candidates = (
                (hf_name,)
                if hf_name == "lm_head.weight"
                else tuple(prefix + hf_name for prefix in prefixes)
            )
            tensors.append(
                HfTensor(
                    local_name=f"layers.{index}.{local}", hf_names=candidates, transpose=transpose
                )
            )
    return tensors


def unused_hf_names(arch: ModelArch, *, num_layers: int, stored: set[str]) -> list[str]:
    """The names among ``stored`` that no parameter of the whole model reads (buffers and
    a tied model's redundant ``lm_head.weight`` aside), sorted."""
    wanted = {
        name
        for tensor in hf_tensors(arch, layer_start=0, layer_end=num_layers, has_embedding=True)
        for name in tensor.hf_names
    }
    if arch.tie_embeddings:
        wanted.add("lm_head.weight")  # some exports store the tied table twice
    return sorted(name for name in stored - wanted if not _BUFFERS.search(name))


def _head_output(arch: ModelArch, *, has_embedding: bool, embedding: str) -> list[tuple[str, str]]:
    """(local, hf) for the head's projection, if the head owns one: a tied replica reads the
    embedding table (tied checkpoints do not store lm_head.weight)."""
    if arch.tie_embeddings and has_embedding:
        return []  # the head uses the embedding's parameter, loaded with layer 0
    return [("output.weight", embedding if arch.tie_embeddings else "lm_head.weight")]


def _llama_names(
    arch: ModelArch, index: int, *, has_embedding: bool
) -> list[tuple[str, str, bool]]:
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
    head = [
        ("norm.weight", "norm.weight"),
        *_head_output(arch, has_embedding=has_embedding, embedding="embed_tokens.weight"),
    ]
    return [(local, name, False) for local, name in head]


def _gpt2_names(arch: ModelArch, index: int, *, has_embedding: bool) -> list[tuple[str, str, bool]]:
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
    head += _head_output(arch, has_embedding=has_embedding, embedding="wte.weight")
    return [(local, name, False) for local, name in head]
