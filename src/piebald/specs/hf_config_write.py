"""A Hugging Face ``config.json`` for a ModelArch: what transformers needs to rebuild exactly
this architecture (``AutoConfig.for_model(**config)``, then ``AutoModelForCausalLM``), and
what :func:`~piebald.specs.hf_config.arch_from_hf_config` reads back as the same ModelArch.

The dtype (``dtype``/``torch_dtype``) and token ids (``bos_token_id``, ...) belong to the
weights and the tokenizer, not the architecture: the exporter adds them. Dropout is written
as 0: piebald trains without it, so the exported model computes what piebald trained.
"""

from __future__ import annotations

from typing import Any

from piebald.specs.model import HfModelType, ModelArch
from piebald.specs.rope_scaling import rope_scaling_to_hf

__all__ = ["hf_config_from_arch"]

_ARCHITECTURES = {
    HfModelType.GPT2: "GPT2LMHeadModel",
    HfModelType.LLAMA: "LlamaForCausalLM",
    HfModelType.MISTRAL: "MistralForCausalLM",
    HfModelType.QWEN2: "Qwen2ForCausalLM",
}


def hf_config_from_arch(arch: ModelArch) -> dict[str, Any]:
    """The ``config.json`` mapping (JSON-serialisable) that describes ``arch``."""
    kind = arch.model_type
    head = {"model_type": kind.value, "architectures": [_ARCHITECTURES[kind]]}
    if kind is HfModelType.GPT2:
        return head | _gpt2(arch)
    return head | _llama(arch)


def _gpt2(arch: ModelArch) -> dict[str, Any]:
    # ModelArch guarantees num_kv_heads == num_heads and head_dim == 0 are all GPT-2 can say;
    # check it here too, since a config.json that silently differs would be worse.
    if arch.num_kv_heads != arch.num_heads or arch.head_dim:
        raise ValueError(
            f"GPT-2 has one key/value head per query head and head_dim = hidden / heads; "
            f"got num_kv_heads={arch.num_kv_heads}, head_dim={arch.head_dim}"
        )
    return {
        "vocab_size": arch.vocab_size,
        "n_positions": arch.max_seq_len,
        "n_embd": arch.hidden_size,
        "n_layer": arch.num_blocks,
        "n_head": arch.num_heads,
        "n_inner": arch.ffn_hidden_size,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": arch.norm_eps,
        "tie_word_embeddings": arch.tie_embeddings,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def _llama(arch: ModelArch) -> dict[str, Any]:
    kind = arch.model_type
    rope = rope_scaling_to_hf(arch.rope_scaling, theta=arch.rope_theta)
    out: dict[str, Any] = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_hidden_layers": arch.num_blocks,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": arch.max_seq_len,
        "rms_norm_eps": arch.norm_eps,
        "tie_word_embeddings": arch.tie_embeddings,
        "attention_dropout": 0.0,
        # transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling.
        "rope_parameters": rope,
        "rope_theta": arch.rope_theta,
    }
    if arch.rope_scaling is not None:
        out["rope_scaling"] = dict(rope)
    if kind is HfModelType.LLAMA:
        out["attention_bias"] = arch.attention_out_bias
        out["mlp_bias"] = arch.mlp_bias
    elif kind is HfModelType.MISTRAL:
        out["sliding_window"] = arch.sliding_window  # null, not absent: absent means 4096
    else:
        out["use_sliding_window"] = arch.sliding_window is not None
        out["sliding_window"] = arch.sliding_window
        out["max_window_layers"] = 0  # every layer slides when there is a window
    return out
