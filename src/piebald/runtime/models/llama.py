"""One Llama-family transformer block (Llama 2/3, Mistral, Qwen2): RMSNorm, rotary
positions (models/rope.py), grouped-query attention, SwiGLU MLP; biases where the
architecture has them (Qwen2 on Q, K, V; Llama's attention_bias and mlp_bias).

Shapes: b batch, s sequence, h hidden, n query heads, k key/value heads, d head dim,
f MLP width. The numerics follow Hugging Face's ``LlamaForCausalLM`` (rotate-half RoPE,
fp32 norm statistics, the same RoPE frequencies), so its safetensors load as they are.
Under tensor parallelism (models/tensor_parallel.py) n, k and f are a member's share of
the heads and of the width and ``tensor_group`` is set; sequence parallel (the plan's
``sequence`` layout, models/tensor_ops.py) a block's input and output are the member's
chunk of the sequence, [b, s/t, h]: the norms and residual adds run on the chunk, the
attention and the MLP gather the whole sequence and hand back the chunk of their output.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from piebald.runtime.models.norms import RMSNorm
from piebald.runtime.models.rope import Rope, apply_rope, rope_tables
from piebald.runtime.models.tensor_ops import (
    TensorGroup,
    column_parallel_linears,
    row_parallel_linear,
    sequence_parallel_norm,
)
from piebald.specs.model import ModelArch

__all__ = ["Attention", "FeedForward", "LlamaBlock", "Rope", "apply_rope", "rope_tables"]


class Attention(nn.Module):
    """Causal grouped-query attention (Ainslie et al. 2023): k key/value heads, each shared
    by n / k query heads."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        # Set when the heads are split over a tensor group (models/tensor_parallel.py).
        self.tensor_group: TensorGroup | None = None
        self.num_heads = arch.num_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.resolved_head_dim
        h = arch.hidden_size
        qkv_bias = arch.attention_qkv_bias
        self.wq = nn.Linear(h, arch.q_width, bias=qkv_bias)  # h -> n*d
        self.wk = nn.Linear(h, arch.kv_width, bias=qkv_bias)  # h -> k*d
        self.wv = nn.Linear(h, arch.kv_width, bias=qkv_bias)  # h -> k*d
        self.wo = nn.Linear(arch.q_width, h, bias=arch.attention_out_bias)  # n*d -> h

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:  # [b, s, h] -> [b, s, h]
        # Sequence parallel: [b, s/t, h] -> [b, s/t, h], the whole sequence in between.
        n, k, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, keys, values = column_parallel_linears(
            x, (self.wq, self.wk, self.wv), self.tensor_group
        )  # [b, s, n*d], [b, s, k*d], [b, s, k*d]
        b, s, _ = q.shape
        q = q.view(b, s, n, d).transpose(1, 2)  # [b, n, s, d]
        keys = keys.view(b, s, k, d).transpose(1, 2)  # [b, k, s, d]
        values = values.view(b, s, k, d).transpose(1, 2)  # [b, k, s, d]
        q, keys = apply_rope(q, rope), apply_rope(keys, rope)
        # Query head j reads key/value head j // (n / k), the grouping enable_gqa implements.
        out = functional.scaled_dot_product_attention(
            q, keys, values, is_causal=True, enable_gqa=n != k
        )  # [b, n, s, d]
        return row_parallel_linear(
            out.transpose(1, 2).reshape(b, s, n * d), self.wo, self.tensor_group
        )


class FeedForward(nn.Module):
    """SwiGLU MLP (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6):
    w2(silu(w1 x) * w3 x)."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.tensor_group: TensorGroup | None = None  # the width split: tensor_parallel
        h, f = arch.hidden_size, arch.ffn_hidden_size
        self.w1 = nn.Linear(h, f, bias=arch.mlp_bias)  # gate
        self.w2 = nn.Linear(f, h, bias=arch.mlp_bias)  # down
        self.w3 = nn.Linear(h, f, bias=arch.mlp_bias)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, s, h] -> [b, s, h]
        # Sequence parallel: [b, s/t, h] -> [b, s/t, h], the whole sequence in between.
        gate, up = column_parallel_linears(x, (self.w1, self.w3), self.tensor_group)
        gated = functional.silu(gate) * up  # [b, s, f]
        return row_parallel_linear(gated, self.w2, self.tensor_group)


class LlamaBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(arch.hidden_size, eps=arch.norm_eps)
        self.attention = Attention(arch)
        self.ffn_norm = RMSNorm(arch.hidden_size, eps=arch.norm_eps)
        self.feed_forward = FeedForward(arch)
        # Set under tensor parallelism: sequence parallel, the norms run on a chunk.
        self.tensor_group: TensorGroup | None = None

    def forward(self, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:  # [b, s, h]
        # Sequence parallel, x is this member's chunk [b, s/t, h], and so is the output.
        assert rope is not None, "a Llama block needs the rotary tables"
        group = self.tensor_group
        x = x + self.attention(sequence_parallel_norm(self.attention_norm, x, group), rope)
        out: torch.Tensor = x + self.feed_forward(sequence_parallel_norm(self.ffn_norm, x, group))
        return out
