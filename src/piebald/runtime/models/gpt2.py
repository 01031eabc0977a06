"""One GPT-2 transformer block (Radford et al. 2019): LayerNorm, multi-head causal attention
with biases, GELU (tanh approximation) MLP. nanoGPT's layout and names, which are those of
Hugging Face's ``GPT2LMHeadModel`` (whose Conv1D weights are the transposes of ours).

Shapes: b batch, s sequence, h hidden, n heads, d = h / n head dim, f MLP width (4h).
Under tensor parallelism (models/tensor_parallel.py) n and f are a member's share of the
heads and of the width, and ``tensor_group`` is set.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from piebald.runtime.models.llama import Rope
from piebald.runtime.models.tensor_ops import copy_to_tensor_group, row_parallel_linear
from piebald.specs.model import ModelArch

__all__ = ["GPT2Block"]


class CausalSelfAttention(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.tensor_group: dist.ProcessGroup | None = None  # the heads split: tensor_parallel
        self.num_heads = arch.num_heads
        self.head_dim = h // arch.num_heads
        self.c_attn = nn.Linear(h, 3 * h)  # h -> [q | k | v]
        self.c_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, s, h] -> [b, s, h]
        b, s, _ = x.shape
        n, d = self.num_heads, self.head_dim
        x = copy_to_tensor_group(x, self.tensor_group)
        q, k, v = (
            t.view(b, s, n, d).transpose(1, 2)  # [b, n, s, d]
            for t in self.c_attn(x).split(n * d, dim=2)
        )
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, n, s, d]
        return row_parallel_linear(
            out.transpose(1, 2).reshape(b, s, n * d), self.c_proj, self.tensor_group
        )


class MLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.tensor_group: dist.ProcessGroup | None = None  # the width split: tensor_parallel
        self.c_fc = nn.Linear(arch.hidden_size, arch.ffn_hidden_size)  # h -> f
        self.c_proj = nn.Linear(arch.ffn_hidden_size, arch.hidden_size)  # f -> h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tensor_group(x, self.tensor_group)
        hidden = functional.gelu(self.c_fc(x), approximate="tanh")  # [b, s, f]
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

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:  # [b, s, h]
        # GPT-2 adds learned positions at the embedding; ``rope`` is unused (same signature as
        # the Llama block so a stage part can stack either).
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out
