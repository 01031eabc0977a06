"""Training on the shipped corpus lowers the loss clearly: the ``tiny`` model, byte-level,
200 steps of single-process training (the reference every plan equals, see
tests/distributed/test_plan_equivalence.py) take the loss from about ln(256) = 5.5 to below
half of it."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from piebald.runtime.dist.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.reference import train_reference
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model


@pytest.mark.slow
def test_corpus_loss_falls_by_half_in_200_steps() -> None:
    torch.set_num_threads(1)
    run = train_reference(
        load_model("tiny"),
        JobSpec(global_batch_size=8, seq_len=128),
        TrainConfig(steps=200, seed=0, optimizer=OptimizerConfig(lr=3e-3)),
        print_line=lambda _: None,
    )
    first = run.losses[0]
    assert first == pytest.approx(math.log(256), abs=0.3)  # an untrained byte model
    assert statistics.mean(run.losses[-20:]) < 0.5 * first
