"""Training data for the runtime: memory-mapped token files (nanoGPT ``.bin``), a byte-level
tokenizer, the text corpus shipped in the package, tokenizing text corpora into token files
(``prepare``), and the global batch of each step as a function of (seed, step) alone.

Only the batches import torch, and only when first asked for (PEP 562 ``__getattr__``): the
data tools (``piebald data prepare``) run where torch is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from piebald.runtime.data.corpus import corpus_resource, corpus_text, corpus_tokens
from piebald.runtime.data.token_file import (
    TOKEN_DTYPES,
    TokenFile,
    check_token_ids,
    document_index_path,
    metadata_path,
    open_token_file,
    write_text_token_file,
    write_token_file,
)
from piebald.runtime.data.tokenizer import BYTE_VOCAB_SIZE, ByteTokenizer

if TYPE_CHECKING:
    from piebald.runtime.data.batches import batch_for_step, batch_offsets

__all__ = [
    "BYTE_VOCAB_SIZE",
    "TOKEN_DTYPES",
    "ByteTokenizer",
    "TokenFile",
    "batch_for_step",
    "batch_offsets",
    "check_token_ids",
    "corpus_resource",
    "corpus_text",
    "corpus_tokens",
    "document_index_path",
    "metadata_path",
    "open_token_file",
    "write_text_token_file",
    "write_token_file",
]

_TORCH_NAMES = ("batch_for_step", "batch_offsets")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from piebald.runtime.data import batches

        return getattr(batches, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
