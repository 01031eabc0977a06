"""Small Hugging Face ``config.json`` contents shared by the config tests (tests/conftest.py
puts this on the path). Tests copy them (``{**LLAMA, ...}``), never change them."""

from __future__ import annotations

from typing import Any

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 101,
    "max_position_embeddings": 256,
}
GPT2: dict[str, Any] = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "vocab_size": 101,
    "n_positions": 128,
}
