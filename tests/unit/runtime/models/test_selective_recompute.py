"""Selective recompute as the runtime runs it (``runtime.models.selective_recompute``)
against what ``specs.model`` says a block keeps: the bytes of live tensors a block's
forward leaves behind, counted by the runtime's memory meter, are the model's selective
bytes per token exactly (beyond the block's input, which its caller holds). What the
backward runs again is held against ``specs.layer_ops`` in ``tests/unit/specs/
test_layer_ops.py``, and the gradients against no recompute in ``test_stage_part.py``."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from piebald.runtime.models.stage_part import build_stage_part
from piebald.runtime.training.memory_meter import MemoryMeter
from piebald.specs.model import Family, ModelArch, build_model_spec
from piebald.specs.presets import PRESETS
from piebald.specs.recompute import Recompute

SEQ = 32
LLAMA = dataclasses.replace(PRESETS["tiny"], max_seq_len=SEQ)
# tiny's widths in GPT-2's block: fused QKV with biases, LayerNorm, GELU.
GPT2 = ModelArch(
    family=Family.GPT2,
    num_blocks=LLAMA.num_blocks,
    hidden_size=LLAMA.hidden_size,
    num_heads=LLAMA.num_heads,
    num_kv_heads=LLAMA.num_heads,
    ffn_hidden_size=4 * LLAMA.hidden_size,
    vocab_size=LLAMA.vocab_size,
    max_seq_len=SEQ,
    tie_embeddings=True,
)


def _kept_bytes(arch: ModelArch, *, rows: int, dtype: torch.dtype, recompute: Recompute) -> int:
    """Bytes of the tensors one block's forward on ``rows`` sequences leaves alive for its
    backward, its input and output aside."""
    part = build_stage_part(build_model_spec("t", arch), layer_start=1, layer_end=2, dtype=dtype)
    part.recompute = recompute
    x = torch.randn(rows, SEQ, arch.hidden_size, dtype=dtype, requires_grad=True)
    rope = part.rope(x)
    meter = MemoryMeter(torch.device("cpu"))
    gc.collect()  # earlier tests' tensors die now, not inside the window
    with meter:
        meter.track([x, *part.parameters(), *(rope or ())])
        before = meter.live_bytes()
        out = part.run_layer(1, x, rope)
        kept = meter.live_bytes() - before - out.numel() * out.element_size()
        out.sum().backward()
    return kept


@pytest.mark.parametrize("arch", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recompute", [Recompute.SELECTIVE, Recompute.FULL])
def test_a_block_keeps_what_the_model_says(
    arch: ModelArch, dtype: torch.dtype, recompute: Recompute
) -> None:
    layer = build_model_spec("t", arch).layers[1]
    dtype_bytes = torch.finfo(dtype).bits // 8
    # Per row of the micro-batch: what does not grow with it (nothing, here) drops out.
    measured = [_kept_bytes(arch, rows=rows, dtype=dtype, recompute=recompute) for rows in (1, 2)]
    per_row = measured[1] - measured[0]
    per_token = layer.activation_bytes_per_token(dtype_bytes=dtype_bytes, recompute=recompute)
    block_input = arch.hidden_size * dtype_bytes
    assert per_row == SEQ * (per_token - block_input)
