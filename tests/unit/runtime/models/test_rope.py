"""RoPE frequencies and cos/sin scale against transformers' own RoPE initialisers (the
oracle), for every variant piebald implements, over many random parameter draws."""

from __future__ import annotations

import random

import pytest
import torch

from piebald.runtime.models.rope import inverse_frequencies, rope_tables
from piebald.specs.hf_config import arch_from_hf_config
from piebald.specs.hf_config_write import hf_config_from_arch

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")


def random_rope(rng: random.Random, rope_type: str) -> tuple[dict[str, object], int, int]:
    """(rope_parameters, head_dim, max_position_embeddings) for one random draw."""
    head_dim = rng.choice([8, 16, 32, 64, 128])
    original = rng.choice([16, 64, 512, 8192])
    rope: dict[str, object] = {
        "rope_type": rope_type,
        "rope_theta": rng.choice([10000.0, 500000.0, 1e6, 1234.5]),
    }
    if rope_type == "linear":
        rope["factor"] = rng.choice([1.0, 2.0, 4.5, 8])
    if rope_type == "llama3":
        low = rng.choice([0.5, 1.0, 2.0])
        rope |= {
            "factor": rng.choice([8.0, 32.0, 3.5]),
            "low_freq_factor": low,
            "high_freq_factor": low * rng.choice([2.0, 4.0, 8.0]),
            "original_max_position_embeddings": original,
        }
    if rope_type == "yarn":
        rope |= {
            "factor": rng.choice([2.0, 4.0, 16.0, 40.0]),
            "original_max_position_embeddings": original,
        }
        if rng.random() < 0.5:
            rope["beta_fast"] = rng.choice([16.0, 64.0])
            rope["beta_slow"] = rng.choice([0.5, 2.0])
        if rng.random() < 0.5:
            rope["truncate"] = False
        draw = rng.random()
        if draw < 0.3:
            rope |= {"mscale": rng.choice([0.707, 1.0]), "mscale_all_dim": rng.choice([0.5, 1.0])}
        elif draw < 0.5:
            rope["attention_factor"] = rng.choice([0.9, 1.25])
    return rope, head_dim, 4 * original


def hf_llama_config(rope: dict[str, object], *, head_dim: int, max_positions: int) -> object:
    return transformers.LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        num_hidden_layers=1,
        intermediate_size=8,
        vocab_size=11,
        max_position_embeddings=max_positions,
        rope_parameters=dict(rope),
    )


@pytest.mark.parametrize("rope_type", ["linear", "llama3", "yarn"])
def test_frequencies_and_scale_equal_transformers(rope_type: str) -> None:
    rng = random.Random(rope_type)
    for _ in range(40):
        rope, head_dim, max_positions = random_rope(rng, rope_type)
        config = hf_llama_config(rope, head_dim=head_dim, max_positions=max_positions)
        expected, expected_scale = rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config)
        arch = arch_from_hf_config(config.to_dict(), source="config.json")
        assert arch.rope_scaling is not None and arch.rope_scaling.rope_type == rope_type
        ours = inverse_frequencies(
            head_dim=head_dim, theta=arch.rope_theta, scaling=arch.rope_scaling
        )
        assert torch.equal(ours, expected), rope
        assert arch.rope_scaling.cos_sin_scale == pytest.approx(expected_scale, rel=1e-15), rope
        # What we write out is what transformers computes the same frequencies from.
        again = transformers.AutoConfig.for_model(**hf_config_from_arch(arch))
        assert torch.equal(rope_utils.ROPE_INIT_FUNCTIONS[rope_type](again)[0], expected)


def test_tables_equal_transformers_rotary_embedding() -> None:
    """cos and sin of every position, YaRN's scale applied, as LlamaRotaryEmbedding gives."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 32,
    }
    config = hf_llama_config(rope, head_dim=16, max_positions=256)
    x = torch.zeros(1, 100, 32)
    cos, sin = llama.LlamaRotaryEmbedding(config)(x, torch.arange(100)[None])
    arch = arch_from_hf_config(config.to_dict(), source="config.json")
    ours = rope_tables(
        seq_len=100,
        head_dim=16,
        theta=10000.0,
        device=torch.device("cpu"),
        scaling=arch.rope_scaling,
    )
    torch.testing.assert_close(ours[0], cos[0], rtol=0, atol=0)
    torch.testing.assert_close(ours[1], sin[0], rtol=0, atol=0)
    assert not torch.allclose(ours[0].abs().amax(), torch.tensor(1.0))  # the scale mattered
