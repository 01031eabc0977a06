"""The runtime's model zoo: GPT-2 and Llama-family decoders built from a ModelSpec, one stage
part (a contiguous layer range) at a time, with deterministic per-layer initialisation, the
token loss, and optional loading of Hugging Face safetensors weights from a local directory.
"""

from piebald.runtime.models.hf_weights import load_hf_weights
from piebald.runtime.models.loss import token_loss_sum
from piebald.runtime.models.stage_part import (
    StagePart,
    TiedParameter,
    build_layer_module,
    build_stage_part,
)

__all__ = [
    "StagePart",
    "TiedParameter",
    "build_layer_module",
    "build_stage_part",
    "load_hf_weights",
    "token_loss_sum",
]
