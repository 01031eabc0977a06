"""Emulation at reduced width: when a plan's model is too large to train on this machine's
CPU processes, the same layer structure (family, number of blocks, embedding and head,
tying, attention grouping) runs with a small hidden size. The plan, and so every emulated
time, still describes the full model; only the arithmetic done for real shrinks."""

from __future__ import annotations

import dataclasses

from piebald.specs.model import ModelSpec

__all__ = ["DEFAULT_MAX_EMULATED_PARAMS", "reduced_width_model"]

DEFAULT_MAX_EMULATED_PARAMS = 50_000_000
_REDUCED_HIDDEN = 64
_REDUCED_HEADS = 4
_REDUCED_VOCAB = 512  # byte-level corpora need 256


def reduced_width_model(model: ModelSpec, *, max_params: int) -> ModelSpec:
    """``model`` itself if it has at most ``max_params`` parameters, else a narrow copy."""
    if model.num_params <= max_params:
        return model
    arch = model.arch
    kv_heads = max(1, _REDUCED_HEADS * arch.num_kv_heads // arch.num_heads)
    ffn = max(_REDUCED_HIDDEN, round(_REDUCED_HIDDEN * arch.ffn_hidden_size / arch.hidden_size))
    narrow = dataclasses.replace(
        arch,
        hidden_size=_REDUCED_HIDDEN,
        num_heads=_REDUCED_HEADS,
        num_kv_heads=kv_heads,
        head_dim=0,
        ffn_hidden_size=ffn,
        vocab_size=min(arch.vocab_size, _REDUCED_VOCAB),
    )
    return ModelSpec(name=f"{model.name} (reduced width {_REDUCED_HIDDEN})", arch=narrow)
