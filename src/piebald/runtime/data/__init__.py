"""Training data for the runtime: memory-mapped token files (nanoGPT ``.bin``), a byte-level
tokenizer, the text corpus shipped in the package, and the global batch of each step as a
function of (seed, step) alone."""

from piebald.runtime.data.batches import batch_for_step, batch_offsets
from piebald.runtime.data.corpus import corpus_resource, corpus_text, corpus_tokens
from piebald.runtime.data.token_file import (
    TOKEN_DTYPES,
    TokenFile,
    check_token_ids,
    metadata_path,
    open_token_file,
    write_text_token_file,
    write_token_file,
)
from piebald.runtime.data.tokenizer import BYTE_VOCAB_SIZE, ByteTokenizer

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
    "metadata_path",
    "open_token_file",
    "write_text_token_file",
    "write_token_file",
]
