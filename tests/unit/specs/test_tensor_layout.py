"""What a rank of a tensor group holds and runs in each layout (``specs.tensor_layout``),
against closed forms.

- ``blocks`` (piebald's runtime) is ``layers_at(t)`` as before: embedding and head whole.
- ``vocabulary``: the embedding's and head's weights, the head's FLOPs and its kept fp32
  log-softmax are 1/t of the whole model's (GPT-2's learned positions stay whole).
- ``sequence``: a block's FLOPs, memory-bound traffic and kept bytes (with and without
  recompute) are exactly 1/t of the whole block's -- Korthikanti et al. 2022's 34/t
  (section 4.2.2, table 2): nothing of a block stays whole on a rank.
- At degree 1 every layout is the whole model.
"""

from __future__ import annotations

import pytest

from piebald.specs.model import LayerKind, LayerSpec
from piebald.specs.presets import load_model
from piebald.specs.recompute import Recompute
from piebald.specs.tensor_layout import TensorLayout

BF16_BYTES = 2


def _block(layers: tuple[LayerSpec, ...]) -> LayerSpec:
    return next(layer for layer in layers if layer.kind is LayerKind.BLOCK)


@pytest.mark.parametrize("layout", [TensorLayout.SEQUENCE, TensorLayout.VOCABULARY_SEQUENCE])
@pytest.mark.parametrize("name", ["llama-3-8b", "gpt2"])
@pytest.mark.parametrize("degree", [2, 4])
def test_sequence_parallel_blocks_are_one_over_t_of_the_whole(
    name: str, degree: int, layout: TensorLayout
) -> None:
    model = load_model(name)
    whole = _block(model.layers)
    mine = _block(model.layers_at(degree, layout))
    assert mine.matmul_flops_per_token == pytest.approx(whole.matmul_flops_per_token / degree)
    assert mine.attention_flops_per_token_per_position == pytest.approx(
        whole.attention_flops_per_token_per_position / degree
    )
    assert mine.ops.stream_bytes_per_token(dtype_bytes=BF16_BYTES) == pytest.approx(
        whole.ops.stream_bytes_per_token(dtype_bytes=BF16_BYTES) / degree
    )
    assert mine.ops.kernels == whole.ops.kernels  # as many launches, each on less
    for recompute in (Recompute.NONE, Recompute.FULL):
        assert mine.activation_bytes_per_token(
            dtype_bytes=BF16_BYTES, recompute=recompute
        ) == pytest.approx(
            whole.activation_bytes_per_token(dtype_bytes=BF16_BYTES, recompute=recompute) / degree
        )


@pytest.mark.parametrize("name", ["llama-3-8b", "gpt2"])
def test_blocks_keep_the_hidden_width_whole(name: str) -> None:
    model = load_model(name)
    assert model.layers_at(4) == model.layers_at(4, TensorLayout.BLOCKS)
    whole, mine = _block(model.layers), _block(model.layers_at(4))
    assert mine.ops.stream_bytes_per_token(dtype_bytes=BF16_BYTES) > (
        whole.ops.stream_bytes_per_token(dtype_bytes=BF16_BYTES) / 4
    )
    assert model.layers_at(4)[-1] == model.layers[-1]  # the head, whole on every rank


@pytest.mark.parametrize("name", ["llama-3-8b", "gpt2"])
def test_sequence_parallelism_alone_keeps_the_embedding_and_head_whole(name: str) -> None:
    model = load_model(name)
    layers = model.layers_at(4, TensorLayout.SEQUENCE)
    assert layers[0] == model.layers[0] and layers[-1] == model.layers[-1]


@pytest.mark.parametrize("layout", [TensorLayout.VOCABULARY, TensorLayout.VOCABULARY_SEQUENCE])
def test_a_vocabulary_parallel_rank_holds_and_runs_its_rows(layout: TensorLayout) -> None:
    model = load_model("llama-3-8b")  # untied head, vocabulary 128256 = 8 x 16032
    t, h, vocab = 8, model.arch.hidden_size, model.arch.vocab_size
    embedding, *_, head = model.layers_at(t, layout)
    whole_head = model.layers[-1]
    assert embedding.num_params == vocab // t * h
    assert head.num_params == h + vocab // t * h  # the final norm's weight whole
    assert head.matmul_flops_per_token == pytest.approx(whole_head.matmul_flops_per_token / t)
    # The kept fp32 log-softmax (4V per token) shrinks with the logits.
    kept = whole_head.activation_fixed_bytes_per_token - head.activation_fixed_bytes_per_token
    assert kept >= 4 * (vocab - vocab // t)


def test_gpt2_positions_stay_whole_and_the_vocabulary_is_padded() -> None:
    model = load_model("gpt2")  # tied head, vocabulary 50257 (not a multiple of 4)
    h, vocab, positions = (
        model.arch.hidden_size,
        model.arch.vocab_size,
        model.arch.max_seq_len * model.arch.hidden_size,
    )
    embedding, *_, head = model.layers_at(4, TensorLayout.VOCABULARY)
    rows = -(-vocab // 4)
    assert rows * 4 >= vocab > (rows - 1) * 4
    assert embedding.num_params == rows * h + positions
    assert head.num_tied_params == rows * h


@pytest.mark.parametrize("layout", list(TensorLayout))
def test_degree_one_is_the_whole_model_in_every_layout(layout: TensorLayout) -> None:
    model = load_model("tiny")
    assert model.layers_at(1, layout) == model.layers
    assert model.stage_params(0, model.num_layers, layout=layout) == model.num_params
