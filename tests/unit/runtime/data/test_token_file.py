"""Token files: round trips in both dtypes, nanoGPT files without a sidecar, the dtype rule,
atomic writes that never replace a file silently, one-line errors for bad files, and the
optional document index (written document by document, checked against the tokens)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from piebald.errors import SpecError
from piebald.runtime.data import (
    ByteTokenizer,
    check_token_ids,
    document_index_path,
    metadata_path,
    open_token_file,
    write_text_token_file,
    write_token_file,
)
from piebald.runtime.data.token_writer import TokenFileWriter
from small_disk import fill, small_disk


@pytest.mark.parametrize(
    ("values", "dtype", "itemsize"),
    [(np.arange(1000) % 50000, "uint16", 2), (np.array([0, 7, 70000, 2**32 - 1]), "uint32", 4)],
)
def test_round_trip_picks_the_narrowest_dtype(
    tmp_path: Path, values: np.ndarray, dtype: str, itemsize: int
) -> None:
    path = tmp_path / "train.bin"
    written = write_token_file(path, values, tokenizer="test")
    assert written.dtype == dtype and written.num_tokens == len(values)
    assert path.stat().st_size == itemsize * len(values)  # no header: nanoGPT's layout
    reopened = open_token_file(path)
    assert reopened.dtype == dtype and reopened.tokenizer == "test"
    assert reopened.tokens.tolist() == values.tolist()
    assert not reopened.tokens.flags.writeable
    sidecar = json.loads(metadata_path(path).read_text())
    assert metadata_path(path).name == "train.bin.json"
    assert sidecar["dtype"] == dtype and sidecar["num_tokens"] == len(values)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_nanogpt_files_without_sidecar_read_as_uint16_or_the_given_dtype(tmp_path: Path) -> None:
    path = tmp_path / "val.bin"
    np.array([1, 2, 3, 4], dtype=np.uint16).tofile(path)  # what nanoGPT's prepare.py writes
    assert open_token_file(path).tokens.tolist() == [1, 2, 3, 4]
    as_uint32 = open_token_file(path, dtype="uint32")
    assert as_uint32.tokens.tolist() == [1 + (2 << 16), 3 + (4 << 16)]
    assert as_uint32.tokenizer == ""


def test_explicit_dtype_must_agree_with_the_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(8))
    assert open_token_file(path, dtype="uint16").num_tokens == 8
    with pytest.raises(
        SpecError, match=r"t.bin: dtype: got 'uint32'; expected uint16, as t.bin.json"
    ):
        open_token_file(path, dtype="uint32")
    with pytest.raises(SpecError, match="dtype: got 'int8'; expected uint16 or uint32"):
        open_token_file(path, dtype="int8")


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"missing.bin: expected a token file"):
        open_token_file(tmp_path / "missing.bin")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"abc")
    with pytest.raises(SpecError, match=r"odd.bin: size: got 3; expected a non-zero multiple of 2"):
        open_token_file(odd)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(SpecError, match="size: got 0"):
        open_token_file(empty)

    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(8))
    path.write_bytes(np.arange(6, dtype=np.uint16).tobytes())  # replaced behind our back
    with pytest.raises(SpecError, match=r"t.bin.json: num_tokens: got 8; expected 6"):
        open_token_file(path)
    metadata_path(path).write_text("{not json")
    with pytest.raises(SpecError, match=r"t.bin.json: expected readable JSON"):
        open_token_file(path)
    metadata_path(path).write_text('{"format": "other"}')
    with pytest.raises(SpecError, match=r"t.bin.json: format: got 'other'"):
        open_token_file(path)


def test_existing_files_are_never_replaced_silently(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(8))
    with pytest.raises(FileExistsError, match=r"t.bin exists"):
        write_token_file(path, np.arange(4))
    assert open_token_file(path).num_tokens == 8  # untouched
    metadata_path(path).unlink()
    with pytest.raises(FileExistsError, match=r"t.bin exists"):
        write_token_file(path, np.arange(4))
    assert write_token_file(path, np.arange(4), overwrite=True).num_tokens == 4


def test_values_must_fit_the_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"span 0..70000; uint16 holds 0..65535"):
        write_token_file(tmp_path / "a.bin", np.array([0, 70000]), dtype="uint16")
    with pytest.raises(ValueError, match="non-empty 1-D integer"):
        write_token_file(tmp_path / "b.bin", np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="span -1"):
        write_token_file(tmp_path / "c.bin", np.array([-1, 3]))


@pytest.mark.parametrize("name", ["corpus.txt", "docs.jsonl", "rows.parquet"])
def test_a_document_file_given_as_tokens_says_to_prepare_it(tmp_path: Path, name: str) -> None:
    # Read as raw uint16 tokens, "he" would be id 25960: a valid GPT-2 token, so only the
    # file's kind can tell (a token file of any name with a sidecar still opens).
    path = tmp_path / name
    path.write_bytes(b"hello world, some text\n")
    with pytest.raises(SpecError, match=rf"{name}: expected a token file, not a .* document"):
        open_token_file(path)
    write_token_file(tmp_path / "tokens.txt", np.arange(4))
    assert open_token_file(tmp_path / "tokens.txt").tokens.tolist() == [0, 1, 2, 3]


def test_text_files_use_the_byte_tokenizer(tmp_path: Path) -> None:
    text = "Tokens are bytes: ü is two of them.\n"
    written = write_text_token_file(text, tmp_path / "text.bin")
    assert written.dtype == "uint16" and written.tokenizer == "bytes"
    assert written.num_tokens == len(text.encode("utf-8"))
    assert ByteTokenizer().decode(open_token_file(tmp_path / "text.bin").tokens) == text


def test_token_ids_must_fit_the_models_vocabulary(tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path / "t.bin", np.array([3, 300, 5]))
    check_token_ids(tokens, vocab_size=301)
    with pytest.raises(SpecError, match=r"t.bin: tokens: got 300; expected token ids below .* 256"):
        check_token_ids(tokens, vocab_size=256)


def test_document_index_round_trip_and_files_without_one(tmp_path: Path) -> None:
    documents = [np.array([5, 6, 7]), np.array([], dtype=np.int64), np.array([70000, 1])]
    writer = TokenFileWriter(tmp_path / "d.bin", dtype="uint32")
    writer.add_documents(documents[:2])
    writer.add_documents(documents[2:])
    written = writer.commit(tokenizer="test", metadata={"extra": 1})
    offsets = written.document_offsets
    assert offsets is not None and written.num_documents == 3
    assert offsets.tolist() == [0, 3, 3, 5]
    assert document_index_path(tmp_path / "d.bin").stat().st_size == 8 * 4
    assert written.tokens.tolist() == np.concatenate(documents).tolist()
    sidecar = json.loads(metadata_path(tmp_path / "d.bin").read_text())
    assert sidecar["max_token_id"] == 70000 and sidecar["extra"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.bin.idx", "d.bin.json"]
    # Files from write_token_file, nanoGPT, and sidecars older than the index: no documents.
    plain = write_token_file(tmp_path / "plain.bin", np.arange(4))
    assert plain.document_offsets is None and plain.num_documents is None
    old = tmp_path / "old.bin"
    np.arange(4, dtype=np.uint16).tofile(old)
    metadata_path(old).write_text(
        '{"format": "piebald.tokens", "version": 1, "dtype": "uint16", "num_tokens": 4, '
        '"tokenizer": "bytes"}'
    )
    assert open_token_file(old).num_documents is None


def test_a_document_index_that_does_not_fit_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "d.bin"
    writer = TokenFileWriter(path, dtype="uint16")
    writer.add_documents([np.arange(4), np.arange(3)])
    writer.commit(tokenizer="test", metadata={})
    index = document_index_path(path)
    good = index.read_bytes()
    index.write_bytes(good[:-8])
    with pytest.raises(SpecError, match=r"d.bin.idx: size: got 16; expected 24 bytes: 2 \+ 1"):
        open_token_file(path)
    index.write_bytes(np.array([0, 5, 6], dtype="<u8").tobytes())
    with pytest.raises(SpecError, match=r"d.bin.idx: offsets: got '0..6'; expected .* 0 to 7"):
        open_token_file(path)
    index.write_bytes(np.array([0, 8, 7], dtype="<u8").tobytes())
    with pytest.raises(SpecError, match=r"offsets: got '0..7'; expected non-decreasing"):
        open_token_file(path)
    index.unlink()
    with pytest.raises(SpecError, match=r"d.bin.idx: size: got 'no such file'"):
        open_token_file(path)


@pytest.mark.parametrize("name", ["sub/x.idx", "", "/etc/passwd", "..", ".", 3, ["x"]])
def test_a_document_index_name_with_a_directory_part_is_one_line(
    tmp_path: Path, name: object
) -> None:
    """``path.with_name`` raised ValueError for these: each is one line naming the sidecar."""
    path = tmp_path / "d.bin"
    writer = TokenFileWriter(path, dtype="uint16")
    writer.add_documents([np.arange(4), np.arange(3)])
    writer.commit(tokenizer="test", metadata={})
    sidecar = metadata_path(path)
    data = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**data, "document_index": name}))
    with pytest.raises(SpecError) as error:
        open_token_file(path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{sidecar}: document_index: got ")
    assert "expected the name of a file beside d.bin" in message


@pytest.mark.parametrize("kind", ["deep", "fifo", "directory", "not-utf8"])
def test_a_hostile_sidecar_is_one_line(tmp_path: Path, kind: str) -> None:
    """A 100,000-deep sidecar was a RecursionError traceback; a FIFO must not block."""
    path = tmp_path / "t.bin"
    np.arange(8, dtype=np.uint16).tofile(path)
    sidecar = metadata_path(path)
    if kind == "deep":
        sidecar.write_text("[" * 100_000 + "]" * 100_000)
        expected = "at most 64 levels deep"
    elif kind == "fifo":
        os.mkfifo(sidecar)
        expected = "a regular file (it is a named pipe)"
    elif kind == "directory":
        sidecar.mkdir()
        expected = "a regular file (it is a directory)"
    else:
        sidecar.write_bytes(b'{"format": "\xff"}')
        expected = "UTF-8 text"
    with pytest.raises(SpecError) as error:
        open_token_file(path)
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(f"{sidecar}: expected ") and expected in str(error.value)


def test_a_full_disk_is_one_line_naming_out_and_leaves_no_temporary(tmp_path: Path) -> None:
    """``data prepare --out`` on a full disk gave an OSError traceback and left
    ``.d.train.bin.*`` behind: now one line naming --out, and discard removes them all."""

    from piebald.outputs import OutputError

    with small_disk(tmp_path / "disk", size="256k") as disk:
        for documents in (200, 1):  # fails while writing; fails when committing
            writer = TokenFileWriter(disk / "d.train.bin", dtype="uint16")
            with pytest.raises(OutputError) as caught:
                for _ in range(documents):
                    writer.add_documents([np.arange(1000) % 256])
                fill(disk / "filler")
                writer.commit(tokenizer="t", metadata={})
            writer.discard()
            (disk / "filler").unlink(missing_ok=True)
            assert str(caught.value) == (
                f"--out: got {str(disk / 'd.train.bin')!r}; expected a location piebald can "
                "write (No space left on device)"
            )
            assert list(disk.iterdir()) == []
