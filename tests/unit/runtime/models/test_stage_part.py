"""Stage parts: parameter counts against the ModelSpec formulas, any split equal to the whole
model (weights, forward, gradients, tied embeddings), deterministic initialisation."""

from __future__ import annotations

import dataclasses
import itertools
from typing import cast

import pytest
import torch
import torch.distributed as dist
from torch import nn

from piebald.runtime.models import build_layer_module, build_stage_part, token_loss_sum
from piebald.runtime.models.stage_part import StagePart
from piebald.runtime.models.tensor_parallel import split_stage_part
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.presets import PRESETS, load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout


def small_model(family: Family, *, tied: bool, head_dim: int = 0) -> ModelSpec:
    """A few-block model of either family; head_dim != hidden/heads is allowed for Llama."""
    gpt2 = family is Family.GPT2
    arch = ModelArch(
        family=family,
        num_blocks=3,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=4 if gpt2 else 2,
        ffn_hidden_size=128 if gpt2 else 72,
        vocab_size=61,
        max_seq_len=24,
        tie_embeddings=tied,
        head_dim=head_dim,
        rope_theta=500000.0,
    )
    return ModelSpec(name=f"small-{family.value}-{'tied' if tied else 'untied'}", arch=arch)


MODELS = [
    small_model(Family.GPT2, tied=True),
    small_model(Family.GPT2, tied=False),
    small_model(Family.LLAMA, tied=True),
    small_model(Family.LLAMA, tied=False, head_dim=12),
    load_model("tiny"),
]


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_layer_module_has_the_specs_parameter_count(name: str) -> None:
    """Built on the meta device, so even llama-3-70b costs nothing."""
    model = load_model(name)
    arch = model.arch
    for spec in (model.layers[0], model.layers[1], model.layers[-1]):
        with torch.device("meta"):
            owning = build_layer_module(arch, spec.index, head_owns_output=True)
            shared = build_layer_module(arch, spec.index, head_owns_output=False)
        # A head on a stage without the embedding holds a replica of the tied table.
        assert count(owning) == spec.num_params + spec.num_tied_params
        if arch.tie_embeddings:
            assert count(shared) == spec.num_params


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_parts_store_what_the_spec_says_a_stage_stores(model: ModelSpec) -> None:
    n = model.num_layers
    for start, end in [(0, n), (0, 1), (0, 2), (1, n - 1), (2, n), (n - 1, n)]:
        part = build_stage_part(model, layer_start=start, layer_end=end)
        assert count(part) == model.stage_params(start, end)
        for index in range(start, end):
            spec = model.layers[index]
            # The head of a part without the embedding holds a replica of the tied table.
            replica = spec.num_tied_params if start > 0 else 0
            assert count(part.layer(index)) == spec.num_params + replica


BIASED_LLAMA = ModelSpec(
    name="small-llama-biases",
    arch=dataclasses.replace(
        MODELS[3].arch, attention_qkv_bias=True, attention_out_bias=True, mlp_bias=True
    ),
)


@pytest.mark.parametrize("model", [*MODELS[:4], BIASED_LLAMA], ids=lambda m: m.name)
def test_a_members_slice_stores_what_the_spec_says(model: ModelSpec) -> None:
    # Member 1 of a tensor group of 2: every layer as ``layers_at(2)`` counts it, and what
    # it keeps whole (not split: norms, row biases, embedding, head) is ``num_whole_params``.
    part = build_stage_part(model, layer_start=0, layer_end=model.num_layers)
    # No collective runs while splitting; the group is only kept for the passes.
    group = cast(dist.ProcessGroup, object())
    split = split_stage_part(
        part, degree=2, position=1, positions=(0, 1), group=group, layout=TensorLayout.SEQUENCE
    )
    for spec in model.layers_at(2, TensorLayout.SEQUENCE):
        named = dict(part.layer(spec.index).named_parameters())
        prefix = f"layers.{spec.index}."
        whole = sum(p.numel() for n, p in named.items() if prefix + n not in split.params)
        # The part holds the embedding: a tied head uses its table, no replica.
        assert sum(p.numel() for p in named.values()) == spec.num_params
        assert whole == spec.num_whole_params, spec.kind


SPLITS = [[0, 2, 5], [0, 1, 4, 5], [0, 3, 5]]  # boundaries of the 5 layers of a 3-block model


def build_parts(model: ModelSpec, bounds: list[int], *, seed: int = 0) -> list[StagePart]:
    return [
        build_stage_part(model, layer_start=a, layer_end=b, seed=seed)
        for a, b in itertools.pairwise(bounds)
    ]


def backward_chain(parts: list[StagePart], tokens: torch.Tensor, labels: torch.Tensor) -> None:
    """Backward stage by stage, handing each boundary's gradient upstream like a pipeline."""
    inputs = [tokens]
    outputs = []
    x = tokens
    for part in parts:
        y = part(x)
        outputs.append(y)
        x = y.detach().requires_grad_(True) if not part.has_head else y
        inputs.append(x)
    token_loss_sum(outputs[-1], labels).backward()
    for stage in range(len(parts) - 2, -1, -1):
        outputs[stage].backward(inputs[stage + 1].grad)


@pytest.mark.parametrize("model", MODELS[:4], ids=lambda m: m.name)
@pytest.mark.parametrize("bounds", SPLITS, ids=str)
def test_any_split_equals_the_whole_model(model: ModelSpec, bounds: list[int]) -> None:
    whole = build_stage_part(model, layer_start=0, layer_end=model.num_layers, seed=3)
    parts = build_parts(model, bounds, seed=3)
    whole_params = dict(whole.named_parameters())

    # Weights: every parameter of every part is the whole model's, under the same name.
    for part in parts:
        tied = {t.local_name: t for t in part.tied_parameters()}
        for name, parameter in part.named_parameters():
            canonical = tied[name].canonical_name if name in tied else name
            assert torch.equal(parameter, whole_params[canonical]), name

    # Forward: the chained parts compute the whole model's logits.
    tokens = torch.randint(
        0, model.arch.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1)
    )
    labels = tokens.roll(-1, dims=1)
    with torch.no_grad():
        expected = whole(tokens)
        got = tokens
        for part in parts:
            got = part(got)
    assert got.shape == (2, 20, model.arch.vocab_size)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)

    # Backward: each weight's gradient equals the whole model's; the two copies of a tied
    # table, summed, give the whole model's gradient of its single table.
    token_loss_sum(whole(tokens), labels).backward()
    backward_chain(parts, tokens, labels)
    tied_sum = None
    for part in parts:
        tied = {t.local_name: t for t in part.tied_parameters()}
        for name, parameter in part.named_parameters():
            assert parameter.grad is not None, name
            if name in tied:
                tied_sum = parameter.grad if tied_sum is None else tied_sum + parameter.grad
                continue
            torch.testing.assert_close(
                parameter.grad, whole_params[name].grad, rtol=1e-5, atol=1e-6
            )
    if model.arch.tie_embeddings:
        assert tied_sum is not None
        table = whole_params["layers.0.tok_embeddings.weight"].grad
        torch.testing.assert_close(tied_sum, table, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", MODELS[:4], ids=lambda m: m.name)
def test_tied_parameters_name_both_ends_only_across_stages(model: ModelSpec) -> None:
    n = model.num_layers
    whole = build_stage_part(model, layer_start=0, layer_end=n)
    first = build_stage_part(model, layer_start=0, layer_end=2)
    middle = build_stage_part(model, layer_start=2, layer_end=n - 1)
    last = build_stage_part(model, layer_start=n - 1, layer_end=n)
    assert whole.tied_parameters() == () and middle.tied_parameters() == ()
    if not model.arch.tie_embeddings:
        assert first.tied_parameters() == () and last.tied_parameters() == ()
        return
    (owner,) = first.tied_parameters()
    (replica,) = last.tied_parameters()
    assert owner.canonical_name == replica.canonical_name == "layers.0.tok_embeddings.weight"
    assert (owner.layer_index, owner.peer_layer_index) == (0, n - 1)
    assert (replica.layer_index, replica.peer_layer_index) == (n - 1, 0)
    assert replica.local_name == f"layers.{n - 1}.output.weight"
    assert dict(last.named_parameters())[replica.local_name] is replica.parameter
    # The replica starts as a copy of the embedding table, but is its own tensor.
    assert torch.equal(replica.parameter, owner.parameter)
    assert replica.parameter.data_ptr() != owner.parameter.data_ptr()


def test_initialisation_depends_on_seed_and_layer_only() -> None:
    model = load_model("tiny")
    n = model.num_layers
    torch.manual_seed(123)
    rng_before = torch.get_rng_state()
    a = dict(build_stage_part(model, layer_start=0, layer_end=n, seed=5).named_parameters())
    assert torch.equal(torch.get_rng_state(), rng_before), "global RNG was consumed"
    torch.manual_seed(999)  # the global RNG has no say
    b = dict(build_stage_part(model, layer_start=2, layer_end=n, seed=5).named_parameters())
    c = dict(build_stage_part(model, layer_start=2, layer_end=n, seed=6).named_parameters())
    for name in b:
        assert torch.equal(a[name], b[name])
    name = "layers.2.attention.wq.weight"
    assert not torch.equal(b[name], c[name])
    # Each layer has its own stream: blocks 1 and 2 start different.
    assert not torch.equal(a["layers.1.attention.wq.weight"], a[name])
    # GPT-2 scheme: N(0, 0.02), residual projections scaled by 1/sqrt(2 * num_blocks).
    assert a[name].std().item() == pytest.approx(0.02, rel=0.1)
    residual = a["layers.2.attention.wo.weight"].std().item()
    assert residual == pytest.approx(0.02 / (2 * model.arch.num_blocks) ** 0.5, rel=0.1)


def test_dtype_and_device_only_cast_the_same_values() -> None:
    model = load_model("tiny")
    fp32 = build_stage_part(model, layer_start=0, layer_end=3)
    bf16 = build_stage_part(model, layer_start=0, layer_end=3, dtype=torch.bfloat16, device="cpu")
    for (name, p32), (_, p16) in zip(fp32.named_parameters(), bf16.named_parameters(), strict=True):
        assert p16.dtype == torch.bfloat16
        assert torch.equal(p32.to(torch.bfloat16), p16), name
    out = bf16(torch.randint(0, 256, (2, 8)))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 64)


@pytest.mark.parametrize("model", [MODELS[0], MODELS[4]], ids=lambda m: m.name)
def test_recompute_leaves_gradients_unchanged(model: ModelSpec) -> None:
    tokens = torch.randint(0, model.arch.vocab_size, (2, 16))
    grads = []
    for recompute in Recompute:
        part = build_stage_part(model, layer_start=0, layer_end=model.num_layers)
        part.recompute = recompute
        token_loss_sum(part(tokens), tokens).backward()
        grads.append({n: p.grad for n, p in part.named_parameters()})
    for name, grad in grads[0].items():
        for recomputed in grads[1:]:  # selective, full
            torch.testing.assert_close(recomputed[name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("model", [MODELS[0], MODELS[3]], ids=lambda m: m.name)
def test_attention_is_causal(model: ModelSpec) -> None:
    part = build_stage_part(model, layer_start=0, layer_end=model.num_layers)
    tokens = torch.randint(
        0, model.arch.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0)
    )
    changed = tokens.clone()
    changed[0, 7] = (tokens[0, 7] + 1) % model.arch.vocab_size
    with torch.no_grad():
        a, b = part(tokens), part(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=0)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_bad_layer_ranges_and_long_gpt2_sequences_are_refused() -> None:
    model = load_model("tiny")
    for start, end in [(0, 0), (3, 2), (-1, 2), (0, model.num_layers + 1)]:
        with pytest.raises(ValueError, match=rf"\[{start}, {end}\).*num_layers \(6\)"):
            build_stage_part(model, layer_start=start, layer_end=end)
    gpt2 = MODELS[0]
    part = build_stage_part(gpt2, layer_start=0, layer_end=1)
    with pytest.raises(ValueError, match="sequence length 25 exceeds the model's 24"):
        part(torch.zeros(1, 25, dtype=torch.int64))
