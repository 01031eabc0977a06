"""The evaluation loss: the mean token loss over a token file's consecutive, non-overlapping
windows of ``seq_len + 1`` tokens, so anyone can recompute it with another implementation.

Window i is ``tokens[i * (seq_len + 1) : (i + 1) * (seq_len + 1)]``: inputs are its first
``seq_len`` tokens, labels its last ``seq_len``; a tail shorter than a window is left out.
The loss is the sum of every label's cross-entropy over all windows, divided by the number
of labels (``windows x seq_len``), one number whatever the plan or the batch size.

Runs push the windows through in chunks of the global batch (every rank of a plan builds
the same chunk, as it draws the same training batch); the last chunk is filled up with
rows whose labels are ``IGNORED_LABEL``, which the cross-entropy skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from piebald.errors import SpecError
from piebald.runtime.data.token_file import TokenFile

__all__ = ["IGNORED_LABEL", "EvalWindows", "eval_due", "eval_windows"]

IGNORED_LABEL = -100  # torch's cross_entropy default ignore_index


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EvalWindows:
    """Every window of an evaluation file, as (inputs, labels) int64 [num_windows, seq_len]."""

    inputs: torch.Tensor
    labels: torch.Tensor

    @property
    def num_windows(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def num_labels(self) -> int:
        return int(self.labels.numel())

    def chunks(self, *, rows: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, labels) of exactly ``rows`` rows each; the last chunk's missing rows are
        padding (token 0, every label ``IGNORED_LABEL``)."""
        for start in range(0, self.num_windows, rows):
            inputs = self.inputs[start : start + rows]
            labels = self.labels[start : start + rows]
            missing = rows - inputs.shape[0]
            if missing:
                inputs = torch.cat((inputs, inputs.new_zeros(missing, inputs.shape[1])))
                labels = torch.cat(
                    (labels, labels.new_full((missing, labels.shape[1]), IGNORED_LABEL))
                )
            yield inputs, labels


def eval_windows(tokens: TokenFile | np.ndarray, *, seq_len: int, source: Path) -> EvalWindows:
    """The windows of ``tokens`` (module docstring); at least one must fit."""
    array = tokens.tokens if isinstance(tokens, TokenFile) else tokens
    width = seq_len + 1
    count = int(array.shape[0]) // width
    if count == 0:
        raise SpecError(
            source=str(source),
            field="--eval-data",
            value=f"{int(array.shape[0])} tokens",
            expected=f"at least seq_len + 1 = {width} tokens (one evaluation window)",
        )
    windows = torch.from_numpy(np.asarray(array[: count * width], dtype=np.int64))
    windows = windows.view(count, width)
    return EvalWindows(inputs=windows[:, :-1].contiguous(), labels=windows[:, 1:].contiguous())


def eval_due(*, step: int, every: int, steps: int) -> bool:
    """Whether a run evaluates after step ``step`` (1-based) of ``steps``: every ``every``
    steps, and always after the last."""
    return step == steps or (every > 0 and step % every == 0)
