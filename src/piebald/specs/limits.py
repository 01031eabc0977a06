"""The largest number piebald accepts for each size a user gives, in one place.

Every loader (cluster YAML, model config.json, plan JSON) and every CLI flag checks these
before anything is allocated, so a typo like ``--global-batch 10000000000`` or
``hidden_size: 1073741824`` is one line naming the value and the limit instead of a
planner that never returns, a MemoryError or a negative memory figure.

How they were chosen. Each is many times the largest published model or run (so no real
use meets one) and small enough that everything computed downstream stays fast and exact:

* Model sizes, against the largest published configs (Llama 3.1 405B: 126 blocks, hidden
  16384, ffn 53248, 128 heads; Megatron's 1T config: hidden 25600; Gemma: vocabulary
  262144, head_dim 256; Llama 4 Scout: 10M positions). Blocks are the one size the
  planner's work grows fast with (it prices every layer range: a 256-block Llama plans
  in about 30 s and 1 GB, 1024 blocks took minutes and 6 GB), so 256, twice the deepest
  published model.
* The global batch (sequences per step): DeepSeek-V3 trained with 15360 sequences. A plan
  holds one route per micro-batch, and the planner's work grows with the number of
  micro-batches: gpt2 on the example cluster plans 2^16 sequences in about 17 s, 2^20 in
  3 minutes and 700 MB (10^7 ran past 2 minutes and 2.6 GB, still growing), so 2^16.
* GPUs in a cluster: the largest the planner was measured on (``benchmarks/
  many_small_nodes.py``: 32768 one-GPU nodes plan in about 70 s on 2 cores; the time grows
  at least linearly with GPUs), so 2^15.

No integer overflow. The largest integer products in the cost model are parameter counts
and bytes. With these limits a block has at most 2h*q + 2h*kv + 3hf < 2^43 weights
(h <= 2^17, q = kv <= heads x head_dim <= 2^12 x 2^11 = 2^23, f <= 2^19), a model
2^8 x 2^43 + 2 x V h + positions x h < 2^52 parameters, and 16 bytes of training state
each make < 2^56 bytes: far inside int64 (2^63), and the parameter count exact in
float64 (2^53). Tokens per micro-batch are at most 2^16 x 2^24 = 2^40. The cost model
also sums in float64 (``cost.memory.prefix_sums``), so even past these limits nothing wraps.
"""

from __future__ import annotations

__all__ = [
    "MAX_FFN_HIDDEN_SIZE",
    "MAX_GLOBAL_BATCH",
    "MAX_GPUS",
    "MAX_GPUS_PER_NODE",
    "MAX_HEAD_DIM",
    "MAX_HIDDEN_SIZE",
    "MAX_NUM_BLOCKS",
    "MAX_NUM_HEADS",
    "MAX_SEED",
    "MAX_SEQ_LEN",
    "MAX_VOCAB_SIZE",
    "limit_text",
]

MAX_GLOBAL_BATCH = 2**16  # sequences per optimizer step (65536)
MAX_SEQ_LEN = 2**24  # tokens per sequence, and a model's positions (16777216)
MAX_GPUS = 2**15  # GPUs in a cluster (32768): see the module docstring
MAX_GPUS_PER_NODE = 64
MAX_NUM_BLOCKS = 2**8  # transformer blocks (256)
MAX_HIDDEN_SIZE = 2**17  # 131072
MAX_FFN_HIDDEN_SIZE = 2**19  # 524288
MAX_NUM_HEADS = 2**12  # attention heads, query and key/value (4096)
MAX_HEAD_DIM = 2**11  # 2048
MAX_VOCAB_SIZE = 2**22  # 4194304
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit seed


def limit_text(maximum: int, what: str = "") -> str:
    """The ``expected`` part of an error for a number over its limit."""
    unit = f" {what}" if what else ""
    return f"at most {maximum}{unit} (piebald's limit; the docs' Guarantees page lists them)"
