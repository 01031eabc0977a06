"""Selective recompute of a block (``specs.recompute``): which ops keep their outputs.

torch's selective activation checkpointing (``torch.utils.checkpoint``,
``create_selective_checkpoint_contexts``) asks a policy, op by op as the checkpointed
forward dispatches them, whether to keep the op's output for the backward or run the op
again there. This policy keeps the attention kernel's outputs and those of every other
matmul in call order (the first, third, ...), counted apart in the forward and in its
rerun so that both mark the same ops; everything else is run again. ``specs.model`` prices
what that keeps and ``specs.layer_ops`` what it reruns, for the runtime's block code
(``llama.py``, ``gpt2.py``, ``tensor_ops.py``): the matmuls are ``mm`` or ``addmm``
whether or not the block is split over a tensor group.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["selective_contexts"]

_aten = torch.ops.aten
_MATMULS = frozenset({_aten.mm.default, _aten.addmm.default})
# Every fused attention kernel scaled_dot_product_attention may pick, CPU and GPU.
_ATTENTION = frozenset(
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
)


class _KeepAlternateMatmuls:
    """The policy of one checkpointed call: its forward and its rerun each count their
    matmuls from zero."""

    def __init__(self) -> None:
        self._matmuls = {False: 0, True: 0}  # keyed by "is this the rerun"

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in _ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        if op in _MATMULS:
            self._matmuls[ctx.is_recompute] += 1
            if self._matmuls[ctx.is_recompute] % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts() -> tuple[Any, Any]:
    """The ``context_fn`` of one ``checkpoint`` call that recomputes selectively."""
    contexts: tuple[Any, Any] = create_selective_checkpoint_contexts(  # type: ignore[no-untyped-call]
        _KeepAlternateMatmuls()
    )
    return contexts
