"""Reading a Hugging Face ``config.json`` (GPT-2, Llama, Mistral, Qwen2) as a ModelArch.

Fields are read as transformers 5 reads them (its ``GPT2Config``, ``LlamaConfig``,
``MistralConfig``, ``Qwen2Config`` and the modeling code that uses them), defaults included:
a field left out means what it means to transformers. Every setting that would make
transformers compute something piebald's runtime does not (another activation, per-layer
attention scaling, an unsupported RoPE variant, partial rotary embeddings, ...) is refused
as one line naming the file, the field and the value, instead of training a different model
silently.

Accepted but not modelled: dropout (GPT-2's ``attn_pdrop``, ``resid_pdrop`` and
``embd_pdrop``, 0.1 each when left out; the others' ``attention_dropout``, 0 when left out):
piebald trains without dropout (a model's outputs in evaluation do not depend on it), so a
nonzero probability issues one :class:`DropoutIgnoredWarning` naming the file, the fields and
their values. Fields that only concern generation, tokenizers, heads other than the causal
LM head (GPT-2's ``summary_first_dropout`` is its double-heads model's) or tensor-parallel
hints are ignored.
"""

from __future__ import annotations

import warnings
from typing import Any

from piebald.errors import ModelWarning, SpecError
from piebald.specs.fields import Fields
from piebald.specs.limits import (
    MAX_FFN_HIDDEN_SIZE,
    MAX_HEAD_DIM,
    MAX_HIDDEN_SIZE,
    MAX_NUM_BLOCKS,
    MAX_NUM_HEADS,
    MAX_SEQ_LEN,
    MAX_VOCAB_SIZE,
)
from piebald.specs.model import Family, HfModelType, ModelArch
from piebald.specs.rope_scaling import rope_dict_from_hf, rope_scaling_from_hf

__all__ = ["DropoutIgnoredWarning", "arch_from_hf_config"]

_LLAMA_TYPES = {
    "llama": HfModelType.LLAMA,
    "mistral": HfModelType.MISTRAL,
    "qwen2": HfModelType.QWEN2,
}
# transformers' defaults for fields a config.json may leave out.
_MAX_POSITIONS = {HfModelType.LLAMA: 2048, HfModelType.MISTRAL: 4096 * 32, HfModelType.QWEN2: 32768}
_KV_HEADS = {HfModelType.MISTRAL: 8, HfModelType.QWEN2: 32}  # Llama: one per query head
_DEFAULT_SLIDING_WINDOW = 4096  # MistralConfig and Qwen2Config
_QWEN2_MAX_WINDOW_LAYERS = 28
# Dropout probabilities transformers' causal LM applies in training, with their defaults.
_DROPOUT = {
    HfModelType.GPT2: {"attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1},
    HfModelType.LLAMA: {"attention_dropout": 0.0},
    HfModelType.MISTRAL: {"attention_dropout": 0.0},
    HfModelType.QWEN2: {"attention_dropout": 0.0},
}
# Both are GELU's tanh approximation (Hendrycks and Gimpel 2016), which runtime/gpt2.py uses.
_GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
# GPT-2 switches that change the attention piebald computes, with the value it implements.
_GPT2_SWITCHES = {
    "scale_attn_weights": (True, "scores scaled by 1/sqrt(head dim)"),
    "scale_attn_by_inverse_layer_idx": (False, "no per-layer attention scaling"),
    "reorder_and_upcast_attn": (False, "attention as GPT2Attention computes it by default"),
    "add_cross_attention": (False, "a decoder-only model"),
}


def arch_from_hf_config(data: object, *, source: str) -> ModelArch:
    """A GPT-2, Llama, Mistral or Qwen2 ``config.json`` mapping as a :class:`ModelArch`."""
    config = Fields(data, source=source)
    model_type = config.choice("model_type", ("gpt2", *_LLAMA_TYPES))
    kwargs = _gpt2(config) if model_type == "gpt2" else _llama(config, _LLAMA_TYPES[model_type])
    try:
        arch = ModelArch(**kwargs)
    except ValueError as error:  # the fields were checked one by one; this is their mix
        raise SpecError(
            source=source,
            field="",
            has_value=False,
            expected=f"a consistent architecture ({error})",
        ) from None
    _warn_dropout(config, arch.model_type)
    return arch


class DropoutIgnoredWarning(ModelWarning):
    """A ``config.json`` with a nonzero dropout probability: piebald trains without dropout.

    ``fields``: each nonzero probability by its field name (left-out fields at transformers'
    default)."""

    def __init__(self, message: str, *, fields: dict[str, float]) -> None:
        super().__init__(message)
        self.fields = fields


def _warn_dropout(config: Fields, kind: HfModelType) -> None:
    """One :class:`DropoutIgnoredWarning` for the nonzero dropout probabilities of
    ``config`` (a value that is not a probability is a SpecError)."""
    nonzero: dict[str, float] = {}
    left_out: list[str] = []
    for name, default in _DROPOUT[kind].items():
        if name in config.data and config.data[name] is None:  # LlamaConfig allows null: 0
            continue
        probability = config.number(name, default=default, maximum=1.0)
        if probability:
            nonzero[name] = probability
            if name not in config.data:
                left_out.append(name)
    if not nonzero:
        return
    listed = ", ".join(f"{name} = {value:g}" for name, value in nonzero.items())
    note = f" ({', '.join(left_out)} left out: transformers' default)" if left_out else ""
    warnings.warn(
        DropoutIgnoredWarning(
            f"{config.source}: {listed}{note}; piebald trains without dropout, so these "
            f"probabilities are ignored",
            fields=nonzero,
        ),
        stacklevel=3,
    )


def _gpt2(config: Fields) -> dict[str, Any]:
    activation = config.raw("activation_function", "gelu_new")
    if activation not in _GPT2_ACTIVATIONS:
        raise config.error(
            "activation_function", activation, f"one of {list(_GPT2_ACTIVATIONS)} (tanh GELU)"
        )
    for name, (wanted, meaning) in _GPT2_SWITCHES.items():
        if config.boolean(name, default=wanted) != wanted:
            raise config.error(
                name, config.raw(name), f"{str(wanted).lower()} (piebald implements {meaning})"
            )
    hidden = config.integer("n_embd", minimum=1, maximum=MAX_HIDDEN_SIZE)
    heads = config.integer("n_head", minimum=1, maximum=MAX_NUM_HEADS)
    if hidden % heads:
        raise config.error("n_head", heads, f"a divisor of n_embd ({hidden})")
    return dict(
        family=Family.GPT2,
        hf_model_type=HfModelType.GPT2,
        num_blocks=config.integer("n_layer", minimum=1, maximum=MAX_NUM_BLOCKS),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=config.integer(
            "n_inner", default=4 * hidden, minimum=1, maximum=MAX_FFN_HIDDEN_SIZE
        ),
        vocab_size=config.integer("vocab_size", minimum=1, maximum=MAX_VOCAB_SIZE),
        max_seq_len=config.integer("n_positions", minimum=1, maximum=MAX_SEQ_LEN),
        tie_embeddings=config.boolean("tie_word_embeddings", default=True),
        norm_eps=config.number("layer_norm_epsilon", default=1e-5, strictly_positive=True),
    )


def _llama(config: Fields, kind: HfModelType) -> dict[str, Any]:
    activation = config.raw("hidden_act", "silu")
    if activation != "silu":
        raise config.error("hidden_act", activation, "'silu' (piebald's SwiGLU MLP)")
    hidden = config.integer("hidden_size", minimum=1, maximum=MAX_HIDDEN_SIZE)
    heads = config.integer("num_attention_heads", minimum=1, maximum=MAX_NUM_HEADS)
    kv_heads = config.integer(
        "num_key_value_heads",
        default=_KV_HEADS.get(kind, heads),
        minimum=1,
        maximum=MAX_NUM_HEADS,
    )
    if heads % kv_heads:
        raise config.error(
            "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})"
        )
    head_dim = config.integer("head_dim", default=0, minimum=0, maximum=MAX_HEAD_DIM)
    if not head_dim and hidden % heads:
        raise config.error("num_attention_heads", heads, f"a divisor of hidden_size ({hidden})")
    if (head_dim or hidden // heads) % 2:  # RoPE rotates pairs of a head's dimensions
        if head_dim:
            raise config.error("head_dim", head_dim, "an even number (RoPE rotates pairs)")
        raise config.error(
            "num_attention_heads",
            heads,
            f"a divisor of hidden_size ({hidden}) giving an even head dimension (it gives "
            f"{hidden // heads}; RoPE rotates pairs)",
        )
    num_blocks = config.integer("num_hidden_layers", minimum=1, maximum=MAX_NUM_BLOCKS)
    max_positions = config.integer(
        "max_position_embeddings", default=_MAX_POSITIONS[kind], minimum=1, maximum=MAX_SEQ_LEN
    )
    # transformers folds a top-level partial_rotary_factor into the rope dict.
    partial = config.number("partial_rotary_factor", default=1.0)
    if partial != 1.0:
        raise config.error("partial_rotary_factor", partial, "1.0 (piebald rotates whole heads)")
    rope, rope_theta = rope_dict_from_hf(config)
    if rope_theta is None:  # the rope dict's theta wins over a top-level one, as in transformers
        rope_theta = config.number("rope_theta", default=10000.0, strictly_positive=True)
    scaling = None
    if rope is not None:
        override = (
            config.integer("original_max_position_embeddings", minimum=1, maximum=MAX_SEQ_LEN)
            if config.has("original_max_position_embeddings")
            else None
        )
        scaling = rope_scaling_from_hf(
            rope, max_position_embeddings=max_positions, original_override=override
        )
    attention_bias = kind is HfModelType.LLAMA and config.boolean("attention_bias", default=False)
    return dict(
        family=Family.LLAMA,
        hf_model_type=kind,
        num_blocks=num_blocks,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=config.integer("intermediate_size", minimum=1, maximum=MAX_FFN_HIDDEN_SIZE),
        vocab_size=config.integer("vocab_size", minimum=1, maximum=MAX_VOCAB_SIZE),
        max_seq_len=max_positions,
        tie_embeddings=config.boolean("tie_word_embeddings", default=False),
        head_dim=head_dim,
        norm_eps=config.number("rms_norm_eps", default=1e-6, strictly_positive=True),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        attention_qkv_bias=attention_bias or kind is HfModelType.QWEN2,
        attention_out_bias=attention_bias,
        mlp_bias=kind is HfModelType.LLAMA and config.boolean("mlp_bias", default=False),
        sliding_window=_sliding_window(config, kind, num_blocks=num_blocks),
    )


def _sliding_window(config: Fields, kind: HfModelType, *, num_blocks: int) -> int | None:
    """The attention window transformers applies (None: full causal attention).

    Mistral slides on every layer when ``sliding_window`` is set; a file without the field
    gets MistralConfig's 4096, an explicit null none. Qwen2 slides only with
    ``use_sliding_window`` and a window, on the layers ``layer_types`` marks
    ``sliding_attention`` (without ``layer_types``: layer ``i`` slides when
    ``i >= max_window_layers``, 28 by default). piebald applies one window to every layer, so
    a Qwen2 model whose window covers some layers but not all (``0 < max_window_layers <
    num_hidden_layers``, or mixed ``layer_types``) is refused: every layer sliding
    (``max_window_layers`` 0) or none (``max_window_layers >= num_hidden_layers``) is accepted.
    """
    if kind is HfModelType.LLAMA:
        return None  # LlamaConfig has no window; transformers ignores the field
    if kind is HfModelType.QWEN2 and not config.boolean("use_sliding_window", default=False):
        return None  # Qwen2Config drops the window without use_sliding_window
    if "sliding_window" not in config.data:
        window: int | None = _DEFAULT_SLIDING_WINDOW
    elif not config.has("sliding_window"):  # an explicit null
        window = None
    else:
        window = config.integer("sliding_window", minimum=1, maximum=MAX_SEQ_LEN)
    if kind is not HfModelType.QWEN2:
        return window
    if config.has("layer_types"):  # transformers uses it as given, over max_window_layers
        layer_types = config.items("layer_types")
        allowed = ("full_attention", "sliding_attention")
        if len(layer_types) != num_blocks or any(t not in allowed for t in layer_types):
            raise config.error(
                "layer_types",
                layer_types,
                f"{num_blocks} entries (num_hidden_layers), each one of {list(allowed)}",
            )
        sliding = layer_types.count("sliding_attention")
        if window is not None and 0 < sliding < num_blocks:
            raise config.error(
                "layer_types",
                layer_types,
                "the same type on every layer (piebald applies one attention window to all "
                "layers or none; a window on some layers is not supported)",
            )
        return window if sliding else None
    first = config.integer("max_window_layers", default=_QWEN2_MAX_WINDOW_LAYERS, minimum=0)
    if window is not None and 0 < first < num_blocks:
        raise config.error(
            "max_window_layers",
            first,
            f"0 (a window on every layer) or at least num_hidden_layers ({num_blocks}, no "
            f"window) with use_sliding_window true (piebald applies one attention window to "
            f"all layers or none; a window on layers {first} to {num_blocks - 1} only is not "
            f"supported)",
        )
    return window if first < num_blocks else None
