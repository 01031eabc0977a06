"""Architectures against transformers (the oracle): random small LlamaForCausalLM with each
RoPE scaling (sequences longer than the original context, so the scaling matters), with
Llama's attention and MLP biases, Qwen2ForCausalLM tied and untied, and a Mistral whose
window covers the sequence. Each is saved with save_pretrained, read back through
arch_from_hf_config + load_hf_weights, and must give transformers' logits, and for some its
loss and the gradient of every parameter, in fp32.

Also: hf_config_from_arch builds, in transformers, a model with the parameter shapes of ours.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from piebald.runtime.models import build_stage_part, load_hf_weights, token_loss_sum
from piebald.runtime.models.stage_part import build_layer_module
from piebald.specs.hf_config import arch_from_hf_config
from piebald.specs.hf_config_write import hf_config_from_arch
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.presets import PRESETS

transformers = pytest.importorskip("transformers")

VOCAB = 97
SEQ = 48  # longer than the original context (32) of the scaled RoPE cases
COMMON = dict(
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    vocab_size=VOCAB,
    rms_norm_eps=1e-6,
    bos_token_id=0,
    eos_token_id=0,
    attn_implementation="eager",  # explicit softmax: independent of our SDPA call
)
ORIGINAL = 32
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-linear": (
        "llama",
        dict(
            max_position_embeddings=128,
            rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        ),
    ),
    "llama-llama3": (
        "llama",
        dict(
            max_position_embeddings=128,
            # head dim 8, theta 10000: wavelengths 6.3, 63, 628, 6283 fall in the kept band
            # (< 32/4), the smoothed band and the divided band (> 32/1).
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": ORIGINAL,
                "rope_theta": 10000.0,
            },
            tie_word_embeddings=True,
        ),
    ),
    "llama-yarn": (
        "llama",
        dict(
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": ORIGINAL,
                "rope_theta": 10000.0,
            },
        ),
    ),
    "llama-yarn-mscale": (
        "llama",
        dict(
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": ORIGINAL,
                "rope_theta": 500.0,
                "mscale": 0.8,
                "mscale_all_dim": 0.5,
                "beta_fast": 16.0,
                "truncate": False,
            },
        ),
    ),
    "llama-biases": (
        "llama",
        dict(
            max_position_embeddings=64,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    "qwen2-tied": (
        "qwen2",
        dict(max_position_embeddings=64, tie_word_embeddings=True, rope_theta=1e6),
    ),
    "qwen2-untied": (
        "qwen2",
        dict(max_position_embeddings=64, tie_word_embeddings=False, use_sliding_window=False),
    ),
    # What piebald accepts of Qwen2's window: on every layer (max_window_layers 0; the window
    # covers the sequence, as piebald requires), or on none (max_window_layers at least the
    # number of layers: a window shorter than the sequence that transformers does not apply).
    "qwen2-window-every-layer": (
        "qwen2",
        dict(
            max_position_embeddings=64,
            use_sliding_window=True,
            sliding_window=SEQ,
            max_window_layers=0,
        ),
    ),
    "qwen2-window-on-no-layer": (
        "qwen2",
        dict(
            max_position_embeddings=64,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=2,
        ),
    ),
    "mistral-window-covers-seq": (
        "mistral",
        dict(max_position_embeddings=64, sliding_window=SEQ),
    ),
}
GRADIENT_CASES = ("llama-llama3", "llama-yarn", "llama-biases", "qwen2-tied", "qwen2-untied")


def perturb(model: torch.nn.Module) -> None:
    """Move every weight off its initial value (norm scales 1, biases 0) so that a mix-up
    of two tensors of equal shape cannot go unnoticed."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def saved_hf_model(case: str, directory: Path) -> torch.nn.Module:
    model_type, extra = CASES[case]
    config = transformers.AutoConfig.for_model(model_type, **(COMMON | extra))
    torch.manual_seed(0)  # transformers draws its initial weights from the global stream
    hf = transformers.AutoModelForCausalLM.from_config(config)
    perturb(hf)
    hf.save_pretrained(directory, safe_serialization=True)
    return hf


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to 1e-5 relative, where entries near zero are measured against the tensor's
    largest entry (fp32 sums of a few hundred terms differ in their last bits by order)."""
    scale = float(expected.detach().abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale)


def hf_name(local: str, *, family: Family) -> tuple[str, bool]:
    """The transformers parameter our parameter ``local`` corresponds to, and whether it is
    stored transposed (GPT-2's Conv1D): the naming convention, written out independently of
    the loader."""
    index, rest = re.fullmatch(r"layers\.(\d+)\.(.+)", local).groups()  # type: ignore[union-attr]
    block = int(index) - 1
    if family is Family.GPT2:
        if rest in ("tok_embeddings.weight", "pos_embeddings.weight"):
            return "transformer." + {"tok": "wte", "pos": "wpe"}[rest[:3]] + ".weight", False
        if rest.startswith("norm."):
            return "transformer.ln_f." + rest.split(".")[-1], False
        if rest == "output.weight":
            return "lm_head.weight", False
        transposed = rest.endswith(".weight") and not rest.startswith("ln_")
        return f"transformer.h.{block}.{rest}", transposed
    fixed = {
        "tok_embeddings.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    if rest in fixed:
        return fixed[rest], False
    module, kind = rest.rsplit(".", 1)
    renamed = {
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attention.wq": "self_attn.q_proj",
        "attention.wk": "self_attn.k_proj",
        "attention.wv": "self_attn.v_proj",
        "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w2": "mlp.down_proj",
        "feed_forward.w3": "mlp.up_proj",
    }[module]
    return f"model.layers.{block}.{renamed}.{kind}", False


@pytest.mark.parametrize("case", sorted(CASES))
def test_loaded_model_reproduces_transformers(case: str, tmp_path: Path) -> None:
    hf = saved_hf_model(case, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    model = ModelSpec(name=case, arch=arch_from_hf_config(config, source="config.json"))
    part = build_stage_part(model, layer_start=0, layer_end=model.num_layers, seed=3)
    load_hf_weights(part, tmp_path)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))

    hf.train()  # dropout is 0: train mode only enables gradients as our runtime uses them
    output = hf(input_ids=tokens)
    logits = part(tokens)
    assert_close_to_scale(logits, output.logits)
    if case not in GRADIENT_CASES:
        return
    # Mean token cross-entropy, computed by each side from its own logits.
    expected_loss = torch.nn.functional.cross_entropy(
        output.logits.reshape(-1, VOCAB), labels.reshape(-1)
    )
    loss = token_loss_sum(logits, labels) / labels.numel()
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
    expected_loss.backward()
    loss.backward()
    hf_parameters = dict(hf.named_parameters())
    checked = set()
    for name, parameter in part.named_parameters():
        theirs, transposed = hf_name(name, family=model.arch.family)
        grad = hf_parameters[theirs].grad
        assert grad is not None and parameter.grad is not None, name
        assert_close_to_scale(parameter.grad, grad.t() if transposed else grad)
        checked.add(theirs)
    assert checked == set(hf_parameters)  # every transformers parameter was compared


def shapes_of_ours(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    shapes = {}
    model = ModelSpec(name="x", arch=arch)
    for index in range(model.num_layers):
        with torch.device("meta"):
            module = build_layer_module(arch, index, head_owns_output=not arch.tie_embeddings)
        for name, parameter in module.named_parameters():
            theirs, transposed = hf_name(f"layers.{index}.{name}", family=arch.family)
            shape = tuple(parameter.shape)
            shapes[theirs] = shape[::-1] if transposed else shape
    return shapes


SHAPE_ARCHS = {
    **{name: PRESETS[name] for name in ("tiny", "gpt2", "llama-3.2-1b", "mistral-7b")},
    **{
        case: arch_from_hf_config(
            {"model_type": CASES[case][0], **COMMON, **CASES[case][1]}, source="t"
        )
        for case in ("qwen2-untied", "qwen2-tied", "llama-biases")
    },
}


@pytest.mark.parametrize("name", sorted(SHAPE_ARCHS))
def test_written_config_builds_our_parameter_shapes_in_transformers(name: str) -> None:
    arch = SHAPE_ARCHS[name]
    config_json = hf_config_from_arch(arch)
    config = transformers.AutoConfig.for_model(**json.loads(json.dumps(config_json)))
    with torch.device("meta"):  # no memory: a billion-parameter preset builds in milliseconds
        hf = transformers.AutoModelForCausalLM.from_config(config)
    theirs = {n: tuple(p.shape) for n, p in hf.named_parameters()}
    if arch.tie_embeddings:
        theirs.pop("lm_head.weight", None)  # the embedding's table (tied: one parameter)
    assert theirs == shapes_of_ours(arch)
    # The cost model counts the parameters transformers has (biases included).
    assert ModelSpec(name=name, arch=arch).num_params == sum(p.numel() for p in hf.parameters())
    # transformers writes the config back in its own normalised form; it reads as the same
    # architecture.
    assert arch_from_hf_config(config.to_dict(), source="t") == arch
