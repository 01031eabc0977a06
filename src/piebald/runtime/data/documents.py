"""Documents of a text corpus, read one at a time from the files that hold them.

What a document is depends on the file's extension:

- ``.txt``: the whole file is one document (UTF-8). Its text is held in memory while it is
  tokenized, so split a corpus that is one huge text file into several files (or JSONL).
- ``.jsonl``: one document per line, a JSON object whose ``text_field`` (default ``"text"``)
  holds the text; blank lines are skipped. Lines are read one at a time, each nested at
  most 64 levels deep, and a text holding a lone surrogate (``"\\ud800"``) is refused.
- ``.parquet``: one document per row of the ``text_field`` column (a string column), read in
  record batches; needs ``pyarrow``.

Documents are numbered in the order the files are given, then in file order; the validation
split and the document index follow that order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from piebald.errors import SpecError
from piebald.runtime.data.text_tokenizer import require_module
from piebald.specs.user_input import check_unicode, parse_user_json

__all__ = ["DOCUMENT_KINDS", "DocumentFile", "count_documents", "document_file", "read_documents"]

DOCUMENT_KINDS = {".txt": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
_PARQUET_ROWS_PER_BATCH = 1024  # rows of one text column: a few MB at most


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentFile:
    path: Path
    kind: str  # a value of DOCUMENT_KINDS
    size_bytes: int


def document_file(path: Path) -> DocumentFile:
    """``path`` as an input file, or a one-line error: it must exist and have a known suffix."""
    if not path.is_file():
        what = "a directory" if path.is_dir() else "no such file"
        raise SpecError(
            source=str(path), field="", has_value=False, expected=f"an input file ({what})"
        )
    kind = DOCUMENT_KINDS.get(path.suffix.lower())
    if kind is None:
        raise SpecError(
            source=str(path),
            field="extension",
            value=path.suffix,
            expected=" or ".join(DOCUMENT_KINDS),
        )
    return DocumentFile(path=path, kind=kind, size_bytes=path.stat().st_size)


def count_documents(file: DocumentFile, *, text_field: str) -> int:
    """How many documents ``read_documents`` will yield (a parquet file's column is checked)."""
    if file.kind == "text":
        return 1
    if file.kind == "jsonl":
        with file.path.open("rb") as stream:
            return sum(1 for line in stream if line.strip())
    return int(_parquet_file(file.path, text_field=text_field).metadata.num_rows)


def read_documents(file: DocumentFile, *, text_field: str) -> Iterator[str]:
    """The text of each document of ``file``, in order; bad content is a one-line error."""
    if file.kind == "text":
        yield _read_text(file.path)
    elif file.kind == "jsonl":
        yield from _read_jsonl(file.path, text_field=text_field)
    else:
        yield from _read_parquet(file.path, text_field=text_field)


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(
            source=str(path),
            field=f"byte {error.start}",
            has_value=False,
            expected="UTF-8 text",
        ) from None


def _read_jsonl(path: Path, *, text_field: str) -> Iterator[str]:
    with path.open("rb") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            record = parse_user_json(line, source=where, what="a JSON object")
            if not isinstance(record, dict):
                raise SpecError(
                    source=where,
                    field="",
                    value=type(record).__name__,
                    expected=f"a JSON object with a {text_field!r} field",
                )
            if text_field not in record:
                raise SpecError(
                    source=where,
                    field=text_field,
                    has_value=False,
                    expected=f"a string field (the object has {sorted(record)[:8]}; "
                    "--text-field names another)",
                )
            text = record[text_field]
            if not isinstance(text, str):
                raise SpecError(source=where, field=text_field, value=text, expected="a string")
            # JSON can escape a lone surrogate ("\\ud800"), which no tokenizer can encode.
            yield check_unicode(text, source=where, field=text_field)


def _parquet_file(path: Path, *, text_field: str) -> Any:  # a pyarrow ParquetFile
    parquet = require_module("pyarrow.parquet", purpose="to read parquet", source=str(path))
    pyarrow = require_module("pyarrow", purpose="to read parquet", source=str(path))
    try:
        handle = parquet.ParquetFile(path)
    except (OSError, pyarrow.ArrowException) as error:
        raise SpecError(
            source=str(path), field="", has_value=False, expected=f"a parquet file ({error})"
        ) from None
    schema = handle.schema_arrow
    if text_field not in schema.names:
        raise SpecError(
            source=str(path),
            field=text_field,
            has_value=False,
            expected=f"a string column (the file has {schema.names[:8]}; --text-field names "
            "another)",
        )
    column_type = schema.field(text_field).type
    types = pyarrow.types
    if not (types.is_string(column_type) or types.is_large_string(column_type)):
        raise SpecError(
            source=str(path), field=text_field, value=str(column_type), expected="a string column"
        )
    return handle


def _read_parquet(path: Path, *, text_field: str) -> Iterator[str]:
    handle = _parquet_file(path, text_field=text_field)
    row = 0
    for batch in handle.iter_batches(batch_size=_PARQUET_ROWS_PER_BATCH, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            if text is None:
                raise SpecError(
                    source=f"{path}: row {row}", field=text_field, value=None, expected="a string"
                )
            row += 1
            yield text
