"""The token stream a run trains on: a token file given by the user, or the corpus shipped
with piebald through the byte-level tokenizer (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from piebald.errors import SpecError
from piebald.runtime.data.corpus import corpus_tokens
from piebald.runtime.data.token_file import TokenFile, check_token_ids, open_token_file

__all__ = ["load_tokens"]


def load_tokens(path: Path | None, *, vocab_size: int) -> TokenFile | np.ndarray:
    """The run's tokens, checked against the model's vocabulary."""
    if path is None:
        tokens = corpus_tokens()
        if int(tokens.max()) >= vocab_size:
            raise SpecError(
                source="model",
                field="vocab_size",
                value=vocab_size,
                expected=f"at least {int(tokens.max()) + 1} to train on the built-in byte corpus",
            )
        return tokens
    token_file = open_token_file(path)
    check_token_ids(token_file, vocab_size=vocab_size)
    return token_file
