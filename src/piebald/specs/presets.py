"""Built-in model presets and loading a Hugging Face ``config.json`` (GPT-2, Llama, Mistral).

Preset numbers are those of the published ``config.json`` of each model on the Hugging
Face hub (openai-community/gpt2*, meta-llama/*, mistralai/Mistral-7B-v0.1); nothing is
downloaded at run time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.specs.fields import Fields, suggest
from piebald.specs.model import Family, ModelArch, ModelSpec

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
    ),
}

_LLAMA_TYPES = ("llama", "mistral")


def arch_from_hf_config(data: object, *, source: str) -> ModelArch:
    """A GPT-2, Llama or Mistral ``config.json`` mapping as a :class:`ModelArch`."""
    config = Fields(data, source=source)
    model_type = config.choice("model_type", ("gpt2", *_LLAMA_TYPES))
    if model_type == "gpt2":
        hidden = config.integer("n_embd", minimum=1)
        heads = config.integer("n_head", minimum=1)
        arch_kwargs: dict[str, Any] = dict(
            family=Family.GPT2,
            num_blocks=config.integer("n_layer", minimum=1),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=heads,
            ffn_hidden_size=config.integer("n_inner", default=4 * hidden, minimum=1),
            vocab_size=config.integer("vocab_size", minimum=1),
            max_seq_len=config.integer("n_positions", minimum=1),
            tie_embeddings=config.boolean("tie_word_embeddings", default=True),
            norm_eps=config.number("layer_norm_epsilon", default=1e-5, strictly_positive=True),
        )
        heads_field = "n_head"
    else:
        heads = config.integer("num_attention_heads", minimum=1)
        # transformers 5 writes rope_theta inside "rope_parameters"; older files at the top.
        theta = 10000.0
        if config.has("rope_parameters"):
            rope = config.sub("rope_parameters")
            theta = rope.number("rope_theta", default=theta, strictly_positive=True)
        arch_kwargs = dict(
            family=Family.LLAMA,
            num_blocks=config.integer("num_hidden_layers", minimum=1),
            hidden_size=config.integer("hidden_size", minimum=1),
            num_heads=heads,
            num_kv_heads=config.integer("num_key_value_heads", default=heads, minimum=1),
            ffn_hidden_size=config.integer("intermediate_size", minimum=1),
            vocab_size=config.integer("vocab_size", minimum=1),
            max_seq_len=config.integer("max_position_embeddings", default=4096, minimum=1),
            tie_embeddings=config.boolean("tie_word_embeddings", default=False),
            head_dim=config.integer("head_dim", default=0, minimum=0),
            norm_eps=config.number("rms_norm_eps", default=1e-5, strictly_positive=True),
            rope_theta=config.number("rope_theta", default=theta, strictly_positive=True),
        )
        heads_field = "num_attention_heads"
        kv_heads = arch_kwargs["num_kv_heads"]
        if heads % kv_heads:
            raise config.error(
                "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads ({heads})"
            )
    try:
        return ModelArch(**arch_kwargs)
    except ValueError as error:
        raise SpecError(
            source=source,
            field=heads_field,
            has_value=False,
            expected=f"a head count that divides the hidden size ({error})",
        ) from None


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a Hugging Face ``config.json`` (or its directory) by path."""
    if name_or_path in PRESETS:
        return ModelSpec(name=name_or_path, arch=PRESETS[name_or_path])
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SpecError(
            source="--model",
            field="",
            value=name_or_path,
            expected=f"a preset ({', '.join(PRESETS)}) or a path to a Hugging Face "
            f"config.json{suggest(name_or_path, PRESETS)}",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpecError(
            source=str(path), field="", has_value=False, expected=f"a readable JSON file ({error})"
        ) from None
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
    }


def model_from_dict(data: object, *, source: str) -> ModelSpec:
    fields = Fields(data, source=source, path="model")
    fields.reject_unknown(model_to_dict(ModelSpec(name="x", arch=PRESETS["tiny"])).keys())
    counts = {
        name: fields.integer(name, minimum=1)
        for name in (
            "num_blocks",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "ffn_hidden_size",
            "vocab_size",
            "max_seq_len",
        )
    }
    try:
        arch = ModelArch(
            family=Family(fields.choice("family", [f.value for f in Family])),
            tie_embeddings=fields.boolean("tie_embeddings"),
            head_dim=fields.integer("head_dim", default=0, minimum=0),
            norm_eps=fields.number("norm_eps", strictly_positive=True),
            rope_theta=fields.number("rope_theta", strictly_positive=True),
            **counts,
        )
    except ValueError as error:
        raise SpecError(
            source=source,
            field="model",
            has_value=False,
            expected=f"a consistent architecture ({error})",
        ) from None
    return ModelSpec(name=fields.string("name"), arch=arch)
