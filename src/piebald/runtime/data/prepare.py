"""Tokenize a text corpus into token files (``piebald data prepare``).

Reads the documents of the input files in order (``documents``), encodes them in batches with
a Hugging Face tokenizer (``text_tokenizer``; ``Tokenizer.encode`` ids, so special tokens its
post-processor adds, such as Llama's BOS, are included), appends the EOS token to each
document unless told not to, and streams each document whole into the train or the
validation token file (``split``). Outputs, for ``--out PREFIX``:

- ``PREFIX.train.bin`` (and ``PREFIX.val.bin`` with a validation split): the ids, uint16 when
  the vocabulary has at most 65,536 ids, else uint32;
- ``PREFIX.<split>.bin.idx``: the document index (``token_file``'s format);
- ``PREFIX.<split>.bin.json``: the sidecar, recording beside the token file's usual fields the
  tokenizer (its path, SHA-256 and vocabulary size), the EOS, the largest id, the number of
  documents, the split, the text field and the input files.

Memory is one batch of documents, never the corpus. A document longer than
:data:`PIECE_CHARS` characters (a book or a dump in one ``.txt``) is not given to the
tokenizer whole, which needs about 160 bytes per character: it is cut into pieces of at most
that many characters, each just before a space that follows a non-space character, and the
pieces are encoded in turn (in batches of the usual size) without special tokens, the
tokenizer's own (such as Llama's BOS) put around the whole. Byte-level BPE pre-tokenizers
(GPT-2's, Llama 3's) never join text across such a point, so the ids are those of encoding
the document whole; each cut is checked on the text around it, and where a tokenizer would
join across it (a normalizer that prepends to every input) another space is tried, and
failing that the ids may differ at the cut. So memory is one batch plus the document's text
and ids, not 160 bytes per character of it.

The inputs are read twice: once to count the documents (the split needs the total; parquet
files say it in their metadata), once to tokenize. Every output is checked (and its directory
proven writable) before any tokenizing, and written atomically (``token_writer``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from piebald.errors import SpecError
from piebald.runtime.data.documents import count_documents, document_file, read_documents
from piebald.runtime.data.split import ValidationSplit, is_validation
from piebald.runtime.data.text_tokenizer import KNOWN_EOS_TOKENS, TextTokenizer, load_text_tokenizer
from piebald.runtime.data.token_file import TokenFile
from piebald.runtime.data.token_writer import (
    TokenFileWriter,
    check_output_paths,
    output_paths,
    token_dtype_for,
)

__all__ = ["PIECE_CHARS", "PreparedData", "prepare_token_files", "split_path"]

SPLITS = ("train", "val")
# A batch for encode_batch: enough documents to keep the tokenizer's threads busy, few enough
# characters that memory stays small whatever the documents' sizes.
_BATCH_DOCUMENTS = 1024
_BATCH_CHARS = 8 * 2**20
# A longer document is encoded in pieces of at most this many characters (module docstring).
PIECE_CHARS = 2**20
_CUT_WINDOW = 256  # characters each side of a cut that are encoded to check it
_CUT_TRIES = 8  # spaces tried for a cut before taking one that changes the ids


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PreparedData:
    tokenizer: TextTokenizer
    train: TokenFile
    val: TokenFile | None  # None without a validation split
    num_documents: int  # in both splits


def split_path(out_prefix: Path, split: str) -> Path:
    """The token file of ``split``: ``--out data/web`` -> ``data/web.train.bin``."""
    _check_prefix(out_prefix)
    return out_prefix.with_name(f"{out_prefix.name}.{split}.bin")


def _check_prefix(out_prefix: Path) -> None:
    """``--out ''``, ``.``, ``..`` and ``/`` name a directory, not a prefix of file names."""
    if out_prefix.name in ("", ".", ".."):
        raise SpecError(
            source="--out",
            field="",
            value=str(out_prefix),
            expected="a prefix ending in a file name (data/web writes data/web.train.bin)",
        )


def prepare_token_files(
    *,
    tokenizer: Path,
    inputs: Sequence[Path],
    out_prefix: Path,
    text_field: str = "text",
    validation: ValidationSplit | None = None,
    append_eos: bool = True,
    eos_token: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> PreparedData:
    """Tokenize ``inputs`` into ``PREFIX.train.bin`` (and ``PREFIX.val.bin``); see the module.

    ``progress(documents_done, num_documents)`` is called after each batch.
    """
    _check_prefix(out_prefix)
    if not inputs:
        raise SpecError(
            source="--input", field="", has_value=False, expected="at least one input file"
        )
    files = [document_file(path) for path in inputs]
    text_tokenizer = load_text_tokenizer(tokenizer, eos_token=eos_token)
    if append_eos and text_tokenizer.eos_id is None:
        raise SpecError(
            source=str(text_tokenizer.path),
            field="eos_token",
            has_value=False,
            expected=f"an end-of-document token (none in a tokenizer_config.json beside it, "
            f"nor any of {list(KNOWN_EOS_TOKENS)}): pass --eos-token or --no-append-eos",
        )
    dtype = token_dtype_for(text_tokenizer.vocab_size, source=str(text_tokenizer.path))
    splits = SPLITS if validation is not None else SPLITS[:1]
    paths = {split: split_path(out_prefix, split) for split in splits}
    check_output_paths(
        [file for path in paths.values() for file in output_paths(path)], overwrite=overwrite
    )
    num_documents = sum(count_documents(file, text_field=text_field) for file in files)
    if num_documents == 0:
        raise SpecError(
            source=", ".join(str(path) for path in inputs),
            field="",
            has_value=False,
            expected="at least one document (the inputs hold none)",
        )
    num_validation = validation.num_validation(num_documents) if validation is not None else 0

    def split_of(index: int) -> str:
        validates = num_validation and is_validation(
            index, num_validation=num_validation, num_documents=num_documents
        )
        return "val" if validates else "train"

    texts = (text for file in files for text in read_documents(file, text_field=text_field))
    writers: dict[str, TokenFileWriter] = {}
    try:
        for split, path in paths.items():
            writers[split] = TokenFileWriter(path, dtype=dtype)
        done = 0
        for batch in _batches(texts):
            encoded = _encode(text_tokenizer, batch, append_eos=append_eos)
            for split, writer in writers.items():
                writer.add_documents(
                    [ids for offset, ids in enumerate(encoded) if split_of(done + offset) == split]
                )
            done += len(batch)
            if progress is not None:
                progress(done, num_documents)
        # The count and the read must agree (a file changed meanwhile would break the split).
        if done != num_documents:
            raise SpecError(
                source=", ".join(str(path) for path in inputs),
                field="documents",
                value=done,
                expected=f"{num_documents}, as counted before tokenizing (did a file change?)",
            )
        for split, writer in writers.items():
            if writer.num_tokens == 0:
                raise SpecError(
                    source=str(writer.path),
                    field="",
                    has_value=False,
                    expected=f"some text: every {split} document is empty",
                )
        metadata = {
            "tokenizer_sha256": text_tokenizer.sha256,
            "vocab_size": text_tokenizer.vocab_size,
            "eos_token": text_tokenizer.eos_token if append_eos else None,
            "eos_token_id": text_tokenizer.eos_id if append_eos else None,
            "text_field": text_field,
            "sources": [str(path) for path in inputs],
        }
        written = {
            split: writer.commit(
                tokenizer=str(text_tokenizer.path), metadata={"split": split, **metadata}
            )
            for split, writer in writers.items()
        }
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    return PreparedData(
        tokenizer=text_tokenizer,
        train=written["train"],
        val=written.get("val"),
        num_documents=num_documents,
    )


def _batches(texts: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if len(batch) >= _BATCH_DOCUMENTS or chars >= _BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _encode(tokenizer: TextTokenizer, texts: list[str], *, append_eos: bool) -> list[np.ndarray]:
    """The ids of each text (special tokens included), then the EOS if ``append_eos``."""
    eos = np.asarray(
        [tokenizer.eos_id] if append_eos and tokenizer.eos_id is not None else [], dtype=np.int64
    )
    encoded = iter(
        _encode_batch(tokenizer, [text for text in texts if len(text) <= PIECE_CHARS], special=True)
    )
    return [
        np.concatenate(
            [
                np.asarray(next(encoded), dtype=np.int64)
                if len(text) <= PIECE_CHARS
                else _encode_long(tokenizer, text),
                eos,
            ]
        )
        for text in texts
    ]


def _encode_batch(tokenizer: TextTokenizer, texts: list[str], *, special: bool) -> list[list[int]]:
    if not texts:
        return []
    # encode_batch_fast gives encode's ids without computing character offsets (not needed).
    encode_batch = getattr(tokenizer.tokenizer, "encode_batch_fast", None)
    encodings = (encode_batch or tokenizer.tokenizer.encode_batch)(
        texts, add_special_tokens=special
    )
    return [encoding.ids for encoding in encodings]


def _special_tokens(tokenizer: TextTokenizer) -> tuple[list[int], list[int]] | None:
    """The ids the post-processor puts before and after a text's own, or None if they
    cannot be told apart from the text's."""
    bare = tokenizer.tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.tokenizer.encode("a").ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    return None


def _encode_long(tokenizer: TextTokenizer, text: str) -> np.ndarray:
    """The ids of a document longer than PIECE_CHARS, encoded piece by piece."""
    specials = _special_tokens(tokenizer)
    if specials is None:  # no way to put the special tokens around the pieces: whole
        return np.asarray(_encode_batch(tokenizer, [text], special=True)[0], dtype=np.int64)
    before, after = specials
    parts = [np.asarray(before, dtype=np.int64)]
    group: list[str] = []
    chars = 0
    for piece in [*_pieces(tokenizer, text), ""]:  # "": flush the last group
        if piece:
            group.append(piece)
            chars += len(piece)
        if group and (chars >= _BATCH_CHARS or not piece):
            for ids in _encode_batch(tokenizer, group, special=False):
                parts.append(np.asarray(ids, dtype=np.int64))
            group, chars = [], 0
    parts.append(np.asarray(after, dtype=np.int64))
    return np.concatenate(parts)


def _pieces(tokenizer: TextTokenizer, text: str) -> Iterator[str]:
    """``text`` in pieces of at most PIECE_CHARS characters (the module docstring)."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        end = _cut(tokenizer, text, start + PIECE_CHARS // 2, start + PIECE_CHARS)
        yield text[start:end]
        start = end
    yield text[start:]


def _cut(tokenizer: TextTokenizer, text: str, low: int, high: int) -> int:
    """A cut in ``(low, high]``: the last space after a non-space that the tokenizer does not
    join across (checked on the text around it), else the last such space, else ``high``."""
    first = None
    end = high + 1
    for _ in range(_CUT_TRIES):
        at = text.rfind(" ", low + 1, end)
        while at > low and text[at - 1].isspace():
            at = text.rfind(" ", low + 1, at)
        if at <= low:
            break
        first = at if first is None else first
        left = text[max(0, at - _CUT_WINDOW) : at]
        right = text[at : at + _CUT_WINDOW]
        joined, apart = (
            _encode_batch(tokenizer, [left + right, left, right], special=False)[:1],
            (_encode_batch(tokenizer, [left, right], special=False)),
        )
        if joined[0] == apart[0] + apart[1]:
            return at
        end = at
    return first if first is not None else high
