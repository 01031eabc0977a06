"""Layer N+1: final norm and the LM head projecting hidden states to vocabulary logits.

With tied embeddings (Press & Wolf 2017) the projection is the token embedding table. On the
stage that also holds the embedding the head owns no weight and is handed the embedding's
at call time; on any other stage it owns a replica (``output``), which the runtime keeps
equal to the embedding by summing the two copies' gradients (StagePart.tied_parameters).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

__all__ = ["Head"]


class Head(nn.Module):
    def __init__(
        self, norm: nn.Module, *, hidden_size: int, vocab_size: int, owns_output_weight: bool
    ) -> None:
        super().__init__()
        self.norm = norm
        self.output = nn.Linear(hidden_size, vocab_size, bias=False) if owns_output_weight else None

    def forward(
        self, x: torch.Tensor, *, output_weight: torch.Tensor | None = None
    ) -> torch.Tensor:  # [b, s, h] -> [b, s, V]
        if self.output is not None:
            logits: torch.Tensor = self.output(self.norm(x))
            return logits
        assert output_weight is not None, "a head without its own weight needs the tied one"
        return functional.linear(self.norm(x), output_weight)
