"""The byte tokenizer: ids are the UTF-8 bytes, text round-trips, non-bytes are refused."""

from __future__ import annotations

import numpy as np
import pytest

from piebald.runtime.data import ByteTokenizer

TEXTS = ["", "plain ASCII.", "Grüße, naïve café — 東京 🚀", "line\nbreaks\tand\x00nul"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokens_are_the_utf8_bytes_and_text_round_trips(text: str) -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert ids.dtype == np.uint16
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids.tolist()) == text


def test_cut_characters_decode_to_the_replacement_character() -> None:
    ids = ByteTokenizer().encode("é")  # two bytes
    assert ByteTokenizer().decode(ids[:1]) == "\ufffd"


def test_ids_that_are_not_bytes_are_refused() -> None:
    assert ByteTokenizer().vocab_size == 256
    with pytest.raises(ValueError, match="token id 256 is not a byte"):
        ByteTokenizer().decode([65, 256])
