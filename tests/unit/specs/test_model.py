"""Model presets and Hugging Face configs: parameter counts against published figures,
and the per-layer formulas against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piebald.errors import SpecError
from piebald.specs.model import Family, LayerKind, ModelArch, ModelSpec
from piebald.specs.presets import PRESETS, load_model, model_from_dict, model_to_dict
from piebald.specs.recompute import Recompute

HF = Path(__file__).parents[2] / "data" / "hf"

# Published parameter counts (model cards / papers).
PUBLISHED = {
    "gpt2": 124e6,  # Radford et al. 2019, as counted by Hugging Face: 124M
    "gpt2-medium": 355e6,
    "gpt2-large": 774e6,
    "gpt2-xl": 1.56e9,  # 1.56B as Hugging Face counts it ("1.5B" in the paper)
    "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9,
    "llama-3-8b": 8.03e9,
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-3-70b": 70.6e9,
    "mistral-7b": 7.24e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_matches_published(name: str) -> None:
    model = load_model(name)
    assert model.num_params == pytest.approx(PUBLISHED[name], rel=0.01)


def test_every_preset_is_listed_and_tiny_is_small() -> None:
    assert set(PRESETS) == {*PUBLISHED, "tiny"}
    assert load_model("tiny").num_params < 1_000_000


def test_layer_list_is_embedding_blocks_head() -> None:
    model = load_model("llama-3-8b")
    kinds = [layer.kind for layer in model.layers]
    assert kinds == [LayerKind.EMBEDDING] + [LayerKind.BLOCK] * 32 + [LayerKind.HEAD]
    assert [layer.index for layer in model.layers] == list(range(34))


def test_gpt2_block_formulas_by_hand() -> None:
    h = 768
    block = load_model("gpt2").layers[1]
    assert block.num_params == 12 * h * h + 13 * h
    assert block.matmul_flops_per_token == 2 * 12 * h * h
    assert block.forward_flops_per_token(seq_len=1024) == 2 * 12 * h * h + 4 * 1024 * h
    # Korthikanti et al. 34h + 5as in 16 bits, minus dropout masks (2h) and scores (fused
    # attention); the fp32 log-sum-exp (4 bytes per head) and the two LayerNorms' fp32 mean
    # and rstd (16) are kept whatever the dtype (docs/activation_bytes.md).
    assert block.activation_bytes_per_token(dtype_bytes=2) == 32 * h + 4 * 12 + 16
    assert block.activation_bytes_per_token(dtype_bytes=4) == 64 * h + 4 * 12 + 16
    assert block.activation_bytes_per_token(dtype_bytes=2, recompute=Recompute.FULL) == 2 * h


def test_llama_block_formulas_by_hand() -> None:
    h, kv, f, heads = 4096, 1024, 14336, 32
    block = load_model("llama-3-8b").layers[1]
    assert block.num_params == 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    # Per RMSNorm an fp32 input copy (4h) and rstd (4), the normalised input and the output
    # (2 x 2h); Q, K, V, attention output; four SwiGLU tensors; the fp32 log-sum-exp.
    assert block.activation_bytes_per_token(dtype_bytes=2) == (
        2 * (4 * h + 4 + 2 * 2 * h) + 2 * (2 * h + 2 * kv) + 4 * 2 * f + 4 * heads
    )
    head = load_model("llama-3-8b").layers[-1]
    vocab = 128256
    # The final norm as in a block, the fp32 log-softmax (4V) and the int64 labels (8).
    assert head.activation_bytes_per_token(dtype_bytes=2) == 4 * h + 4 + 2 * 2 * h + 4 * vocab + 8
    assert load_model("llama-3-8b").layers[0].activation_bytes_per_token(dtype_bytes=2) == 8


def test_tied_head_counts_weight_once_but_a_separate_stage_keeps_a_replica() -> None:
    model = load_model("gpt2")
    head = model.layers[-1]
    assert head.num_params == 2 * 768  # final LayerNorm only
    assert head.num_tied_params == 50257 * 768
    whole = model.stage_params(0, model.num_layers)
    assert whole == model.num_params
    last_stage = model.stage_params(7, model.num_layers)
    expected = sum(layer.num_params for layer in model.layers[7:]) + 50257 * 768
    assert last_stage == expected


def test_training_flops_are_three_forwards() -> None:
    model = load_model("llama-3-8b")
    forward = model.forward_flops_per_token(seq_len=2048)
    assert model.training_flops_per_token(seq_len=2048) == 3 * forward
    # 6N rule of thumb (Kaplan et al. 2020) plus attention: within 15% at 2k context.
    assert 3 * forward == pytest.approx(6 * model.num_params, rel=0.15)


@pytest.mark.parametrize(
    ("directory", "preset"),
    [("gpt2", "gpt2"), ("llama-3-8b", "llama-3-8b"), ("mistral-7b", "mistral-7b")],
)
def test_hugging_face_config_matches_preset(directory: str, preset: str) -> None:
    from_file = load_model(str(HF / directory / "config.json"))
    from_dir = load_model(str(HF / directory))
    assert from_file.arch == from_dir.arch
    assert from_file.arch == load_model(preset).arch  # the window of mistral-7b included
    assert from_file.name == directory


def test_hugging_face_config_errors_name_file_and_field(tmp_path: Path) -> None:
    config = json.loads((HF / "llama-3-8b" / "config.json").read_text())
    del config["hidden_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(SpecError, match=r"config\.json: hidden_size: expected this field"):
        load_model(str(path))
    path.write_text(json.dumps({**config, "hidden_size": 4096, "model_type": "bert"}))
    with pytest.raises(SpecError, match="model_type"):
        load_model(str(path))
    path.write_text(json.dumps({**config, "hidden_size": 4096, "num_key_value_heads": 5}))
    with pytest.raises(SpecError, match="num_key_value_heads: got 5"):
        load_model(str(path))
    path.write_text("{not json")
    with pytest.raises(SpecError, match="JSON"):
        load_model(str(path))


def test_unknown_model_name_suggests_a_preset() -> None:
    with pytest.raises(SpecError, match="did you mean 'llama-3-8b'"):
        load_model("llama-3-8")


def test_model_dict_round_trip() -> None:
    for name in PRESETS:
        model = load_model(name)
        assert model_from_dict(model_to_dict(model), source="t") == model


def test_arch_rejects_inconsistent_heads() -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelArch(
            family=Family.LLAMA,
            num_blocks=1,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=3,
            ffn_hidden_size=128,
            vocab_size=10,
            max_seq_len=16,
            tie_embeddings=False,
        )
    assert ModelSpec(name="x", arch=PRESETS["tiny"]).num_layers == 6
