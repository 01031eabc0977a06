"""One GPT-2 transformer block (Radford et al. 2019): LayerNorm, multi-head causal attention
with biases, GELU (tanh approximation) MLP. nanoGPT's layout and names, which are those of
Hugging Face's ``GPT2LMHeadModel`` (whose Conv1D weights are the transposes of ours).

Shapes: b batch, s sequence, h hidden, n heads, d = h / n head dim, f MLP width (4h).
Under tensor parallelism (models/tensor_parallel.py) n and f are a member's share of the
heads and of the width and ``tensor_group`` is set; sequence parallel (the plan's
``sequence`` layout, models/tensor_ops.py) a block's input and output are the member's
chunk of the sequence, [b, s/t, h].
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from piebald.runtime.models.llama import Rope
from piebald.runtime.models.tensor_ops import (
    TensorGroup,
    column_parallel_linears,
    row_parallel_linear,
    sequence_parallel_norm,
)
from piebald.specs.model import ModelArch

__all__ = ["GPT2Block"]


class CausalSelfAttention(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.tensor_group: TensorGroup | None = None  # the heads split: tensor_parallel
        self.num_heads = arch.num_heads
        self.head_dim = h // arch.num_heads
        self.c_attn = nn.Linear(h, 3 * h)  # h -> [q | k | v]
        self.c_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, s, h] -> [b, s, h]
        # Sequence parallel: [b, s/t, h] -> [b, s/t, h], the whole sequence in between.
        n, d = self.num_heads, self.head_dim
        (qkv,) = column_parallel_linears(x, (self.c_attn,), self.tensor_group)  # [b, s, 3nd]
        b, s, _ = qkv.shape
        q, k, v = (
            t.view(b, s, n, d).transpose(1, 2)  # [b, n, s, d]
            for t in qkv.chunk(3, dim=2)  # [q | k | v], n*d each
        )
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, n, s, d]
        return row_parallel_linear(
            out.transpose(1, 2).reshape(b, s, n * d), self.c_proj, self.tensor_group
        )


class MLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.tensor_group: TensorGroup | None = None  # the width split: tensor_parallel
        self.c_fc = nn.Linear(arch.hidden_size, arch.ffn_hidden_size)  # h -> f
        self.c_proj = nn.Linear(arch.ffn_hidden_size, arch.hidden_size)  # f -> h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (up,) = column_parallel_linears(x, (self.c_fc,), self.tensor_group)
        hidden = functional.gelu(up, approximate="tanh")  # [b, s, f]
        return row_parallel_linear(hidden, self.c_proj, self.tensor_group)


class GPT2Block(nn.Module):
    """Pre-norm residual block: x + attn(ln_1(x)), then + mlp(ln_2(.))."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.ln_1 = nn.LayerNorm(h, eps=arch.norm_eps)
        self.attn = CausalSelfAttention(arch)
        self.ln_2 = nn.LayerNorm(h, eps=arch.norm_eps)
        self.mlp = MLP(arch)
        # Set under tensor parallelism: sequence parallel, the norms run on a chunk.
        self.tensor_group: TensorGroup | None = None

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:  # [b, s, h]
        # GPT-2 adds learned positions at the embedding; ``rope`` is unused (same signature as
        # the Llama block so a stage part can stack either). Sequence parallel, x is this
        # member's chunk [b, s/t, h], and so is the output.
        group = self.tensor_group
        x = x + self.attn(sequence_parallel_norm(self.ln_1, x, group))
        out: torch.Tensor = x + self.mlp(sequence_parallel_norm(self.ln_2, x, group))
        return out
