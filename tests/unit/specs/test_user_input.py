"""The one way to read a user's file: regular files only, bounded size, UTF-8, bounded
JSON and TOML nesting, and every refusal one SpecError line naming the source."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piebald.errors import SpecError
from piebald.specs.user_input import (
    MAX_NESTING,
    check_regular_file,
    check_unicode,
    parse_user_json,
    read_user_bytes,
    read_user_json,
    read_user_text,
    read_user_toml,
)


def _one_line(error: pytest.ExceptionInfo[SpecError]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def _special(kind: str, directory: Path) -> Path:
    path = directory / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "missing":
        pass
    elif kind == "dangling":
        path.symlink_to(directory / "nowhere")
    return path


_READERS: dict[str, Callable[[Path, str], object]] = {
    "bytes": lambda path, source: read_user_bytes(path, source=source, max_bytes=1 << 20),
    "text": lambda path, source: read_user_text(path, source=source, max_bytes=1 << 20),
    "json": lambda path, source: read_user_json(path, source=source, max_bytes=1 << 20),
    "toml": lambda path, source: read_user_toml(path, source=source, max_bytes=1 << 20),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["fifo", "zero", "directory", "missing", "dangling"]),
    reader=st.sampled_from(sorted(_READERS)),
    flag=st.booleans(),
)
def test_special_files_are_refused_before_reading(kind: str, reader: str, flag: bool) -> None:
    """A FIFO (which would block), /dev/zero behind a link (which never ends), a directory,
    a missing path: one line, at once, naming the source and the path."""
    with tempfile.TemporaryDirectory() as scratch:
        path = _special(kind, Path(scratch))
        source = "--config" if flag else str(path)
        with pytest.raises(SpecError) as error:
            _READERS[reader](path, source)
        line = _one_line(error)
        assert line.startswith(f"{source}: ")
        assert str(path) in line
        if kind in ("fifo", "zero", "directory"):
            assert "regular file" in line


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(SpecError, match="a regular file \\(it is a socket\\)"):
            read_user_text(path, source="--config", max_bytes=100)


def test_check_regular_file_accepts_a_link_to_a_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert check_regular_file(tmp_path / "b", source="f").st_size == 1


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 300), limit=st.integers(0, 300))
def test_size_is_bounded(size: int, limit: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "f"
        path.write_bytes(b"a" * size)
        if size <= limit:
            assert read_user_bytes(path, source="f", max_bytes=limit) == b"a" * size
        else:
            with pytest.raises(SpecError, match=f"at most {limit} bytes"):
                read_user_bytes(path, source="f", max_bytes=limit)


def test_size_message_uses_binary_units(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 2049)
    with pytest.raises(SpecError, match="at most 2 KiB"):
        read_user_bytes(path, source="f", max_bytes=2048)


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.text(max_size=20),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]),
)
def test_invalid_utf8_is_one_line(prefix: str, bad: bytes) -> None:
    """Invalid bytes and UTF-8-encoded lone surrogates (ED A0 80) are refused."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "f.json"
        path.write_bytes(prefix.encode("utf-8", "surrogatepass") + bad)
        for reader in ("text", "json", "toml"):
            with pytest.raises(SpecError, match="UTF-8 text") as error:
                _READERS[reader](path, str(path))
            _one_line(error)


@settings(max_examples=30, deadline=None)
@given(text=st.text())
def test_utf8_text_round_trips(text: str) -> None:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: not text a file can hold
        with pytest.raises(SpecError, match="lone surrogates"):
            check_unicode(text, source="f", field="line 1")
        return
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "f"
        path.write_bytes(data)
        assert read_user_text(path, source="f", max_bytes=len(data)) == text
    assert check_unicode(text, source="f", field="line 1") == text


def test_a_lone_surrogate_names_source_and_field() -> None:
    with pytest.raises(SpecError) as error:
        check_unicode(json.loads('"ab\\ud800"'), source="d.jsonl", field="line 3")
    assert _one_line(error).startswith("d.jsonl: line 3: expected text without lone")
    assert "U+D800" in str(error.value)


def _json_nested(depth: int, mapping: bool) -> str:
    if mapping:
        return '{"a": ' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


def _toml_nested(depth: int, mapping: bool) -> str:
    if mapping:
        return "x = " + "{a = " * depth + "1" + "}" * depth + "\n"
    return "x = " + "[" * depth + "]" * depth + "\n"


@settings(max_examples=30, deadline=None)
@given(
    depth=st.one_of(st.integers(1, 80), st.sampled_from([3000, 20_000])),
    mapping=st.booleans(),
    toml=st.booleans(),
)
def test_depth_is_bounded(depth: int, mapping: bool, toml: bool) -> None:
    """Up to MAX_NESTING levels load; deeper is one line, also far past Python's
    recursion limit (the parsers' RecursionError)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "f"
        path.write_text(_toml_nested(depth, mapping) if toml else _json_nested(depth, mapping))
        read = read_user_toml if toml else read_user_json
        total = depth + 1 if toml else depth  # TOML's top-level table is one more level
        if total <= MAX_NESTING:
            read(path, source="f", max_bytes=1 << 20)
        else:
            with pytest.raises(SpecError, match=f"at most {MAX_NESTING} levels deep") as error:
                read(path, source="f", max_bytes=1 << 20)
            _one_line(error)


def test_max_depth_is_the_callers() -> None:
    assert parse_user_json("[[1]]", source="s", max_depth=2) == [[1]]
    with pytest.raises(SpecError, match="at most 1 levels deep"):
        parse_user_json("[[1]]", source="s", max_depth=1)


def test_parse_errors_name_source_field_and_what(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as error:
        parse_user_json("{", source="d.jsonl", field="line 2", what="a JSON object")
    assert _one_line(error).startswith("d.jsonl: line 2: expected a JSON object (")
    path = tmp_path / "job.toml"
    path.write_text("steps = = 2\n")
    with pytest.raises(SpecError) as error:
        read_user_toml(path, source="--config", max_bytes=100)
    assert _one_line(error).startswith(f"--config: {path}: expected TOML (")


def test_huge_json_integer_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text("9" * 10_000)
    with pytest.raises(SpecError, match=r"f\.json: expected JSON"):
        read_user_json(path, source=str(path), max_bytes=1 << 20)


def test_reads_valid_files(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text('{"a": [1, 2], "é": "ü"}')
    assert read_user_json(path, source="f", max_bytes=100) == {"a": [1, 2], "é": "ü"}
    path.write_text('steps = 3\nlr = 1e-3\n[t]\na = "b"\n')
    assert read_user_toml(path, source="f", max_bytes=100) == {
        "steps": 3,
        "lr": 1e-3,
        "t": {"a": "b"},
    }
