"""config.json both ways: what piebald refuses (one line naming file, field and value),
defaults as transformers resolves them (transformers is the oracle), and round trips through
hf_config_from_arch and the plan file's model dict for presets and random architectures."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cli_runner import run_cli
from hf_configs import GPT2, LLAMA
from piebald.errors import ArgumentError, SpecError
from piebald.examples import example_path
from piebald.specs.hf_config import arch_from_hf_config
from piebald.specs.hf_config_write import hf_config_from_arch
from piebald.specs.job import check_seq_len
from piebald.specs.model import Family, HfModelType, ModelArch, ModelSpec
from piebald.specs.presets import PRESETS, load_model, model_from_dict, model_to_dict
from piebald.specs.rope_scaling import RopeScaling, RopeType

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

REFUSED = {
    "hidden_act": ({**LLAMA, "hidden_act": "gelu"}, "hidden_act: got 'gelu'"),
    "qwen2 hidden_act": (
        {**LLAMA, "model_type": "qwen2", "hidden_act": "relu"},
        "hidden_act: got 'relu'",
    ),
    "activation_function": (
        {**GPT2, "activation_function": "relu"},
        "activation_function: got 'relu'",
    ),
    "gelu (erf)": ({**GPT2, "activation_function": "gelu"}, "activation_function: got 'gelu'"),
    "scale_attn_by_inverse_layer_idx": (
        {**GPT2, "scale_attn_by_inverse_layer_idx": True},
        "scale_attn_by_inverse_layer_idx: got True",
    ),
    "reorder_and_upcast_attn": (
        {**GPT2, "reorder_and_upcast_attn": True},
        "reorder_and_upcast_attn: got True",
    ),
    "scale_attn_weights": ({**GPT2, "scale_attn_weights": False}, "scale_attn_weights: got False"),
    "add_cross_attention": (
        {**GPT2, "add_cross_attention": True},
        "add_cross_attention: got True",
    ),
    "dynamic rope": (
        {**LLAMA, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
        "rope_parameters.rope_type: got 'dynamic'",
    ),
    "longrope (transformers 4 'type')": (
        {**LLAMA, "rope_scaling": {"type": "longrope", "short_factor": [1.0]}},
        "rope_scaling.type: got 'longrope'",
    ),
    "partial rotary in rope dict": (
        {**LLAMA, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
        "rope_parameters.partial_rotary_factor: got 0.5",
    ),
    "partial rotary at top level": (
        {**LLAMA, "partial_rotary_factor": 0.25},
        "partial_rotary_factor: got 0.25",
    ),
    "rope per layer type": (
        {**LLAMA, "rope_parameters": {"full_attention": {"rope_type": "default"}}},
        "rope_parameters.full_attention: got",
    ),
    "llama3 without low_freq_factor": (
        {**LLAMA, "rope_parameters": {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}},
        "rope_parameters.low_freq_factor: expected this field",
    ),
    "llama3 high <= low": (
        {**LLAMA, "rope_parameters": {**LLAMA3, "high_freq_factor": 1.0}},
        "rope_parameters.high_freq_factor: got 1.0",
    ),
    "qwen2 layer_types": (
        {
            **LLAMA,
            "model_type": "qwen2",
            "use_sliding_window": True,
            "layer_types": ["full_attention", "chunked_attention", "full_attention"],
        },
        "layer_types: got",
    ),
    # A window on some layers only: transformers slides on layers i >= max_window_layers.
    "qwen2 window on late layers": (
        {
            **LLAMA,
            "model_type": "qwen2",
            "use_sliding_window": True,
            "sliding_window": 32,
            "max_window_layers": 2,
        },
        "max_window_layers: got 2; expected 0 (a window on every layer) or at least "
        "num_hidden_layers (3, no window)",
    ),
    "qwen2 default max_window_layers": (
        {**LLAMA, "model_type": "qwen2", "use_sliding_window": True, "num_hidden_layers": 30},
        "max_window_layers: got 28; expected 0",
    ),
    "qwen2 mixed layer_types": (
        {
            **LLAMA,
            "model_type": "qwen2",
            "use_sliding_window": True,
            "max_window_layers": 0,
            "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        },
        "layer_types: got ['full_attention', 'sliding_attention', 'sliding_attention']; "
        "expected the same type on every layer",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_settings_piebald_does_not_implement_are_one_line(case: str, tmp_path: Path) -> None:
    config, expected = REFUSED[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(SpecError) as error:
        load_model(str(path))
    message = str(error.value)
    assert message.startswith(f"{path}: ") and expected in message
    assert "\n" not in message


def test_refusal_exits_2_from_the_cli_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 2}}))
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        str(path),
        "--global-batch",
        "8",
        "--seq-len",
        "64",
    )
    assert code == 2
    assert f"{path}: rope_scaling.rope_type: got 'dynamic'" in output.replace("\n", "")
    assert "Traceback" not in output


# Minimal files (fields left out): transformers resolves the defaults and writes them all
# in to_dict(); piebald must read the minimal file as the resolved one.
MINIMAL = {
    "llama": {k: v for k, v in LLAMA.items() if k not in ("max_position_embeddings",)},
    "llama no kv heads": {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"},
    "llama rope_theta both places": {
        **LLAMA,
        "rope_theta": 1234.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 777.0},
    },
    "llama rope_scaling over rope_parameters": {
        **LLAMA,
        "rope_theta": 5000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 42.0},
    },
    "llama3 original from max positions": {
        **LLAMA,
        "rope_parameters": {
            k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"
        },
    },
    "yarn": {
        **LLAMA,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "llama biases": {**LLAMA, "attention_bias": True, "mlp_bias": True},
    # MistralConfig defaults to 8 key/value heads, Qwen2Config to 32.
    "mistral": {
        **{k: v for k, v in LLAMA.items() if k != "num_key_value_heads"},
        "model_type": "mistral",
        "num_attention_heads": 16,
    },
    "mistral without window": {**LLAMA, "model_type": "mistral", "sliding_window": None},
    "qwen2": {
        **{k: v for k, v in LLAMA.items() if k != "num_key_value_heads"},
        "model_type": "qwen2",
        "num_attention_heads": 32,
    },
    "qwen2 window on every layer": {
        **LLAMA,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 32,
        "max_window_layers": 0,
    },
    "qwen2 window on every layer by layer_types": {
        **LLAMA,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 32,
        "max_window_layers": 2,  # layer_types wins
        "layer_types": ["sliding_attention"] * 3,
    },
    "qwen2 null window on some layers": {
        **LLAMA,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": None,
        "max_window_layers": 1,
    },
    "qwen2 window on no layer": {
        **LLAMA,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 32,
        "max_window_layers": 3,
    },
    "gpt2": GPT2,
}


@pytest.mark.parametrize("case", sorted(MINIMAL))
def test_defaults_are_transformers_defaults(case: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = MINIMAL[case]
    resolved = transformers.AutoConfig.for_model(**json.loads(json.dumps(config))).to_dict()
    ours = arch_from_hf_config(config, source="config.json")
    assert ours == arch_from_hf_config(resolved, source="resolved")
    # Spot checks of what transformers resolved, against the numbers piebald holds.
    if case.startswith(("llama", "mistral", "qwen2")):
        assert ours.norm_eps == resolved["rms_norm_eps"] == 1e-6
        assert ours.num_kv_heads == resolved["num_key_value_heads"]
        assert ours.max_seq_len == resolved["max_position_embeddings"]
        assert ours.rope_theta == resolved["rope_parameters"]["rope_theta"]
    if case.startswith("mistral"):
        assert ours.sliding_window == resolved["sliding_window"]
    if case.startswith("qwen2"):
        slides = "sliding_attention" in resolved["layer_types"]
        assert ours.sliding_window == (resolved["sliding_window"] if slides else None)


def random_arch(rng: random.Random) -> ModelArch:
    kind = rng.choice(list(HfModelType))
    heads = rng.choice([2, 4, 8])
    kv_heads = (
        heads
        if kind is HfModelType.GPT2
        else rng.choice([h for h in (1, 2, heads) if heads % h == 0])
    )
    head_dim = 0 if kind is HfModelType.GPT2 else rng.choice([0, 16, 24])
    scaling = None
    if kind is not HfModelType.GPT2:
        scaling = rng.choice(
            [
                None,
                RopeScaling(rope_type=RopeType.LINEAR, factor=rng.choice([2.0, 3.5])),
                RopeScaling(
                    rope_type=RopeType.LLAMA3,
                    factor=8.0,
                    original_max_position_embeddings=rng.choice([64, 8192]),
                    low_freq_factor=rng.choice([0.5, 1.0]),
                    high_freq_factor=rng.choice([4.0, 6.0]),
                ),
                RopeScaling(
                    rope_type=RopeType.YARN,
                    factor=rng.choice([4.0, 40.0]),
                    original_max_position_embeddings=4096,
                    beta_fast=rng.choice([32.0, 16.0]),
                    attention_factor=rng.choice([None, 1.1]),
                    mscale=rng.choice([None, 0.707]),
                    mscale_all_dim=rng.choice([None, 1.0]),
                    truncate=rng.choice([True, False]),
                ),
            ]
        )
    qkv = kind is HfModelType.QWEN2 or (kind is HfModelType.LLAMA and rng.random() < 0.5)
    windowed = kind in (HfModelType.MISTRAL, HfModelType.QWEN2) and rng.random() < 0.5
    return ModelArch(
        family=Family.GPT2 if kind is HfModelType.GPT2 else Family.LLAMA,
        hf_model_type=kind,
        num_blocks=rng.randint(1, 6),
        hidden_size=heads * rng.choice([8, 16]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=rng.randint(8, 300),
        vocab_size=rng.randint(10, 70000),
        max_seq_len=rng.choice([128, 4096, 131072]),
        tie_embeddings=rng.random() < 0.5,
        norm_eps=rng.choice([1e-5, 1e-6, 3e-7]),
        rope_theta=10000.0 if kind is HfModelType.GPT2 else rng.choice([10000.0, 5e5, 1e6]),
        rope_scaling=scaling,
        attention_qkv_bias=qkv,
        attention_out_bias=qkv and kind is HfModelType.LLAMA,
        mlp_bias=kind is HfModelType.LLAMA and rng.random() < 0.5,
        sliding_window=rng.choice([64, 4096]) if windowed else None,
    )


def test_config_out_reads_back_as_the_same_arch() -> None:
    archs = [*PRESETS.values(), *(random_arch(random.Random(i)) for i in range(200))]
    assert {arch.model_type for arch in archs} == set(HfModelType)
    for arch in archs:
        config = json.loads(json.dumps(hf_config_from_arch(arch)))  # plain JSON
        assert arch_from_hf_config(config, source="t") == arch


def test_plan_model_dict_round_trips_new_fields_and_old_files_still_load() -> None:
    for seed in range(100):
        model = ModelSpec(name=f"m{seed}", arch=random_arch(random.Random(seed)))
        data = json.loads(json.dumps(model_to_dict(model)))
        assert model_from_dict(data, source="plan.json") == model
    old = model_to_dict(load_model("llama-3-8b"))
    for key in (
        "rope_scaling",
        "attention_qkv_bias",
        "attention_out_bias",
        "mlp_bias",
        "sliding_window",
        "hf_model_type",
    ):
        del old[key]  # a plan file written before these fields existed
    assert model_from_dict(old, source="plan.json") == load_model("llama-3-8b")


def test_presets_carry_their_published_scaling_and_window() -> None:
    for name in ("llama-3.2-1b", "llama-3.2-3b"):
        assert PRESETS[name].rope_scaling == RopeScaling(
            rope_type=RopeType.LLAMA3,
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        )
    assert PRESETS["mistral-7b"].sliding_window == 4096
    assert PRESETS["mistral-7b"].model_type is HfModelType.MISTRAL


def test_sequences_longer_than_the_window_are_refused() -> None:
    model = ModelSpec(
        name="windowed",
        arch=arch_from_hf_config(
            {**LLAMA, "model_type": "mistral", "sliding_window": 64}, source="t"
        ),
    )
    check_seq_len(model, seq_len=64)  # the window covers the sequence: the same computation
    with pytest.raises(ArgumentError) as error:
        check_seq_len(model, seq_len=65)
    # The library names its argument; the CLI names the flag (the test below).
    message = str(error.value)
    assert error.value.argument == "seq_len"
    assert message.startswith("seq_len: got 65; expected at most 64 for windowed")
    assert "window is 64 tokens" in message


def test_plan_refuses_a_sequence_beyond_the_window(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "model_type": "mistral", "sliding_window": 32}))
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        str(path),
        "--global-batch",
        "8",
        "--seq-len",
        "64",
    )
    assert code == 2
    assert "--seq-len: got 64; expected at most 32" in output.replace("\n", "")
    code, output = run_cli(
        "plan",
        "--cluster",
        str(example_path()),
        "--model",
        "mistral-7b",
        "--global-batch",
        "8",
        "--seq-len",
        "8192",
    )
    assert code == 2 and "window is 4096 tokens" in output.replace("\n", "")
