"""Weight decay reaches matrices only (embeddings, projections, the head), never norm gains
or biases, in torch's reference AdamW and in the sharded optimizer's flat fp32 chunks.

Oracle: with zero gradients Adam's update is exactly 0 (zero moments), so one step leaves
each parameter either multiplied by ``1 - lr * weight_decay`` (torch's decoupled decay) or
unchanged; which one is read off the parameter's own shape.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from piebald.runtime.distributed.flat_bucket import FlatBucket
from piebald.runtime.distributed.group_layout import BucketPlacement
from piebald.runtime.distributed.groups import single_rank_group
from piebald.runtime.distributed.optimizer import (
    OptimizerConfig,
    ShardedOptimizer,
    build_reference_optimizer,
)
from piebald.runtime.models.stage_part import build_stage_part
from piebald.specs.model import Family, ModelArch, ModelSpec
from piebald.specs.plan import ZeroMode
from piebald.specs.presets import load_model

LR = 0.1
WEIGHT_DECAY = 0.5
CONFIG = OptimizerConfig(lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=None)
GPT2 = ModelSpec(
    name="gpt2-micro",
    arch=ModelArch(
        family=Family.GPT2,
        num_blocks=2,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=128,
        vocab_size=64,
        max_seq_len=16,
        tie_embeddings=True,
    ),
)
MODELS = {"llama (tiny)": load_model("tiny"), "gpt2 (biases, tied head)": GPT2}


def _model(spec: ModelSpec) -> list[tuple[str, nn.Parameter]]:
    part = build_stage_part(
        spec, layer_start=0, layer_end=spec.num_layers, seed=4, device=torch.device("cpu")
    )
    named = list(part.named_parameters())
    for _, param in named:
        param.grad = torch.zeros_like(param)
    return named


def _expected(before: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        name: value * (1 - LR * WEIGHT_DECAY) if value.dim() >= 2 else value
        for name, value in before.items()
    }


def _assert_decayed_as_expected(
    named: list[tuple[str, nn.Parameter]], before: dict[str, torch.Tensor]
) -> None:
    kept = [name for name, value in before.items() if value.dim() < 2]
    assert any("norm" in name for name in kept)  # the models do have gains to leave alone
    for name, value in _expected(before).items():
        now = dict(named)[name].detach()
        torch.testing.assert_close(now, value, rtol=1e-6, atol=0, msg=name)
        if name in kept:
            assert torch.equal(now, before[name]), name


@pytest.mark.parametrize("spec", list(MODELS.values()), ids=list(MODELS))
def test_reference_adamw_decays_matrices_only(spec: ModelSpec) -> None:
    named = _model(spec)
    before = {name: p.detach().clone() for name, p in named}
    build_reference_optimizer(named, CONFIG).step()
    _assert_decayed_as_expected(named, before)


@pytest.mark.parametrize("chunk_numel", [None, 1000])  # chunks that cut parameters in two
@pytest.mark.parametrize("spec", list(MODELS.values()), ids=list(MODELS))
def test_sharded_optimizer_decays_matrices_only(spec: ModelSpec, chunk_numel: int | None) -> None:
    named = _model(spec)
    before = {name: p.detach().clone() for name, p in named}
    group = single_rank_group(0)
    bucket = FlatBucket(
        "stage0",
        named_params=named,
        placement=BucketPlacement(ranks=(0,), fractions=(1.0,), zero=ZeroMode.OPTIMIZER),
        group=group,
        rank=0,
        chunk_numel=chunk_numel,
    )
    for _, param in named:  # the bucket's gradient views, zero
        assert param.grad is not None and not param.grad.any()
    optimizer = ShardedOptimizer([bucket], config=CONFIG, used_group=group)
    result = optimizer.step()
    assert result.grad_norm == 0.0 and not result.skipped
    _assert_decayed_as_expected(named, before)
