"""Training data (``piebald data prepare``): text corpora into the token files ``piebald
train --data`` reads. Torch-free; the tokenizers library is imported when called."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piebald.runtime.data.prepare import PreparedData

__all__ = ["prepare_data"]


def prepare_data(
    *,
    tokenizer: str | Path,
    inputs: Sequence[str | Path],
    out_prefix: str | Path,
    text_field: str = "text",
    validation_fraction: float | None = None,
    validation_documents: int | None = None,
    append_eos: bool = True,
    eos_token: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> PreparedData:
    """Tokenize ``inputs`` (.txt: one document; .jsonl: one per line, its ``text_field``;
    .parquet: one per row) with ``tokenizer`` (a tokenizer.json or a Hugging Face model
    directory holding one) into ``PREFIX.train.bin`` and, with ``validation_fraction`` or
    ``validation_documents`` (evenly spread), ``PREFIX.val.bin``, each with a .json sidecar
    and a .idx document index. ``append_eos``: end each document with ``eos_token``
    (default: the tokenizer's own); ``progress(documents_done, num_documents)``: called
    after each batch. Existing files are kept unless ``overwrite``.

    >>> prepared = prepare_data(  # doctest: +SKIP
    ...     tokenizer="gpt2/", inputs=["a.txt"], out_prefix="data/a"
    ... )
    >>> prepared.train.num_tokens  # doctest: +SKIP
    """
    from piebald.runtime.data.prepare import prepare_token_files
    from piebald.runtime.data.split import ValidationSplit

    validation = None
    if validation_fraction is not None or validation_documents is not None:
        validation = ValidationSplit(
            fraction=validation_fraction, num_documents=validation_documents
        )
    return prepare_token_files(
        tokenizer=Path(tokenizer),
        inputs=[Path(path) for path in inputs],
        out_prefix=Path(out_prefix),
        text_field=text_field,
        validation=validation,
        append_eos=append_eos,
        eos_token=eos_token,
        overwrite=overwrite,
        progress=progress,
    )
