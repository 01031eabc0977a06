"""Byte-level tokenizer: the UTF-8 bytes of a text are its tokens, so the vocabulary is the
256 byte values and any text round-trips. Models with a larger vocabulary train on it too
(ids 256 and up just never occur); the ``tiny`` preset's vocabulary is exactly 256.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["BYTE_VOCAB_SIZE", "ByteTokenizer"]

BYTE_VOCAB_SIZE = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class ByteTokenizer:
    name: str = "bytes"  # as token files record it
    vocab_size: int = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> np.ndarray:
        """text -> token ids [len(text.encode('utf-8'))], uint16."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """token ids -> text; bytes that are not valid UTF-8 (a cut character) become U+FFFD."""
        values = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        if values.size and (values.min() < 0 or values.max() >= BYTE_VOCAB_SIZE):
            bad = values[(values < 0) | (values >= BYTE_VOCAB_SIZE)][0]
            raise ValueError(f"token id {int(bad)} is not a byte (expected 0..255)")
        return values.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
