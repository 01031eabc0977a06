"""The text corpus shipped inside the package, so the demo trains on real English with
nothing downloaded: the help topics of the Python 3.11 documentation (about 466 KB, PSF
License; corpus/NOTICE.txt says where it comes from and how it was made)."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

import numpy as np

from piebald.runtime.data.tokenizer import ByteTokenizer

__all__ = ["CORPUS_NAME", "corpus_resource", "corpus_text", "corpus_tokens"]

CORPUS_NAME = "python_reference.txt"


def corpus_resource() -> Traversable:
    """The corpus file as a package resource (a plain file in an installed wheel)."""
    return resources.files("piebald.runtime.data").joinpath("corpus", CORPUS_NAME)


def corpus_text() -> str:
    return corpus_resource().read_text(encoding="utf-8")


def corpus_tokens() -> np.ndarray:
    """The corpus as byte tokens, uint16 [num_bytes]; ``batch_for_step`` takes it as it is."""
    return ByteTokenizer().encode(corpus_text())
