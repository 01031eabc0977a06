"""The global batch of a step: windows of the data, labels shifted by one, a function of
(seed, step) and the data alone (not of the source, the process, or any global RNG)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from piebald.errors import SpecError
from piebald.runtime.data import (
    batch_for_step,
    batch_offsets,
    corpus_tokens,
    open_token_file,
    write_token_file,
)


def test_rows_are_windows_of_the_data_with_labels_shifted_by_one() -> None:
    n, seq_len = 500, 16
    data = np.arange(n, dtype=np.uint16)  # token value = its position: windows are ramps
    for step in range(20):
        inputs, labels = batch_for_step(
            data, seed=3, step=step, global_batch_size=8, seq_len=seq_len
        )
        assert inputs.shape == labels.shape == (8, seq_len)
        assert inputs.dtype == labels.dtype == torch.int64
        for row in range(8):
            start = int(inputs[row, 0])
            assert 0 <= start <= n - seq_len - 1
            assert inputs[row].tolist() == list(range(start, start + seq_len))
            assert labels[row].tolist() == list(range(start + 1, start + seq_len + 1))


def test_the_shortest_possible_data_gives_the_only_window() -> None:
    data = np.array([5, 6, 7, 8], dtype=np.uint16)
    inputs, labels = batch_for_step(data, seed=0, step=9, global_batch_size=3, seq_len=3)
    assert inputs.tolist() == [[5, 6, 7]] * 3 and labels.tolist() == [[6, 7, 8]] * 3


def test_batch_depends_on_seed_and_step_only(tmp_path: Path) -> None:
    data = corpus_tokens()
    token_file = write_token_file(tmp_path / "corpus.bin", data)
    kwargs = dict(global_batch_size=6, seq_len=32)
    reference = batch_for_step(data, seed=1, step=4, **kwargs)
    # Global RNGs scrambled; a memory-mapped file instead of an in-memory array.
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    for source in (token_file, open_token_file(tmp_path / "corpus.bin"), data):
        again = batch_for_step(source, seed=1, step=4, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(again, reference, strict=True))
    assert not torch.equal(batch_for_step(data, seed=1, step=5, **kwargs)[0], reference[0])
    assert not torch.equal(batch_for_step(data, seed=2, step=4, **kwargs)[0], reference[0])


def test_a_fresh_process_draws_the_same_batch() -> None:
    code = (
        "from piebald.runtime.data import batch_for_step, corpus_tokens\n"
        "x, y = batch_for_step(corpus_tokens(), seed=7, step=123, global_batch_size=4, "
        "seq_len=20)\n"
        "print(x.tolist(), y.tolist())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    x, y = batch_for_step(corpus_tokens(), seed=7, step=123, global_batch_size=4, seq_len=20)
    assert result.stdout.strip() == f"{x.tolist()} {y.tolist()}"


def test_offsets_are_uniform_over_every_possible_start() -> None:
    """Pearson's chi-square over 12,800 draws of 91 possible starts: the statistic has mean
    90 and standard deviation sqrt(180) ~ 13.4 under uniformity; 10 sigma is a generous
    bound that still catches a skewed or truncated range."""
    num_tokens, seq_len, num_starts = 101, 10, 91
    draws = np.concatenate(
        [
            batch_offsets(num_tokens, seed=0, step=step, global_batch_size=64, seq_len=seq_len)
            for step in range(200)
        ]
    )
    counts = np.bincount(draws, minlength=num_starts)
    assert len(counts) == num_starts and counts.min() > 0
    expected = len(draws) / num_starts
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < (num_starts - 1) + 10 * (2 * (num_starts - 1)) ** 0.5


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    short = write_token_file(tmp_path / "short.bin", np.arange(10))
    with pytest.raises(SpecError, match=r"short.bin: seq_len: got 10; expected at most 9"):
        batch_for_step(short, seed=0, step=0, global_batch_size=1, seq_len=10)
    data = np.arange(100)
    with pytest.raises(ValueError, match=r"seed \(-1\) and step \(0\)"):
        batch_for_step(data, seed=-1, step=0, global_batch_size=1, seq_len=4)
    with pytest.raises(ValueError, match=r"global_batch_size \(0\)"):
        batch_for_step(data, seed=0, step=0, global_batch_size=0, seq_len=4)


def test_finding_34_too_short_data_names_the_token_file_or_the_builtin_corpus(
    tmp_path: Path,
) -> None:
    """Finding 34: the error named "token array" instead of where the tokens came from."""
    with pytest.raises(SpecError) as caught:
        batch_for_step(np.arange(10), seed=0, step=0, global_batch_size=1, seq_len=10)
    assert caught.value.source == "the built-in corpus (no --data)"
    assert "at most 9" in str(caught.value)
    path = tmp_path / "short.bin"
    write_token_file(path, np.arange(10, dtype=np.uint16))
    with pytest.raises(SpecError) as caught:
        batch_for_step(open_token_file(path), seed=0, step=0, global_batch_size=1, seq_len=10)
    assert caught.value.source == str(path)
