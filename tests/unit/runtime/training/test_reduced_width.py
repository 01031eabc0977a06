"""Emulation at reduced width keeps what a plan's tensor groups need to split the model.

The demo's plan for llama-3.2-1b on lab-mix once put two MyGPU-24GB in a tensor group, and
the reduced model (one key/value head at hidden 64) could not be split: emulation stopped
at start-up. At every degree the narrow copy has a key/value head per member, the model's
query heads per key/value head, a feed-forward width the degree divides, and the same
layers; a plan's largest degree decides (``emulated_model``).
"""

from __future__ import annotations

import pytest

from piebald.runtime.training.reduced import (
    DEFAULT_MAX_EMULATED_PARAMS,
    emulated_model,
    reduced_width_model,
)
from piebald.specs.presets import load_model
from tensor_plans import tp_plan, tp_stage


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3-8b", "gpt2-xl"])
@pytest.mark.parametrize("degree", [1, 2, 4, 8])
def test_reduced_model_splits_at_every_degree(name: str, degree: int) -> None:
    model = load_model(name)
    narrow = reduced_width_model(model, max_params=1, tensor_parallel_degree=degree)
    arch, wide = narrow.arch, model.arch
    assert arch.num_kv_heads % degree == 0
    assert arch.num_heads // arch.num_kv_heads == wide.num_heads // wide.num_kv_heads
    assert arch.ffn_hidden_size % degree == 0
    assert arch.hidden_size % arch.num_heads == 0
    assert narrow.num_layers == model.num_layers
    assert narrow.num_params < DEFAULT_MAX_EMULATED_PARAMS
    if degree == 1 and name == "llama-3.2-1b":
        assert arch.hidden_size == 64  # the width emulation has always used


def test_small_models_are_not_reduced() -> None:
    model = load_model("tiny")
    assert (
        reduced_width_model(model, max_params=model.num_params, tensor_parallel_degree=4) is model
    )


@pytest.mark.parametrize("degree", [2, 4, 8])
def test_a_plans_largest_degree_decides(degree: int) -> None:
    """Stages at degree 1 and at ``degree``: the reduced model splits at ``degree``."""
    plan = tp_plan(
        "llama-3.2-1b",
        [
            tp_stage(layers=(0, 8), ranks=range(8), degree=1, num_micro_batches=1),
            tp_stage(layers=(8, 18), ranks=range(8, 16), degree=degree, num_micro_batches=degree),
        ],
    )
    narrow = emulated_model(plan, max_params=1)
    assert narrow.arch.num_kv_heads % degree == 0
    assert narrow is not plan.model
