"""Writing a token file document by document, without holding the corpus in memory.

The ids and the document index (see ``token_file``) stream into temporary files in the
target's directory; ``commit`` fsyncs them, writes the sidecar the same way, then renames the
three into place (tokens, index, sidecar last) and fsyncs the directory. A crash or an error
leaves the previous files, or none, never a half-written one under the real name; and a
sidecar that does not belong to the tokens beside it is caught by ``open_token_file``'s token
count check. An OS error while writing (a full disk) is an
:class:`~piebald.outputs.OutputError` naming ``--out``, the file and the OS's words; the
temporaries are removed (``discard``, which the caller runs after any error).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from piebald.errors import SpecError
from piebald.outputs import check_output_file, file_mode, write_error
from piebald.runtime.data.token_file import (
    DOCUMENT_OFFSET_DTYPE,
    TOKEN_DTYPES,
    TOKEN_FILE_FORMAT,
    TokenFile,
    document_index_path,
    metadata_path,
    open_token_file,
)

__all__ = ["TokenFileWriter", "check_output_paths", "output_paths", "token_dtype_for"]


def token_dtype_for(vocab_size: int, *, source: str) -> str:
    """uint16 when every id of a ``vocab_size`` vocabulary fits (nanoGPT's choice), else uint32."""
    for name, dtype in TOKEN_DTYPES.items():  # narrowest first
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return name
    raise SpecError(
        source=source,
        field="vocabulary",
        value=vocab_size,
        expected=f"ids that fit uint32 (a vocabulary of at most {2**32} tokens)",
    )


def output_paths(path: Path) -> tuple[Path, Path, Path]:
    """The files a token file with a document index is: tokens, index, sidecar."""
    return path, document_index_path(path), metadata_path(path)


def check_output_paths(paths: Iterable[Path], *, overwrite: bool, flag: str = "--out") -> None:
    """Before any work: refuse existing outputs unless ``overwrite``, and even then anything
    but a regular file; the directories must be writable (``piebald.outputs``)."""
    for path in paths:
        check_output_file(path, flag=flag, force=overwrite)


class TokenFileWriter:
    """Appends documents to a new token file; ``commit`` puts it in place, ``discard`` not.
    Every OS error is an :class:`~piebald.outputs.OutputError` naming ``flag``; the
    temporaries of a writer whose construction fails are removed before it raises."""

    def __init__(self, path: Path, *, dtype: str, flag: str = "--out") -> None:
        self.path = path
        self.dtype = dtype
        self.flag = flag
        self.num_tokens = 0
        self.num_documents = 0
        self.max_token_id = -1  # none yet
        self._limit = int(np.iinfo(TOKEN_DTYPES[dtype]).max)
        self._temporaries: list[Path] = []
        self._streams: list[IO[bytes]] = []
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # checked by check_output_paths
            self._tokens = self._open_temporary(path)
            self._index = self._open_temporary(document_index_path(path))
            self._index.write(np.zeros(1, dtype=DOCUMENT_OFFSET_DTYPE).tobytes())
        except OSError as error:
            self.discard()
            raise write_error(error, flag=flag, path=path) from None

    def add_documents(self, documents: Sequence[Sequence[int] | np.ndarray]) -> None:
        """Append whole documents (their ids, in order); an id the dtype cannot hold is refused."""
        if not documents:
            return
        lengths = np.fromiter((len(ids) for ids in documents), dtype=np.int64, count=len(documents))
        ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in documents])
        if ids.size:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high > self._limit:
                raise ValueError(
                    f"token ids span {low}..{high}; {self.dtype} holds 0..{self._limit}"
                )
            self.max_token_id = max(self.max_token_id, high)
            self._write(self._tokens, ids.astype(TOKEN_DTYPES[self.dtype]).tobytes())
        ends = self.num_tokens + np.cumsum(lengths)
        self._write(self._index, ends.astype(DOCUMENT_OFFSET_DTYPE).tobytes())
        self.num_tokens += int(ids.size)
        self.num_documents += len(documents)

    def commit(self, *, tokenizer: str, metadata: Mapping[str, Any]) -> TokenFile:
        """Finish the files and rename them into place; ``metadata`` adds sidecar fields."""
        if self.num_tokens == 0:
            raise ValueError(f"{self.path}: no tokens to write")
        sidecar = {
            "format": TOKEN_FILE_FORMAT,
            "version": 1,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "tokenizer": tokenizer,
            "num_documents": self.num_documents,
            "document_index": document_index_path(self.path).name,
            "max_token_id": self.max_token_id,
            **metadata,
        }
        try:
            meta = self._open_temporary(metadata_path(self.path))
            meta.write((json.dumps(sidecar, indent=1) + "\n").encode())
            temporaries = list(self._temporaries)
            for stream in (self._tokens, self._index, meta):
                _close_synced(stream)
            for temporary, target in zip(temporaries, output_paths(self.path), strict=True):
                os.replace(temporary, target)
            self._temporaries.clear()
            _sync_directory(self.path.parent)
        except OSError as error:
            raise write_error(error, flag=self.flag, path=self.path) from None
        return open_token_file(self.path)

    def discard(self) -> None:
        """Remove the temporary files (after an error, a full disk included: closing a
        stream whose buffer cannot be written fails too, and is ignored here); the real
        names are untouched."""
        for stream in self._streams:
            try:
                stream.close()
            except OSError:
                with contextlib.suppress(OSError):
                    stream.close()  # the buffer is dropped, the descriptor closed
        self._streams.clear()
        for temporary in self._temporaries:
            temporary.unlink(missing_ok=True)
        self._temporaries.clear()

    def _write(self, stream: IO[bytes], data: bytes) -> None:
        try:
            stream.write(data)
        except OSError as error:
            raise write_error(error, flag=self.flag, path=self.path) from None

    def _open_temporary(self, target: Path) -> IO[bytes]:
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        self._temporaries.append(Path(name))
        # mkstemp makes the file private (0600); outputs get piebald's one mode policy.
        os.fchmod(handle, file_mode())
        stream = os.fdopen(handle, "wb")
        self._streams.append(stream)
        return stream


def _close_synced(stream: IO[bytes]) -> None:
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()


def _sync_directory(directory: Path) -> None:
    # The renames are durable only once the directory entry is on disk too.
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
