"""Emulation at reduced width: when a plan's model is too large to train on this machine's
CPU processes, the same layer structure (family, number of blocks, embedding and head,
tying, attention grouping) runs with a small hidden size. The plan, and so every emulated
time, still describes the full model; only the arithmetic done for real shrinks."""

from __future__ import annotations

import dataclasses

from piebald.specs.model import ModelSpec
from piebald.specs.plan import Plan

__all__ = ["DEFAULT_MAX_EMULATED_PARAMS", "emulated_model", "reduced_width_model"]

DEFAULT_MAX_EMULATED_PARAMS = 50_000_000
_REDUCED_HEADS = 4  # query heads at tensor-parallel degree 1
_REDUCED_HIDDEN = 64  # at least; more where many heads need it
_MIN_HEAD_DIM = 8
_REDUCED_VOCAB = 512  # byte-level corpora need 256


def reduced_width_model(
    model: ModelSpec, *, max_params: int, tensor_parallel_degree: int = 1
) -> ModelSpec:
    """``model`` itself if it has at most ``max_params`` parameters, else a narrow copy
    that a tensor group of ``tensor_parallel_degree`` (the plan's largest) can still split:
    at least one key/value head per member, the model's query heads per key/value head,
    and a feed-forward width the degree divides."""
    if model.num_params <= max_params:
        return model
    arch = model.arch
    t = tensor_parallel_degree
    group = arch.num_heads // arch.num_kv_heads  # query heads per key/value head
    kv_heads = max(1, _REDUCED_HEADS // group, t)
    heads = kv_heads * group
    hidden = max(_REDUCED_HIDDEN, _MIN_HEAD_DIM * heads)
    ffn = max(hidden, round(hidden * arch.ffn_hidden_size / arch.hidden_size))
    narrow = dataclasses.replace(
        arch,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=0,
        ffn_hidden_size=-(-ffn // t) * t,
        vocab_size=min(arch.vocab_size, _REDUCED_VOCAB),
    )
    return ModelSpec(name=f"{model.name} (reduced width {hidden})", arch=narrow)


def emulated_model(plan: Plan, *, max_params: int) -> ModelSpec:
    """The model the emulated processes of ``plan`` build: its own, or at reduced width
    split as the plan's largest tensor-parallel degree needs."""
    degree = max(stage.tensor_parallel_degree for stage in plan.stages)
    return reduced_width_model(plan.model, max_params=max_params, tensor_parallel_degree=degree)
