"""Built-in model presets, loading a Hugging Face ``config.json`` (GPT-2, Llama, Mistral,
Qwen2; read by specs/hf_config.py), and the model as plan files embed it.

Preset numbers are those of the published ``config.json`` of each model on the Hugging
Face hub (openai-community/gpt2*, meta-llama/*, mistralai/Mistral-7B-v0.1); nothing is
downloaded at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from piebald.errors import ArgumentError, SpecError
from piebald.specs.fields import Fields, suggest
from piebald.specs.hf_config import arch_from_hf_config
from piebald.specs.json_file import read_json
from piebald.specs.limits import MAX_HEAD_DIM, MAX_SEQ_LEN
from piebald.specs.model import ARCH_LIMITS, Family, HfModelType, ModelArch, ModelSpec
from piebald.specs.rope_scaling import (
    RopeScaling,
    RopeType,
    rope_scaling_from_dict,
    rope_scaling_to_dict,
)

__all__ = ["PRESETS", "arch_from_hf_config", "load_model", "model_from_dict", "model_to_dict"]


def _gpt2(num_blocks: int, hidden: int, heads: int) -> ModelArch:
    return ModelArch(
        family=Family.GPT2,
        num_blocks=num_blocks,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=4 * hidden,
        vocab_size=50257,
        max_seq_len=1024,
        tie_embeddings=True,
    )


def _llama(
    *,
    blocks: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    seq: int,
    tied: bool,
    theta: float,
    eps: float = 1e-5,
    rope_scaling: RopeScaling | None = None,
    sliding_window: int | None = None,
    hf_model_type: HfModelType = HfModelType.LLAMA,
) -> ModelArch:
    return ModelArch(
        family=Family.LLAMA,
        num_blocks=blocks,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        max_seq_len=seq,
        tie_embeddings=tied,
        norm_eps=eps,
        rope_theta=theta,
        rope_scaling=rope_scaling,
        sliding_window=sliding_window,
        hf_model_type=hf_model_type,
    )


# Llama 3.1 and 3.2's published rope_scaling (meta-llama/Llama-3.2-1B config.json).
_LLAMA_3_2_ROPE = RopeScaling(
    rope_type=RopeType.LLAMA3,
    factor=32.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


PRESETS: dict[str, ModelArch] = {
    # A few layers, small width: fast enough for multi-process CPU tests. Byte-level vocab.
    "tiny": _llama(
        blocks=4,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=176,
        vocab=256,
        seq=256,
        tied=False,
        theta=10000.0,
    ),
    "gpt2": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    "llama-3.2-1b": _llama(
        blocks=16,
        hidden=2048,
        heads=32,
        kv_heads=8,
        ffn=8192,
        vocab=128256,
        seq=131072,
        tied=True,
        theta=500000.0,
        rope_scaling=_LLAMA_3_2_ROPE,
    ),
    "llama-3.2-3b": _llama(
        blocks=28,
        hidden=3072,
        heads=24,
        kv_heads=8,
        ffn=8192,
        vocab=128256,
        seq=131072,
        tied=True,
        theta=500000.0,
        rope_scaling=_LLAMA_3_2_ROPE,
    ),
    "llama-3-8b": _llama(
        blocks=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        vocab=128256,
        seq=8192,
        tied=False,
        theta=500000.0,
    ),
    "llama-2-7b": _llama(
        blocks=32,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn=11008,
        vocab=32000,
        seq=4096,
        tied=False,
        theta=10000.0,
        eps=1e-6,
    ),
    "llama-2-13b": _llama(
        blocks=40,
        hidden=5120,
        heads=40,
        kv_heads=40,
        ffn=13824,
        vocab=32000,
        seq=4096,
        tied=False,
        theta=10000.0,
        eps=1e-6,
    ),
    "llama-3-70b": _llama(
        blocks=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=28672,
        vocab=128256,
        seq=8192,
        tied=False,
        theta=500000.0,
    ),
    "mistral-7b": _llama(
        blocks=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        vocab=32000,
        seq=32768,
        tied=False,
        theta=10000.0,
        sliding_window=4096,
        hf_model_type=HfModelType.MISTRAL,
    ),
}


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a Hugging Face ``config.json`` (or its directory) by path."""
    if name_or_path in PRESETS:
        return ModelSpec(name=name_or_path, arch=PRESETS[name_or_path])
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ArgumentError(  # the CLI names its --model flag
            argument="model",
            value=name_or_path,
            expected=f"a preset ({', '.join(PRESETS)}) or a path to a Hugging Face "
            f"config.json{suggest(name_or_path, PRESETS)}",
        )
    data = read_json(path, expected="a readable JSON file")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return ModelSpec(name=name, arch=arch_from_hf_config(data, source=str(path)))


def model_to_dict(model: ModelSpec) -> dict[str, Any]:
    """The model as plan files embed it: its name and architecture numbers."""
    arch = model.arch
    return {
        "name": model.name,
        "family": arch.family.value,
        "num_blocks": arch.num_blocks,
        "hidden_size": arch.hidden_size,
        "num_heads": arch.num_heads,
        "num_kv_heads": arch.num_kv_heads,
        "ffn_hidden_size": arch.ffn_hidden_size,
        "vocab_size": arch.vocab_size,
        "max_seq_len": arch.max_seq_len,
        "tie_embeddings": arch.tie_embeddings,
        "head_dim": arch.head_dim,
        "norm_eps": arch.norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_scaling": (
            None if arch.rope_scaling is None else rope_scaling_to_dict(arch.rope_scaling)
        ),
        "attention_qkv_bias": arch.attention_qkv_bias,
        "attention_out_bias": arch.attention_out_bias,
        "mlp_bias": arch.mlp_bias,
        "sliding_window": arch.sliding_window,
        "hf_model_type": arch.model_type.value,
    }


def model_from_dict(data: object, *, source: str) -> ModelSpec:
    """The model of a plan file; fields newer than the file take their defaults."""
    fields = Fields(data, source=source, path="model")
    fields.reject_unknown(model_to_dict(ModelSpec(name="x", arch=PRESETS["tiny"])).keys())
    counts = {
        name: fields.integer(name, minimum=1, maximum=maximum)
        for name, maximum in ARCH_LIMITS.items()
    }
    try:
        arch = ModelArch(
            family=Family(fields.choice("family", [f.value for f in Family])),
            tie_embeddings=fields.boolean("tie_embeddings"),
            head_dim=fields.integer("head_dim", default=0, minimum=0, maximum=MAX_HEAD_DIM),
            norm_eps=fields.number("norm_eps", strictly_positive=True),
            rope_theta=fields.number("rope_theta", strictly_positive=True),
            rope_scaling=(
                rope_scaling_from_dict(fields.sub("rope_scaling"))
                if fields.has("rope_scaling")
                else None
            ),
            attention_qkv_bias=fields.boolean("attention_qkv_bias", default=False),
            attention_out_bias=fields.boolean("attention_out_bias", default=False),
            mlp_bias=fields.boolean("mlp_bias", default=False),
            sliding_window=(
                fields.integer("sliding_window", minimum=1, maximum=MAX_SEQ_LEN)
                if fields.has("sliding_window")
                else None
            ),
            hf_model_type=(
                HfModelType(fields.choice("hf_model_type", [t.value for t in HfModelType]))
                if fields.has("hf_model_type")
                else None
            ),
            **counts,
        )
    except SpecError:
        raise
    except ValueError as error:
        raise SpecError(
            source=source,
            field="model",
            has_value=False,
            expected=f"a consistent architecture ({error})",
        ) from None
    return ModelSpec(name=fields.string("name"), arch=arch)
