"""Layer 0: token embedding, plus learned absolute positions for GPT-2.

Its token table is the weight an LM head with tied embeddings reuses (Press & Wolf 2017).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Embedding"]


class Embedding(nn.Module):
    def __init__(self, *, vocab_size: int, hidden_size: int, max_positions: int = 0) -> None:
        super().__init__()
        # Registered first: its draws come first from the layer's random stream, which lets a
        # tied head replica on another stage be drawn identically (models/stage_part.py).
        self.tok_embeddings = nn.Embedding(vocab_size, hidden_size)  # [V, h]
        self.max_positions = max_positions
        self.pos_embeddings = nn.Embedding(max_positions, hidden_size) if max_positions else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, s] int64 -> [b, s, h]
        x: torch.Tensor = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            seq_len = tokens.shape[1]
            if seq_len > self.max_positions:
                raise ValueError(
                    f"sequence length {seq_len} exceeds the model's {self.max_positions} "
                    "learned positions (max_seq_len)"
                )
            x = x + self.pos_embeddings(torch.arange(seq_len, device=tokens.device))  # + [s, h]
        return x
