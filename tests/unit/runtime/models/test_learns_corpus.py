"""End to end on one process: the tiny model, the shipped corpus and the token loss learn.

Held-out batches (steps far past those trained on) start at the uniform-guess loss ln 256
and must drop well below it: a broken data pipeline, loss or backward pass would not."""

from __future__ import annotations

import math

import pytest
import torch

from piebald.runtime.data import batch_for_step, corpus_tokens
from piebald.runtime.models import build_stage_part, token_loss_sum
from piebald.specs.presets import load_model


@pytest.mark.slow
def test_tiny_model_learns_the_shipped_corpus() -> None:
    model = load_model("tiny")
    part = build_stage_part(model, layer_start=0, layer_end=model.num_layers, seed=0)
    optimizer = torch.optim.AdamW(part.parameters(), lr=3e-3, weight_decay=0.0)
    data = corpus_tokens()

    def held_out_loss() -> float:
        with torch.no_grad():
            inputs, labels = batch_for_step(
                data, seed=1, step=10**6, global_batch_size=32, seq_len=64
            )
            return (token_loss_sum(part(inputs), labels) / labels.numel()).item()

    before = held_out_loss()
    assert before == pytest.approx(math.log(256), abs=0.1)
    for step in range(120):
        inputs, labels = batch_for_step(data, seed=0, step=step, global_batch_size=16, seq_len=64)
        loss = token_loss_sum(part(inputs), labels) / labels.numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = held_out_loss()
    assert after < 2.8, f"held-out loss {before:.3f} -> {after:.3f}"
