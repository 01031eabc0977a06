"""The shipped corpus: found as a package resource, real English text of a few hundred KB,
with its licence note beside it."""

from __future__ import annotations

from importlib import resources

from piebald.runtime.data import ByteTokenizer, corpus_resource, corpus_text, corpus_tokens


def test_corpus_is_a_package_resource_with_its_licence_beside_it() -> None:
    assert corpus_resource().is_file()
    folder = resources.files("piebald.runtime.data").joinpath("corpus")
    notice = folder.joinpath("NOTICE.txt").read_text(encoding="utf-8")
    licence = folder.joinpath("LICENSE-PSF.txt").read_text(encoding="utf-8")
    assert "PSF License Version 2" in notice and "python_reference.txt" in notice
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in licence


def test_corpus_is_a_few_hundred_kilobytes_of_english() -> None:
    text = corpus_text()
    assert 300_000 < len(text.encode("utf-8")) < 1_000_000
    words = text.split()
    common = {"the", "of", "is", "a", "to", "and", "in"}
    assert sum(word in common for word in words) / len(words) > 0.1  # English function words
    assert sum(c.isascii() and (c.isalpha() or c.isspace()) for c in text) / len(text) > 0.8
    assert ByteTokenizer().decode(corpus_tokens()) == text
