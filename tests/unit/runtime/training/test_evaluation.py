"""The evaluation loss: its windows against plain slicing, and the reference run's number
against a token-by-token computation on a model built the same way."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from piebald.errors import SpecError
from piebald.runtime.data.token_file import write_token_file
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.models.stage_part import build_stage_part
from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.evaluation import IGNORED_LABEL, eval_due, eval_windows
from piebald.runtime.training.reference import train_reference
from piebald.specs.job import JobSpec
from piebald.specs.presets import load_model


def test_windows_are_consecutive_and_the_tail_is_left_out() -> None:
    seq_len = 4
    tokens = np.arange(3 * (seq_len + 1) + 2)  # three windows and two tokens over
    windows = eval_windows(tokens, seq_len=seq_len, source=Path("eval.bin"))
    assert windows.num_windows == 3 and windows.num_labels == 3 * seq_len
    for i in range(3):
        row = list(tokens[i * 5 : i * 5 + 5])
        assert windows.inputs[i].tolist() == row[:-1]
        assert windows.labels[i].tolist() == row[1:]


def test_chunks_pad_the_last_rows_with_ignored_labels() -> None:
    windows = eval_windows(np.arange(5 * 3), seq_len=2, source=Path("eval.bin"))  # 5 windows
    chunks = list(windows.chunks(rows=2))
    assert [c[0].shape[0] for c in chunks] == [2, 2, 2]
    inputs, labels = chunks[-1]
    assert inputs[0].tolist() == windows.inputs[4].tolist() and (inputs[1] == 0).all()
    assert labels[0].tolist() == windows.labels[4].tolist()
    assert (labels[1] == IGNORED_LABEL).all()
    assert torch.cat([c[1] for c in chunks])[:5].equal(windows.labels)


def test_a_file_shorter_than_one_window_is_refused() -> None:
    with pytest.raises(SpecError, match="at least seq_len"):
        eval_windows(np.arange(4), seq_len=4, source=Path("eval.bin"))


def test_evaluation_is_due_every_k_steps_and_after_the_last() -> None:
    assert [s for s in range(1, 8) if eval_due(step=s, every=3, steps=7)] == [3, 6, 7]
    assert [s for s in range(1, 8) if eval_due(step=s, every=0, steps=7)] == [7]


def test_reference_evaluation_is_the_mean_token_loss_over_the_windows(tmp_path: Path) -> None:
    model = load_model("tiny")
    seq_len, windows = 8, 5
    ids = np.random.default_rng(0).integers(0, 256, size=windows * (seq_len + 1) + 3)
    path = write_token_file(tmp_path / "eval.bin", ids).path
    config = TrainConfig(steps=1, seed=4, optimizer=OptimizerConfig(lr=0.0), eval_data_path=path)
    job = JobSpec(global_batch_size=2, seq_len=seq_len)
    summary = train_reference(model, job, config, print_line=lambda _: None)
    # The oracle: the same initialisation, one window at a time, token by token.
    part = build_stage_part(
        model, layer_start=0, layer_end=model.num_layers, seed=4, device=torch.device("cpu")
    )
    losses = []
    with torch.no_grad():
        for i in range(windows):
            row = torch.as_tensor(ids[i * (seq_len + 1) : (i + 1) * (seq_len + 1)])
            logits = part(row[None, :-1])[0]
            for t in range(seq_len):
                losses.append(-torch.log_softmax(logits[t].double(), -1)[row[t + 1]].item())
    assert summary.eval_steps == (1,)
    assert summary.eval_losses[0] == pytest.approx(math.fsum(losses) / len(losses), rel=1e-6)
