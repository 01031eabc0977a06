"""Token files: a flat array of token ids on disk, memory-mapped (nanoGPT's ``.bin``).

Format: the file is nothing but the ids, native little-endian uint16 (vocabularies up to
65,536, nanoGPT's choice) or uint32, with no header, so nanoGPT's prepared files load as
they are. The dtype comes from, in order: the ``dtype`` argument; a sidecar JSON file
``<name>.json`` next to it (``train.bin`` -> ``train.bin.json``), which ``write_token_file``
always writes, e.g. ``{"format": "piebald.tokens", "version": 1, "dtype": "uint16",
"num_tokens": 466195, "tokenizer": "bytes"}``; else uint16. The sidecar's token count is
checked against the file size, which catches a file and a sidecar that do not belong together.
The sidecar is read by :func:`~piebald.specs.user_input.read_user_json`: a regular file of
at most :data:`MAX_SIDECAR_BYTES`, nested at most 64 levels.

Document boundaries (optional; ``piebald data prepare`` writes them): the sidecar's
``"document_index"`` names a file beside the tokens (``train.bin`` -> ``train.bin.idx``) of
``"num_documents"`` + 1 little-endian uint64 token offsets, 0 first and ``num_tokens`` last:
document d is ``tokens[offsets[d]:offsets[d + 1]]``. A separate file rather than a JSON list
because a corpus can hold millions of documents; files and sidecars without it (nanoGPT's,
older piebald's) open as before, with ``document_offsets`` None.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from piebald.errors import SpecError
from piebald.outputs import file_mode
from piebald.runtime.data.documents import DOCUMENT_KINDS
from piebald.runtime.data.tokenizer import ByteTokenizer
from piebald.specs.user_input import read_user_json

__all__ = [
    "DOCUMENT_OFFSET_DTYPE",
    "MAX_SIDECAR_BYTES",
    "TOKEN_DTYPES",
    "TOKEN_FILE_FORMAT",
    "TokenFile",
    "check_token_ids",
    "document_index_path",
    "metadata_path",
    "open_token_file",
    "write_text_token_file",
    "write_token_file",
]

TOKEN_DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {
    "uint16": np.uint16,
    "uint32": np.uint32,
}
TOKEN_FILE_FORMAT = "piebald.tokens"  # the sidecar's "format"
DOCUMENT_OFFSET_DTYPE = np.dtype("<u8")  # the document index's entries
MAX_SIDECAR_BYTES = 1 << 20  # the sidecar is a handful of fields


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TokenFile:
    path: Path
    dtype: str  # a key of TOKEN_DTYPES
    tokens: np.ndarray  # read-only memory map, 1-D [num_tokens]
    tokenizer: str  # as the sidecar names it; "" when unknown
    # Read-only memory map, uint64 [num_documents + 1]: document d spans
    # tokens[offsets[d]:offsets[d + 1]]; None when the sidecar records no document index.
    document_offsets: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_documents(self) -> int | None:
        if self.document_offsets is None:
            return None
        return int(self.document_offsets.shape[0]) - 1


def metadata_path(path: str | Path) -> Path:
    """The sidecar JSON of a token file: ``train.bin`` -> ``train.bin.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def document_index_path(path: str | Path) -> Path:
    """The document index of a token file: ``train.bin`` -> ``train.bin.idx``."""
    path = Path(path)
    return path.with_name(path.name + ".idx")


def open_token_file(path: str | Path, *, dtype: str | None = None) -> TokenFile:
    """Memory-map a token file (read-only); see the module docstring for the dtype rule."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(
            source=str(path), field="", has_value=False, expected="a token file (no such file)"
        )
    if dtype is not None and dtype not in TOKEN_DTYPES:
        raise SpecError(
            source=str(path), field="dtype", value=dtype, expected=" or ".join(TOKEN_DTYPES)
        )
    metadata = _read_metadata(path)
    kind = DOCUMENT_KINDS.get(path.suffix.lower())
    if not metadata and kind is not None:
        # Read as raw tokens, text would train on its bytes in pairs; a large vocabulary
        # takes nearly all of them as valid ids, so nothing else would catch it.
        raise SpecError(
            source=str(path),
            field="",
            has_value=False,
            expected=f"a token file, not a {kind} document file: tokenize it first "
            f"(piebald data prepare --input {path.name} --tokenizer TOKENIZER --out PREFIX)",
        )
    recorded = metadata.get("dtype")
    if dtype is not None and recorded is not None and dtype != recorded:
        raise SpecError(
            source=str(path),
            field="dtype",
            value=dtype,
            expected=f"{recorded}, as {metadata_path(path).name} records",
        )
    chosen = dtype or recorded or "uint16"
    itemsize = np.dtype(TOKEN_DTYPES[chosen]).itemsize
    size_bytes = path.stat().st_size
    if size_bytes == 0 or size_bytes % itemsize:
        raise SpecError(
            source=str(path),
            field="size",
            value=size_bytes,
            expected=f"a non-zero multiple of {itemsize} bytes ({chosen} tokens)",
        )
    num_tokens = size_bytes // itemsize
    if "num_tokens" in metadata and metadata["num_tokens"] != num_tokens:
        raise SpecError(
            source=str(metadata_path(path)),
            field="num_tokens",
            value=metadata["num_tokens"],
            expected=f"{num_tokens}, the {chosen} tokens {path.name} holds ({size_bytes} bytes)",
        )
    tokens = np.memmap(path, dtype=TOKEN_DTYPES[chosen], mode="r")
    return TokenFile(
        path=path,
        dtype=chosen,
        tokens=tokens,
        tokenizer=str(metadata.get("tokenizer", "")),
        document_offsets=_read_document_offsets(path, metadata, num_tokens=num_tokens),
    )


def _read_document_offsets(
    path: Path, metadata: dict[str, Any], *, num_tokens: int
) -> np.ndarray | None:
    """The document index the sidecar names, checked against the tokens; None if it names none."""
    name = metadata.get("document_index")
    if name is None:
        return None
    sidecar = metadata_path(path)
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\0" in name
        or (os.sep != "/" and os.sep in name)
    ):
        raise SpecError(
            source=str(sidecar),
            field="document_index",
            value=name,
            expected=f"the name of a file beside {path.name} (no directory part)",
        )
    index = path.with_name(name)
    num_documents = metadata.get("num_documents")
    if not isinstance(num_documents, int) or isinstance(num_documents, bool) or num_documents < 1:
        raise SpecError(
            source=str(sidecar),
            field="num_documents",
            value=num_documents,
            expected="a positive integer beside document_index",
        )
    expected_bytes = (num_documents + 1) * DOCUMENT_OFFSET_DTYPE.itemsize
    if not index.is_file() or index.stat().st_size != expected_bytes:
        raise SpecError(
            source=str(index),
            field="size",
            value=index.stat().st_size if index.is_file() else "no such file",
            expected=f"{expected_bytes} bytes: {num_documents} + 1 uint64 offsets, as "
            f"{sidecar.name} records",
        )
    offsets = np.memmap(index, dtype=DOCUMENT_OFFSET_DTYPE, mode="r")
    # Ends first (cheap), then the order of every boundary: a slice of a document must never
    # run backwards or past the tokens.
    ordered = bool(np.all(offsets[1:] >= offsets[:-1]))
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_tokens or not ordered:
        raise SpecError(
            source=str(index),
            field="offsets",
            value=f"{int(offsets[0])}..{int(offsets[-1])}",
            expected=f"non-decreasing token offsets from 0 to {num_tokens}, the tokens "
            f"{path.name} holds",
        )
    return offsets


def _read_metadata(path: Path) -> dict[str, Any]:
    sidecar = metadata_path(path)
    if not os.path.lexists(sidecar):
        return {}
    data = read_user_json(
        sidecar, source=str(sidecar), max_bytes=MAX_SIDECAR_BYTES, what="readable JSON"
    )
    if not isinstance(data, dict) or data.get("format") != TOKEN_FILE_FORMAT:
        raise SpecError(
            source=str(sidecar),
            field="format",
            value=data.get("format") if isinstance(data, dict) else data,
            expected=repr(TOKEN_FILE_FORMAT),
        )
    if data.get("dtype") not in TOKEN_DTYPES:
        raise SpecError(
            source=str(sidecar),
            field="dtype",
            value=data.get("dtype"),
            expected=" or ".join(TOKEN_DTYPES),
        )
    return data


def write_token_file(
    path: str | Path,
    tokens: np.ndarray,
    *,
    dtype: str | None = None,
    tokenizer: str = "",
    overwrite: bool = False,
) -> TokenFile:
    """Write token ids (and the sidecar) atomically; refuse to replace existing files.

    ``dtype`` defaults to uint16 when every id fits, else uint32.
    """
    path = Path(path)
    sidecar = metadata_path(path)
    for target in (path, sidecar):
        if target.exists() and not overwrite:
            raise FileExistsError(f"{target} exists; not overwriting it")
    values = np.asarray(tokens)
    if values.ndim != 1 or values.size == 0 or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"tokens must be a non-empty 1-D integer array, got {values.dtype}")
    low, high = int(values.min()), int(values.max())
    chosen = dtype or ("uint16" if high < 2**16 else "uint32")
    limit = np.iinfo(TOKEN_DTYPES[chosen]).max
    if low < 0 or high > limit:
        raise ValueError(f"token ids span {low}..{high}; {chosen} holds 0..{limit}")
    metadata = {
        "format": TOKEN_FILE_FORMAT,
        "version": 1,
        "dtype": chosen,
        "num_tokens": int(values.size),
        "tokenizer": tokenizer,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # Both files are written under temporary names first, then renamed: a crash leaves the
    # previous files (or none), never a half-written one under the real name.
    data_tmp = _write_temporary(path, values.astype(TOKEN_DTYPES[chosen]).tobytes())
    meta_tmp = _write_temporary(sidecar, (json.dumps(metadata, indent=1) + "\n").encode())
    os.replace(data_tmp, path)
    os.replace(meta_tmp, sidecar)
    return open_token_file(path)


def write_text_token_file(text: str, path: str | Path, *, overwrite: bool = False) -> TokenFile:
    """Tokenize ``text`` with the byte tokenizer and write it as a uint16 token file."""
    tokenizer = ByteTokenizer()
    return write_token_file(
        path, tokenizer.encode(text), dtype="uint16", tokenizer=tokenizer.name, overwrite=overwrite
    )


def check_token_ids(tokens: TokenFile, *, vocab_size: int) -> None:
    """Refuse a token file holding ids the model's embedding has no row for."""
    highest = int(tokens.tokens.max())
    if highest >= vocab_size:
        raise SpecError(
            source=str(tokens.path),
            field="tokens",
            value=highest,
            expected=f"token ids below the model's vocabulary size {vocab_size}",
        )


def _write_temporary(target: Path, payload: bytes) -> Path:
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            os.fchmod(stream.fileno(), file_mode())  # not mkstemp's 0600 (piebald.outputs)
            stream.write(payload)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)
