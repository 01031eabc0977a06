"""Deterministic weight initialisation, one random stream per global layer index.

The weights of layer i are drawn from a CPU generator seeded by (seed, i) alone, so any
split of the model into stage parts holds exactly the weights of the whole model, on any
device and in any dtype (values are drawn in fp32 on the CPU, then cast and moved).

Scheme (GPT-2, Radford et al. 2019, section 2.3, as nanoGPT does it): every matmul weight
and embedding ~ N(0, 0.02), residual output projections ~ N(0, 0.02 / sqrt(2 * num_blocks))
so the residual stream's variance does not grow with depth, biases 0, norm scales 1.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from piebald.runtime.models.norms import RMSNorm

__all__ = ["INIT_STD", "RESIDUAL_PROJECTIONS", "init_layer", "layer_generator"]

INIT_STD = 0.02
# Names (last path component) of the linear maps that write into the residual stream.
RESIDUAL_PROJECTIONS = frozenset({"wo", "w2", "c_proj"})


def layer_generator(*, seed: int, layer_index: int) -> torch.Generator:
    """A CPU generator whose stream depends only on (seed, layer_index)."""
    # SeedSequence mixes the pair into well-spread 64-bit state: (1, 0) and (0, 1) differ.
    state = np.random.SeedSequence([seed, layer_index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device="cpu").manual_seed(int(state))


@torch.no_grad()
def init_layer(module: nn.Module, *, generator: torch.Generator, num_blocks: int) -> None:
    """Initialise every parameter of one layer's module in place (fp32, CPU), in module order."""
    residual_std = INIT_STD / math.sqrt(2 * num_blocks)
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear):
            is_residual = name.rsplit(".", 1)[-1] in RESIDUAL_PROJECTIONS
            std = residual_std if is_residual else INIT_STD
            nn.init.normal_(sub.weight, mean=0.0, std=std, generator=generator)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.Embedding):
            nn.init.normal_(sub.weight, mean=0.0, std=INIT_STD, generator=generator)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)
        elif isinstance(sub, RMSNorm):
            nn.init.ones_(sub.weight)
