"""``piebald data prepare``: every document's slice of the token file is exactly what the
``tokenizers`` library encodes it to (the oracle), plus EOS; the narrowest dtype; a
validation split that partitions the documents; no file replaced without --force; and one
line, exit 2, for each kind of bad input."""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cli_runner import run_cli
from piebald.errors import SpecError
from piebald.runtime.data import open_token_file
from piebald.runtime.data import prepare as prepare_module
from piebald.runtime.data.token_writer import TokenFileWriter, token_dtype_for

EOS = "<|endoftext|>"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "Sphinx of black quartz, judge my vow.",
    "How vexingly quick daft zebras jump; naïve café über straße.",
    "",  # an empty document is still a document (its EOS alone)
    "Numbers 12345 and    spaces\n\nand new lines.",
    "  leading spaces and trailing ones  ",
]


def prepare(tokenizer: str, *args: str) -> tuple[int, str]:
    """(exit code, output) of ``piebald data prepare --tokenizer TOKENIZER ARGS...``."""
    return run_cli("data", "prepare", "--tokenizer", tokenizer, *args)


def _train_bpe(path: Path) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SENTENCES * 4, trainer=trainer)
    tokenizer.save(str(path))
    return Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tokenizer]:
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    return path, _train_bpe(path)


def _documents(count: int) -> list[str]:
    return [f"{SENTENCES[i % len(SENTENCES)]} (document {i})" for i in range(count)]


def _write_jsonl(path: Path, texts: list[str], *, field: str = "text") -> Path:
    lines = [json.dumps({"id": i, field: text}) for i, text in enumerate(texts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _documents_of(path: Path) -> list[list[int]]:
    token_file = open_token_file(path)
    offsets = token_file.document_offsets
    assert (
        offsets is not None and int(offsets[0]) == 0 and int(offsets[-1]) == len(token_file.tokens)
    )
    tokens = token_file.tokens
    return [tokens[int(a) : int(b)].tolist() for a, b in itertools.pairwise(offsets)]


def test_every_document_is_its_encoding_then_eos(
    tmp_path: Path, bpe: tuple[Path, Tokenizer]
) -> None:
    tokenizer_path, tokenizer = bpe
    first = tmp_path / "a.txt"
    first.write_text("One whole file is one document.\n\nEven with blank lines.", encoding="utf-8")
    jsonl = _write_jsonl(tmp_path / "b.jsonl", SENTENCES)
    parquet = tmp_path / "c.parquet"
    parquet_texts = _documents(5)
    pq.write_table(pa.table({"text": parquet_texts, "n": list(range(5))}), parquet)
    code, output = prepare(
        str(tokenizer_path),
        "--input",
        str(first),
        "--input",
        str(jsonl),
        str(parquet),
        "--out",
        str(tmp_path / "out" / "mix"),
    )
    assert code == 0, output
    texts = [first.read_text(encoding="utf-8"), *SENTENCES, *parquet_texts]
    eos = tokenizer.token_to_id(EOS)
    expected = [[*tokenizer.encode(text).ids, eos] for text in texts]
    train = tmp_path / "out" / "mix.train.bin"
    assert _documents_of(train) == expected
    assert not (tmp_path / "out" / "mix.val.bin").exists()

    token_file = open_token_file(train)
    assert token_file.dtype == "uint16" and train.stat().st_size == 2 * token_file.num_tokens
    sidecar = json.loads((tmp_path / "out" / "mix.train.bin.json").read_text())
    assert sidecar["tokenizer"] == str(tokenizer_path.resolve()) == token_file.tokenizer
    assert sidecar["tokenizer_sha256"] == hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
    assert sidecar["vocab_size"] == tokenizer.get_vocab_size(with_added_tokens=True)
    assert sidecar["num_documents"] == len(texts) == token_file.num_documents
    assert sidecar["max_token_id"] == max(max(ids) for ids in expected)
    assert sidecar["eos_token"] == EOS and sidecar["eos_token_id"] == eos
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []


def test_without_eos_documents_are_exactly_their_encoding(
    tmp_path: Path, bpe: tuple[Path, Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer_path, tokenizer = bpe
    monkeypatch.setattr(prepare_module, "_BATCH_DOCUMENTS", 3)  # several encode batches
    texts = _documents(11)
    jsonl = _write_jsonl(tmp_path / "d.jsonl", texts)
    code, output = prepare(
        str(tokenizer_path),
        "--input",
        str(jsonl),
        "--out",
        str(tmp_path / "d"),
        "--no-append-eos",
    )
    assert code == 0, output
    assert _documents_of(tmp_path / "d.train.bin") == [tokenizer.encode(t).ids for t in texts]
    assert json.loads((tmp_path / "d.train.bin.json").read_text())["eos_token_id"] is None


def test_a_vocabulary_beyond_uint16_is_written_as_uint32(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, EOS: 1} | {f"w{i}": i + 2 for i in range(70_000)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    texts = ["w69999 w3 w65536", "w0 unknown w70000 w65535"]
    jsonl = _write_jsonl(tmp_path / "big.jsonl", texts)
    code, output = prepare(
        str(path),
        "--input",
        str(jsonl),
        "--out",
        str(tmp_path / "big"),
    )
    assert code == 0, output
    train = tmp_path / "big.train.bin"
    assert open_token_file(train).dtype == "uint32"
    assert _documents_of(train) == [[*tokenizer.encode(t).ids, 1] for t in texts]
    assert max(tokenizer.encode(texts[0]).ids) > 2**16  # the test exercises uint32 ids


@pytest.mark.parametrize(
    ("flag", "value", "num_validation"),
    [("--validation-fraction", "0.25", 5), ("--validation-documents", "7", 7)],
)
def test_validation_split_partitions_whole_documents(
    tmp_path: Path,
    bpe: tuple[Path, Tokenizer],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    value: str,
    num_validation: int,
) -> None:
    tokenizer_path, tokenizer = bpe
    monkeypatch.setattr(prepare_module, "_BATCH_DOCUMENTS", 4)
    texts = _documents(20)  # distinct: each document is recognisable in either split
    jsonl = _write_jsonl(tmp_path / "s.jsonl", texts)
    eos = tokenizer.token_to_id(EOS)
    encoded = [tuple([*tokenizer.encode(t).ids, eos]) for t in texts]
    written = []
    for prefix in ("s", "again"):
        code, output = prepare(
            str(tokenizer_path),
            "--input",
            str(jsonl),
            "--out",
            str(tmp_path / prefix),
            flag,
            value,
        )
        assert code == 0, output
        train = [tuple(d) for d in _documents_of(tmp_path / f"{prefix}.train.bin")]
        val = [tuple(d) for d in _documents_of(tmp_path / f"{prefix}.val.bin")]
        assert len(val) == num_validation and len(train) == len(texts) - num_validation
        assert sorted(train + val) == sorted(encoded)  # a partition of the documents
        # Each split keeps input order: its documents are a subsequence of the input.
        for split in (train, val):
            positions = [encoded.index(d) for d in split]
            assert positions == sorted(positions)
        written.append([(tmp_path / f"{prefix}.{s}.bin").read_bytes() for s in ("train", "val")])
    assert written[0] == written[1]  # deterministic: no seed, no randomness


def test_existing_outputs_are_replaced_only_with_force(
    tmp_path: Path, bpe: tuple[Path, Tokenizer]
) -> None:
    tokenizer_path, tokenizer = bpe
    args = ["data", "prepare", "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o")]
    first = _write_jsonl(tmp_path / "first.jsonl", SENTENCES[:2])
    assert run_cli(*args, "--input", str(first))[0] == 0
    before = (tmp_path / "o.train.bin").read_bytes()
    second = _write_jsonl(tmp_path / "second.jsonl", SENTENCES[2:4])
    code, output = run_cli(*args, "--input", str(second))
    assert code == 2
    existing = tmp_path / "o.train.bin"
    assert output.strip() == (
        f"error: --out: got '{existing}'; expected a path that does not exist yet (it "
        "already exists; nothing was overwritten; pass --force to replace the file)"
    )
    assert (tmp_path / "o.train.bin").read_bytes() == before
    # Only the sidecar left over from an earlier run is enough to refuse.
    (tmp_path / "o.train.bin").unlink()
    (tmp_path / "o.train.bin.idx").unlink()
    assert run_cli(*args, "--input", str(second))[0] == 2
    assert run_cli(*args, "--input", str(second), "--force")[0] == 0
    eos = tokenizer.token_to_id(EOS)
    assert _documents_of(tmp_path / "o.train.bin") == [
        [*tokenizer.encode(t).ids, eos] for t in SENTENCES[2:4]
    ]
    replaced = (tmp_path / "o.train.bin").read_bytes()
    # --force replaces regular files only, never a directory or a symbolic link.
    (tmp_path / "dir.train.bin").mkdir()
    code, output = run_cli(*args[:-1], str(tmp_path / "dir"), "--input", str(second), "--force")
    assert code == 2 and "dir.train.bin'; expected a regular file to replace" in output
    (tmp_path / "link.train.bin").symlink_to(tmp_path / "o.train.bin")
    code, output = run_cli(*args[:-1], str(tmp_path / "link"), "--input", str(second), "--force")
    assert code == 2 and "link.train.bin'; expected a regular file to replace" in output
    assert (tmp_path / "link.train.bin").is_symlink()
    assert (tmp_path / "o.train.bin").read_bytes() == replaced  # the link's target: untouched


def test_a_model_directory_and_its_configured_eos(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS, "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SENTENCES, trainer=trainer)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    # transformers' AddedToken form; it takes precedence over the well-known <|endoftext|>.
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "<|end|>", "special": True}})
    )
    txt = tmp_path / "doc.txt"
    txt.write_text(SENTENCES[3], encoding="utf-8")
    code, output = prepare(
        str(model_dir),
        "--input",
        str(txt),
        "--out",
        str(tmp_path / "m"),
    )
    assert code == 0, output
    end = tokenizer.token_to_id("<|end|>")
    assert _documents_of(tmp_path / "m.train.bin") == [[*tokenizer.encode(SENTENCES[3]).ids, end]]
    # --eos-token overrides the configuration.
    code, output = prepare(
        str(model_dir),
        "--input",
        str(txt),
        "--out",
        str(tmp_path / "m"),
        "--eos-token",
        EOS,
        "--force",
    )
    assert code == 0, output
    assert _documents_of(tmp_path / "m.train.bin")[0][-1] == tokenizer.token_to_id(EOS)


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments after --tokenizer and --out, the error line expected)."""
    good = _write_jsonl(tmp / "good.jsonl", SENTENCES[:3])
    not_object = tmp / "list.jsonl"
    not_object.write_text('{"text": "fine"}\n\n["a", "list"]\n')
    no_field = tmp / "nofield.jsonl"
    no_field.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    bad_json = tmp / "bad.jsonl"
    bad_json.write_text('{"text": "fine"}\n{"text": \n')
    empty = tmp / "empty.jsonl"
    empty.write_text("\n  \n")
    unknown = tmp / "notes.md"
    unknown.write_text("# hi")
    no_column = tmp / "nocol.parquet"
    pq.write_table(pa.table({"body": ["x"]}), no_column)
    deep = tmp / "deep.jsonl"  # a RecursionError traceback before the depth guard
    deep.write_text('{"text": "fine"}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    surrogate = tmp / "surrogate.jsonl"  # valid JSON, a TypeError inside tokenizers
    surrogate.write_text('{"text": "fine"}\n\n{"text": "ab\\ud800"}\n')
    return {
        "line nested too deep": (
            ["--input", str(deep)],
            f"{deep}:2: expected a JSON object with lists and mappings at most 64 levels deep",
        ),
        "lone surrogate": (
            ["--input", str(surrogate)],
            f"{surrogate}:3: text: expected text without lone surrogates (U+D800 at character 2)",
        ),
        "missing input": (
            ["--input", str(tmp / "nope.jsonl")],
            f"{tmp / 'nope.jsonl'}: expected an input file (no such file)",
        ),
        "no input": ([], "--input: expected at least one input file"),
        "unknown extension": (
            ["--input", str(unknown)],
            f"{unknown}: extension: got '.md'; expected .txt or .jsonl or .parquet",
        ),
        "line not an object": (
            ["--input", str(not_object)],
            f"{not_object}:3: got 'list'; expected a JSON object with a 'text' field",
        ),
        "line lacks the field": (
            ["--input", str(no_field)],
            f"{no_field}:2: text: expected a string field (the object has ['body']; "
            "--text-field names another)",
        ),
        "line not JSON": (["--input", str(bad_json)], f"{bad_json}:2: expected a JSON object ("),
        "empty input": (
            ["--input", str(empty)],
            f"{empty}: expected at least one document (the inputs hold none)",
        ),
        "parquet lacks the column": (
            ["--input", str(no_column)],
            f"{no_column}: text: expected a string column (the file has ['body']",
        ),
        "fraction rounds to zero": (
            ["--input", str(good), "--validation-fraction", "0.1"],
            "--validation-fraction: got 0.1; expected between 1 and 2 validation documents",
        ),
        "both split flags": (
            ["--input", str(good), "--validation-fraction", "0.5", "--validation-documents", "1"],
            "--validation-fraction/--validation-documents: expected exactly one of the two",
        ),
        "every document to validation": (
            ["--input", str(good), "--validation-documents", "3"],
            "--validation-documents: got 3; expected between 1 and 2 validation documents",
        ),
        "eos not in vocabulary": (
            ["--input", str(good), "--eos-token", "<nope>"],
            "--eos-token: got '<nope>'; expected a token in the vocabulary of",
        ),
    }


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, bpe: tuple[Path, Tokenizer]) -> None:
    tokenizer_path, _ = bpe
    out = tmp_path / "out"
    out.mkdir()
    for name, (args, message) in _bad_inputs(tmp_path).items():
        code, output = prepare(str(tokenizer_path), "--out", str(out / "x"), *args)
        lines = output.strip().splitlines()
        assert code == 2 and len(lines) == 1, (name, output)
        assert lines[0].startswith(f"error: {message}"), (name, lines[0])
        assert list(out.iterdir()) == [], name  # nothing written, no temporary left behind


def test_bad_tokenizers_are_one_line_and_exit_2(tmp_path: Path) -> None:
    txt = tmp_path / "a.txt"
    txt.write_text("text")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": 3}')
    plain = tmp_path / "plain.json"  # a WordLevel tokenizer with no EOS of any kind
    Tokenizer(models.WordLevel({"[UNK]": 0, "text": 1}, unk_token="[UNK]")).save(str(plain))
    cases = {
        tmp_path / "nope.json": "nope.json: expected a tokenizer.json or a model directory",
        tmp_path: f"{tmp_path}: expected a tokenizer.json inside (a Hugging Face model directory)",
        broken: "broken.json: expected a tokenizer.json the tokenizers library reads",
        plain: "plain.json: eos_token: expected an end-of-document token",
    }
    nested = tmp_path / "nested"  # a RecursionError traceback before the depth guard
    nested.mkdir()
    _train_bpe(nested / "tokenizer.json")
    (nested / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    cases[nested] = "tokenizer_config.json: expected readable JSON with lists and mappings at"
    for tokenizer, message in cases.items():
        code, output = prepare(
            str(tokenizer),
            "--input",
            str(txt),
            "--out",
            str(tmp_path / "t"),
        )
        assert code == 2 and len(output.strip().splitlines()) == 1, output
        assert message in output, output
    code, output = prepare(
        str(plain),
        "--input",
        str(txt),
        "--out",
        str(tmp_path / "t"),
        "--no-append-eos",
    )
    assert code == 0, output


@pytest.mark.parametrize(("module", "suffix"), [("tokenizers", ".txt"), ("pyarrow", ".parquet")])
def test_a_missing_optional_package_says_what_to_install(
    tmp_path: Path,
    bpe: tuple[Path, Tokenizer],
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    suffix: str,
) -> None:
    data = tmp_path / f"data{suffix}"
    if suffix == ".txt":
        data.write_text("text")
    else:
        pq.write_table(pa.table({"text": ["x"]}), data)
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # import now raises ImportError
    code, output = prepare(
        str(bpe[0]),
        "--input",
        str(data),
        "--out",
        str(tmp_path / "x"),
    )
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert f"expected the {module}" in output and "pip install 'piebald[data]'" in output


def test_ids_beyond_uint32_are_refused(tmp_path: Path) -> None:
    assert token_dtype_for(2**16, source="t") == "uint16"
    assert token_dtype_for(2**16 + 1, source="t") == "uint32"
    assert token_dtype_for(2**32, source="t") == "uint32"
    with pytest.raises(SpecError, match=r"t: vocabulary: got 4294967297; expected ids that fit"):
        token_dtype_for(2**32 + 1, source="t")
    writer = TokenFileWriter(tmp_path / "w.bin", dtype="uint32")
    with pytest.raises(ValueError, match=r"span 0..4294967296; uint32 holds 0..4294967295"):
        writer.add_documents([np.array([0, 2**32], dtype=np.int64)])
    writer.discard()
    assert list(tmp_path.iterdir()) == []


def test_the_batch_reader_reads_a_prepared_file(
    tmp_path: Path, bpe: tuple[Path, Tokenizer]
) -> None:
    from piebald.runtime.data import batch_for_step

    tokenizer_path, _ = bpe
    jsonl = _write_jsonl(tmp_path / "r.jsonl", _documents(30))
    code, output = prepare(
        str(tokenizer_path),
        "--input",
        str(jsonl),
        "--out",
        str(tmp_path / "r"),
        "--validation-fraction",
        "0.1",
    )
    assert code == 0, output
    for split in ("train", "val"):
        token_file = open_token_file(tmp_path / f"r.{split}.bin")
        flat = np.concatenate([np.array(d) for d in _documents_of(token_file.path)])
        inputs, labels = batch_for_step(token_file, seed=0, step=3, global_batch_size=4, seq_len=8)
        for row, label in zip(inputs.tolist(), labels.tolist(), strict=True):
            starts = [i for i in range(len(flat) - 8) if flat[i : i + 8].tolist() == row]
            assert starts and any(flat[s + 1 : s + 9].tolist() == label for s in starts)


def _long_document() -> str:
    """Text with every kind of gap a cut may meet: runs of spaces, tabs, newlines, blank
    lines, punctuation before and after spaces, non-ASCII letters."""
    gaps = [" ", "  ", "   ", "\n", "\n\n", " \n ", "\t", ". ", " , ", "  \t  "]
    words = [s for sentence in SENTENCES for s in sentence.split()]
    return "".join(f"{words[i % len(words)]}{gaps[(i * 7) % len(gaps)]}" for i in range(400))


@pytest.mark.parametrize("bos", [False, True])
def test_a_long_document_split_in_pieces_has_the_ids_of_the_whole(
    tmp_path: Path, bpe: tuple[Path, Tokenizer], monkeypatch: pytest.MonkeyPatch, bos: bool
) -> None:
    """A document longer than PIECE_CHARS is encoded piece by piece (bounded memory); on a
    byte-level BPE the ids are exactly those of the whole, special tokens included."""
    from tokenizers import processors

    from piebald.runtime.data.text_tokenizer import load_text_tokenizer

    tokenizer_path, tokenizer = bpe
    if bos:  # a post-processor that puts a token before and after, as Llama's adds BOS
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        eos_id = tokenizer.token_to_id(EOS)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{EOS} $A {EOS}", special_tokens=[(EOS, eos_id)]
        )
        tokenizer_path = tmp_path / "bos.json"
        tokenizer.save(str(tokenizer_path))
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", 64)
    text = _long_document()
    loaded = load_text_tokenizer(tokenizer_path)
    pieces = list(prepare_module._pieces(loaded, text))
    assert len(pieces) > 20 and "".join(pieces) == text
    assert all(len(piece) <= 64 for piece in pieces)
    whole = tokenizer.encode(text).ids
    (ids,) = prepare_module._encode(loaded, [text], append_eos=False)
    assert ids.tolist() == whole
    # The same through the command, a .txt input being one document.
    source = tmp_path / "book.txt"
    source.write_text(text, encoding="utf-8")
    code, output = prepare(
        str(tokenizer_path), "--input", str(source), "--out", str(tmp_path / "b")
    )
    assert code == 0, output
    assert _documents_of(tmp_path / "b.train.bin") == [[*whole, tokenizer.token_to_id(EOS)]]


def test_a_long_document_without_spaces_is_cut_anywhere_and_kept(
    bpe: tuple[Path, Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No space to cut before: pieces of PIECE_CHARS, the ids still decode to the text."""
    from piebald.runtime.data.text_tokenizer import load_text_tokenizer

    tokenizer_path, tokenizer = bpe
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", 50)
    text = "quickbrownfox" * 40
    loaded = load_text_tokenizer(tokenizer_path)
    assert [len(p) for p in prepare_module._pieces(loaded, text)] == [50] * 10 + [20]
    (ids,) = prepare_module._encode(loaded, [text], append_eos=False)
    assert tokenizer.decode(ids.tolist()) == text


@pytest.mark.parametrize("out", ["", ".", "/", "..", "data/.."])
def test_an_out_prefix_without_a_file_name_is_one_line(
    tmp_path: Path, bpe: tuple[Path, Tokenizer], out: str
) -> None:
    """``Path.with_name`` raised 'has an empty name' (a 62-line traceback) for these."""
    source = _write_jsonl(tmp_path / "a.jsonl", SENTENCES[:2])
    code, output = prepare(str(bpe[0]), "--input", str(source), "--out", out)
    lines = output.strip().splitlines()
    assert code == 2 and len(lines) == 1, output
    assert (
        lines[0].startswith("error: --out: got ")
        and "expected a prefix ending in a file" in (lines[0])
    )
