"""A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library, with what a token
file records about it: where it came from, a hash of its content, its vocabulary size and the
end-of-document token.

``--tokenizer`` names a ``tokenizer.json`` file, or a Hugging Face model directory holding
one. The end-of-document (EOS) token appended after each document is, in order: the token
given (``--eos-token``); the ``eos_token`` of a ``tokenizer_config.json`` beside the
``tokenizer.json`` (what ``transformers`` uses); else the first of :data:`KNOWN_EOS_TOKENS`
that the vocabulary holds. A tokenizer with none of these has no EOS, which is an error only
when one is to be appended. Both files are read by :mod:`piebald.specs.user_input`: regular
files of at most :data:`MAX_TOKENIZER_BYTES`, the config nested at most 64 levels deep.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piebald.errors import SpecError
from piebald.extras import install_hint
from piebald.specs.user_input import read_user_bytes, read_user_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "KNOWN_EOS_TOKENS",
    "MAX_TOKENIZER_BYTES",
    "TextTokenizer",
    "load_text_tokenizer",
    "require_module",
]

# The largest published tokenizer.json files are tens of MB (Gemma's, 262,144 tokens: 34 MB).
MAX_TOKENIZER_BYTES = 1 << 30
# End-of-text tokens of common model families (GPT-2/NeoX, Llama 1-2/Mistral, Llama 3, Gemma),
# the fallback for a bare tokenizer.json without a tokenizer_config.json.
KNOWN_EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TextTokenizer:
    tokenizer: Tokenizer
    path: Path  # the tokenizer.json, resolved
    sha256: str  # of the tokenizer.json's bytes: identifies it wherever it is copied
    vocab_size: int  # largest id + 1, added tokens included
    eos_token: str | None
    eos_id: int | None


def require_module(name: str, *, purpose: str, source: str) -> Any:
    """Import an optional dependency, or a one-line error saying what to install."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise SpecError(
            source=source,
            field="",
            has_value=False,
            expected=f"the {name} package {purpose} ({install_hint(name)})",
        ) from None


def load_text_tokenizer(path: Path, *, eos_token: str | None = None) -> TextTokenizer:
    """Load ``path`` (a tokenizer.json or a model directory holding one)."""
    source = str(path)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise SpecError(
                source=source,
                field="",
                has_value=False,
                expected="a tokenizer.json inside (a Hugging Face model directory)",
            )
    elif path.is_file():
        file = path
    else:
        raise SpecError(
            source=source,
            field="",
            has_value=False,
            expected="a tokenizer.json or a model directory holding one (no such file)",
        )
    tokenizers = require_module("tokenizers", purpose="to tokenize text", source="--tokenizer")
    content = read_user_bytes(file, source=str(file), max_bytes=MAX_TOKENIZER_BYTES)
    try:
        tokenizer = tokenizers.Tokenizer.from_str(content.decode("utf-8"))
    except Exception as error:  # the library raises plain Exception; decoding, ValueError
        raise SpecError(
            source=str(file),
            field="",
            has_value=False,
            expected=f"a tokenizer.json the tokenizers library reads ({error})",
        ) from None
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
        raise SpecError(
            source=str(file), field="vocabulary", value=0, expected="at least one token"
        )
    chosen = eos_token if eos_token is not None else _configured_eos(file, vocab)
    eos_id = tokenizer.token_to_id(chosen) if chosen is not None else None
    if eos_token is not None and eos_id is None:
        raise SpecError(
            source="--eos-token",
            field="",
            value=eos_token,
            expected=f"a token in the vocabulary of {file}",
        )
    return TextTokenizer(
        tokenizer=tokenizer,
        path=file.resolve(),
        sha256=hashlib.sha256(content).hexdigest(),
        vocab_size=max(vocab.values()) + 1,
        eos_token=chosen if eos_id is not None else None,
        eos_id=eos_id,
    )


def _configured_eos(file: Path, vocab: dict[str, int]) -> str | None:
    config = file.with_name("tokenizer_config.json")
    if config.is_file():
        data = read_user_json(
            config, source=str(config), max_bytes=MAX_TOKENIZER_BYTES, what="readable JSON"
        )
        value = data.get("eos_token") if isinstance(data, dict) else None
        # transformers writes either the token or an AddedToken dict holding it.
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value in vocab:
            return value
    return next((token for token in KNOWN_EOS_TOKENS if token in vocab), None)
