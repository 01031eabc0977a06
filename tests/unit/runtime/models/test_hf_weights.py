"""Hugging Face weights: transformers' own GPT2LMHeadModel / LlamaForCausalLM, saved as
safetensors, loaded into our parts, give the same logits (checks the architecture and the
loader at once); and every loading problem is one clear line."""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from piebald.errors import SpecError
from piebald.runtime.models import build_stage_part, load_hf_weights
from piebald.runtime.models.hf_names import hf_tensors
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.presets import load_model

VOCAB = 97


def perturb(model: torch.nn.Module) -> None:
    """Move every weight off its initial value (norm scales 1, biases 0) so that a mix-up
    of two tensors of equal shape cannot go unnoticed."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def hf_gpt2(directory: Path, *, tied: bool) -> tuple[torch.nn.Module, ModelSpec]:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=3,
        n_embd=32,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=40,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",  # explicit softmax: independent of our SDPA call
    )
    hf = transformers.GPT2LMHeadModel(config)
    arch = ModelArch(
        family=Family.GPT2,
        num_blocks=3,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=128,
        vocab_size=VOCAB,
        max_seq_len=40,
        tie_embeddings=tied,
    )
    return save(hf, directory), ModelSpec(name="hf-gpt2", arch=arch)


def hf_llama(directory: Path, *, tied: bool, head_dim: int) -> tuple[torch.nn.Module, ModelSpec]:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=3,
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=head_dim,
        intermediate_size=80,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    hf = transformers.LlamaForCausalLM(config)
    assert hf.config.rope_parameters["rope_theta"] == 500000.0
    arch = ModelArch(
        family=Family.LLAMA,
        num_blocks=3,
        hidden_size=48,
        num_heads=6,
        num_kv_heads=2,
        head_dim=head_dim,
        ffn_hidden_size=80,
        vocab_size=VOCAB,
        max_seq_len=64,
        tie_embeddings=tied,
        norm_eps=1e-6,
        rope_theta=500000.0,
    )
    return save(hf, directory), ModelSpec(name="hf-llama", arch=arch)


def save(hf: torch.nn.Module, directory: Path) -> torch.nn.Module:
    perturb(hf)
    hf.eval()
    hf.save_pretrained(directory, safe_serialization=True)
    return hf


CASES = {
    "gpt2-tied": lambda d: hf_gpt2(d, tied=True),
    "gpt2-untied": lambda d: hf_gpt2(d, tied=False),
    "llama-tied": lambda d: hf_llama(d, tied=True, head_dim=8),
    "llama-untied-wide-heads": lambda d: hf_llama(d, tied=False, head_dim=16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loaded_parts_reproduce_transformers_logits(case: str, tmp_path: Path) -> None:
    hf, model = CASES[case](tmp_path)
    # The config.json transformers wrote describes the same architecture to piebald.
    assert load_model(str(tmp_path)).arch == model.arch
    tokens = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
    n = model.num_layers
    for bounds in ([0, n], [0, 2, n], [0, 1, 3, n]):
        # A different seed: every value must come from the files.
        parts = [
            build_stage_part(model, layer_start=a, layer_end=b, seed=11)
            for a, b in itertools.pairwise(bounds)
        ]
        x = tokens
        with torch.no_grad():
            for part in parts:
                load_hf_weights(part, tmp_path)
                x = part(x)
        torch.testing.assert_close(x, expected, rtol=0, atol=1e-5)


def test_weights_load_into_bf16_parts(tmp_path: Path) -> None:
    hf, model = hf_llama(tmp_path, tied=False, head_dim=8)
    part = build_stage_part(model, layer_start=0, layer_end=2, dtype=torch.bfloat16)
    load_hf_weights(part, tmp_path)
    expected = hf.model.embed_tokens.weight.detach().to(torch.bfloat16)
    assert torch.equal(part.layer(0).tok_embeddings.weight, expected)


def whole_checkpoint(model: ModelSpec, *, unprefixed: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of ``model`` (random) under the names the table says, for the error
    paths (the transformers tests above check the table itself)."""
    whole = build_stage_part(model, layer_start=0, layer_end=model.num_layers, seed=5)
    parameters = dict(whole.named_parameters())
    tensors = {}
    for tensor in hf_tensors(
        model.arch, layer_start=0, layer_end=model.num_layers, has_embedding=True
    ):
        value = parameters[tensor.local_name].detach()
        name = tensor.hf_names[-1] if unprefixed else tensor.hf_names[0]
        tensors[name] = (value.t() if tensor.transpose else value).contiguous()
    return tensors


def test_unprefixed_names_load_too(tmp_path: Path) -> None:
    """OpenAI's GPT-2 files and bare LlamaModel checkpoints have no 'model.' prefix."""
    model = load_model("tiny")
    tensors = whole_checkpoint(model, unprefixed=True)
    assert "embed_tokens.weight" in tensors
    save_file(tensors, str(tmp_path / "model.safetensors"))
    part = build_stage_part(model, layer_start=0, layer_end=1)
    load_hf_weights(part, tmp_path)
    assert torch.equal(part.layer(0).tok_embeddings.weight, tensors["embed_tokens.weight"])


def test_loading_problems_are_one_line_naming_file_and_tensor(tmp_path: Path) -> None:
    model = load_model("tiny")
    embedding = build_stage_part(model, layer_start=0, layer_end=1)

    missing = tmp_path / "nowhere"
    with pytest.raises(SpecError, match=r"nowhere: expected a directory .*no such directory"):
        load_hf_weights(embedding, missing)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecError, match=r"empty: expected \*.safetensors .*found none"):
        load_hf_weights(embedding, empty)

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SpecError, match=r"corrupt/model.safetensors: expected a safetensors file"):
        load_hf_weights(embedding, corrupt)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    tensors = whole_checkpoint(model)
    save_file(
        {**tensors, "model.embed_tokens.weight": torch.zeros(256, 32)},
        str(wrong / "a.safetensors"),
    )
    with pytest.raises(SpecError) as error:
        load_hf_weights(embedding, wrong)
    message = str(error.value)
    assert "\n" not in message
    assert "wrong/a.safetensors: model.embed_tokens.weight: got [256, 32]" in message
    assert "expected shape [256, 64]" in message

    # Any stage refuses a checkpoint that lacks a tensor of the whole model ...
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    save_file(
        {k: v for k, v in tensors.items() if k != "lm_head.weight"}, str(lacking / "a.safetensors")
    )
    with pytest.raises(SpecError) as error:
        load_hf_weights(embedding, lacking)
    message = str(error.value)
    assert "\n" not in message
    assert "lacking/*.safetensors: lm_head.weight: expected a tensor for layers.5.output" in message
    assert "(tensor missing)" in message

    # ... or that holds tensors no parameter reads (an attention bias tiny does not have).
    extra = tmp_path / "extra"
    extra.mkdir()
    unread = {f"model.layers.{i}.self_attn.q_proj.bias": torch.zeros(64) for i in range(4)}
    save_file({**tensors, **unread}, str(extra / "a.safetensors"))
    with pytest.raises(SpecError) as error:
        load_hf_weights(embedding, extra)
    message = str(error.value)
    assert "\n" not in message
    assert "4 would be left unread (model.layers.0.self_attn.q_proj.bias" in message
    assert "and 1 more" in message


def test_gpt2_conv1d_shape_errors_name_the_stored_layout(tmp_path: Path) -> None:
    arch = ModelArch(
        family=Family.GPT2,
        num_blocks=1,
        hidden_size=8,
        num_heads=2,
        num_kv_heads=2,
        ffn_hidden_size=32,
        vocab_size=11,
        max_seq_len=4,
        tie_embeddings=True,
    )
    model = ModelSpec(name="g", arch=arch)
    block = build_stage_part(model, layer_start=1, layer_end=2)
    # Our Linear is [24, 8]; HF's Conv1D stores [8, 24]. A file holding [24, 8] is wrong.
    tensors = whole_checkpoint(model)
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (8, 24)
    tensors["transformer.h.0.attn.c_attn.weight"] = torch.zeros(24, 8)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        SpecError, match=r"h.0.attn.c_attn.weight: got \[24, 8\]; expected shape \[8, 24\]"
    ):
        load_hf_weights(block, tmp_path)


def _tiny_checkpoint(directory: Path) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    model = load_model("tiny")
    tensors = whole_checkpoint(model)
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    return model, tensors


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory"])
def test_a_weight_file_that_is_no_regular_file_is_refused_before_opening(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO named *.safetensors blocked safe_open forever beside good weights."""
    model, _ = _tiny_checkpoint(tmp_path / "w")
    odd = tmp_path / "w" / "zz.safetensors"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "zero":
        odd.symlink_to("/dev/zero")
    else:
        odd.mkdir()
    part = build_stage_part(model, layer_start=0, layer_end=1)
    signal.alarm(20)  # a regression would block here, not fail
    try:
        with pytest.raises(SpecError) as error:
            load_hf_weights(part, tmp_path / "w")
    finally:
        signal.alarm(0)
    assert str(error.value).startswith(f"{odd}: expected a regular file (it is a")


def test_a_tensor_in_two_files_is_refused_naming_both(tmp_path: Path) -> None:
    """A stale shard holding every tensor again (as zeros) won by name order, silently."""
    model, tensors = _tiny_checkpoint(tmp_path / "w")
    save_file({k: torch.zeros_like(v) for k, v in tensors.items()}, str(tmp_path / "w" / "z.st"))
    (tmp_path / "w" / "z.st").rename(tmp_path / "w" / "z-old.safetensors")
    part = build_stage_part(model, layer_start=0, layer_end=1)
    with pytest.raises(SpecError) as error:
        load_hf_weights(part, tmp_path / "w")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'w' / 'z-old.safetensors'}: ")
    assert f"expected each tensor in one file (also in {tmp_path / 'w' / 'model.safetensors'}" in (
        message
    )


def test_the_index_decides_which_file_each_tensor_is_read_from(tmp_path: Path) -> None:
    model, tensors = _tiny_checkpoint(tmp_path / "w")
    directory = tmp_path / "w"
    save_file({k: torch.zeros_like(v) for k, v in tensors.items()}, str(directory / "z.st"))
    (directory / "z.st").rename(directory / "z-old.safetensors")
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(tensors, "model.safetensors")}))
    part = build_stage_part(model, layer_start=0, layer_end=1)
    load_hf_weights(part, directory)
    loaded = part.layer(0).tok_embeddings.weight
    assert torch.equal(loaded, tensors["model.embed_tokens.weight"])  # not the zeros

    first = next(iter(tensors))
    cases = {
        "z-old.safetensors": None,  # the index may name the other copy: it is read
        "nope.safetensors": "expected a file in",
        "../model.safetensors": "expected the name of a *.safetensors file in",
    }
    for file, expected in cases.items():
        index.write_text(
            json.dumps({"weight_map": {**dict.fromkeys(tensors, "model.safetensors"), first: file}})
        )
        if expected is None:
            load_hf_weights(build_stage_part(model, layer_start=0, layer_end=1), directory)
            continue
        with pytest.raises(SpecError) as error:
            load_hf_weights(part, directory)
        assert str(error.value).startswith(f"{index}: weight_map.{first}: got {file!r}; ")
        assert expected in str(error.value)
    # A map that puts a tensor in a file without it; then a map of nothing.
    save_file({"other": torch.zeros(1)}, str(directory / "b.safetensors"))
    index.write_text(
        json.dumps(
            {"weight_map": {**dict.fromkeys(tensors, "model.safetensors"), first: "b.safetensors"}}
        )
    )
    with pytest.raises(SpecError, match=f"expected the file holding {first} \\(it does not\\)"):
        load_hf_weights(part, directory)
    index.write_text('{"weight_map": {}}')
    with pytest.raises(SpecError, match=r"weight_map: got \{\}; expected a mapping"):
        load_hf_weights(part, directory)
    index.write_text("[" * 1000 + "]" * 1000)
    with pytest.raises(SpecError, match="at most 64 levels deep"):
        load_hf_weights(part, directory)


def test_an_integer_tensor_for_a_float_parameter_is_refused(tmp_path: Path) -> None:
    model = load_model("tiny")
    tensors = whole_checkpoint(model)
    name = next(k for k in tensors if k.endswith("mlp.up_proj.weight"))
    tensors[name] = tensors[name].to(torch.int32)
    (tmp_path / "w").mkdir()
    save_file(tensors, str(tmp_path / "w" / "model.safetensors"))
    layer = int(name.split(".")[2]) + 1  # stage layer 0 is the embedding
    part = build_stage_part(model, layer_start=layer, layer_end=layer + 1)
    with pytest.raises(SpecError) as error:
        load_hf_weights(part, tmp_path / "w")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'w' / 'model.safetensors'}: {name}: got 'int32'; ")
    assert "expected a floating-point tensor for" in message and "float32" in message
