"""``--init-from DIR``: DIR's config.json against the model being trained. Each kind of field
that differs is one line naming the file, the field as config.json spells it and both
values; the same architecture, written by piebald or with fields left out, matches."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from piebald.errors import SpecError
from piebald.specs.hf_config import arch_from_hf_config
from piebald.specs.hf_config_match import check_config_matches, config_mismatch
from piebald.specs.hf_config_write import hf_config_from_arch
from piebald.specs.model import Family, HfModelType, ModelArch, ModelSpec
from piebald.specs.rope_scaling import RopeScaling, RopeType

LLAMA = ModelArch(
    family=Family.LLAMA,
    num_blocks=4,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=176,
    vocab_size=256,
    max_seq_len=256,
    tie_embeddings=False,
)
GPT2 = ModelArch(
    family=Family.GPT2,
    num_blocks=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=4,
    ffn_hidden_size=256,
    vocab_size=101,
    max_seq_len=128,
    tie_embeddings=True,
)
LINEAR = RopeScaling(rope_type=RopeType.LINEAR, factor=2.0)

# (our arch, the changes in theirs, field named, their value, our value)
MISMATCHES: dict[str, tuple[ModelArch, dict[str, Any], str, object, object]] = {
    "model type": (
        LLAMA,
        {"hf_model_type": HfModelType.MISTRAL},
        "model_type",
        "mistral",
        "llama",
    ),
    "family": (LLAMA, dataclasses.asdict(GPT2), "model_type", "gpt2", "llama"),
    "layers": (LLAMA, {"num_blocks": 5}, "num_hidden_layers", 5, 4),
    "hidden": (LLAMA, {"hidden_size": 128}, "hidden_size", 128, 64),
    "heads": (LLAMA, {"num_heads": 8, "head_dim": 16}, "num_attention_heads", 8, 4),
    "kv heads": (LLAMA, {"num_kv_heads": 4}, "num_key_value_heads", 4, 2),
    "head dim": (LLAMA, {"head_dim": 32}, "head_dim", 32, 16),
    "intermediate": (LLAMA, {"ffn_hidden_size": 192}, "intermediate_size", 192, 176),
    "vocab": (LLAMA, {"vocab_size": 300}, "vocab_size", 300, 256),
    "rope theta": (LLAMA, {"rope_theta": 500000.0}, "rope_theta", 500000.0, 10000.0),
    "rope scaling": (
        LLAMA,
        {"rope_scaling": LINEAR},
        "rope_parameters",
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "default"},
    ),
    "rope scaling factor": (
        dataclasses.replace(LLAMA, rope_scaling=LINEAR),
        {"rope_scaling": dataclasses.replace(LINEAR, factor=4.0)},
        "rope_parameters",
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "linear", "factor": 2.0},
    ),
    "norm eps": (LLAMA, {"norm_eps": 1e-6}, "rms_norm_eps", 1e-6, 1e-5),
    "tied": (LLAMA, {"tie_embeddings": True}, "tie_word_embeddings", True, False),
    "attention bias": (
        LLAMA,
        {"attention_qkv_bias": True, "attention_out_bias": True},
        "attention_bias",
        True,
        False,
    ),
    "mlp bias": (LLAMA, {"mlp_bias": True}, "mlp_bias", True, False),
    "window": (
        dataclasses.replace(LLAMA, hf_model_type=HfModelType.MISTRAL),
        {"hf_model_type": HfModelType.MISTRAL, "sliding_window": 128},
        "sliding_window",
        128,
        None,
    ),
    "gpt2 layers": (GPT2, {"num_blocks": 3}, "n_layer", 3, 2),
    "gpt2 width": (GPT2, {"hidden_size": 32}, "n_embd", 32, 64),
    "gpt2 heads": (GPT2, {"num_heads": 2, "num_kv_heads": 2}, "n_head", 2, 4),
    "gpt2 inner": (GPT2, {"ffn_hidden_size": 128}, "n_inner", 128, 256),
    "gpt2 positions": (GPT2, {"max_seq_len": 1024}, "n_positions", 1024, 128),
    "gpt2 eps": (GPT2, {"norm_eps": 1e-6}, "layer_norm_epsilon", 1e-6, 1e-5),
    "gpt2 tied": (GPT2, {"tie_embeddings": False}, "tie_word_embeddings", False, True),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_each_field_kind_that_differs_is_named_with_both_values(case: str) -> None:
    ours, changes, field, their_value, our_value = MISMATCHES[case]
    if "family" in changes:
        changes = {**changes, "family": GPT2.family, "rope_scaling": None}
    theirs = dataclasses.replace(ours, **changes)
    assert config_mismatch(theirs, ours) == (field, their_value, our_value)


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_through_config_json_one_line_naming_file_field_and_both_values(
    case: str, tmp_path: Path
) -> None:
    ours, changes, field, _, our_value = MISMATCHES[case]
    if "family" in changes:
        changes = {**changes, "family": GPT2.family, "rope_scaling": None}
    theirs = dataclasses.replace(ours, **changes)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_arch(theirs)))
    with pytest.raises(SpecError) as error:
        check_config_matches(ModelSpec(name="trained", arch=ours), tmp_path)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: {field}: got ")
    assert f"expected {our_value!r}, the {field} of the model being trained ('trained')" in (
        message
    )
    assert "\n" not in message


def test_llama_context_length_alone_is_not_a_mismatch() -> None:
    """Without RoPE scaling, max_position_embeddings changes nothing that is computed."""
    assert config_mismatch(dataclasses.replace(LLAMA, max_seq_len=4096), LLAMA) is None


@pytest.mark.parametrize("arch", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_the_same_model_matches(arch: ModelArch, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_arch(arch)))
    check_config_matches(ModelSpec(name="m", arch=arch), tmp_path)


def test_fields_left_out_match_as_transformers_resolves_them(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "rms_norm_eps": 1e-5,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_config_matches(ModelSpec(name="m", arch=LLAMA), tmp_path)
    assert arch_from_hf_config(config, source="c").max_seq_len == 2048  # not compared


def test_no_config_json_is_not_compared(tmp_path: Path) -> None:
    check_config_matches(ModelSpec(name="m", arch=LLAMA), tmp_path)


def test_a_config_json_piebald_cannot_read_is_refused_as_anywhere(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_act": "gelu"}))
    with pytest.raises(SpecError, match=r"config\.json: hidden_act: got 'gelu'"):
        check_config_matches(ModelSpec(name="m", arch=LLAMA), tmp_path)
